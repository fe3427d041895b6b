"""An upstream that answers every POST with bytes a test scripts, and records what it received.

For the faults a sim does not make: a response cut short inside a Content-Length body, bytes
that are not HTTP, and for checking the request headers the router forwards. It runs on a thread
of its own (its own event loop), like ``bulk_upstream``; GETs (health probes) get ``{}``.

``answer`` is the bytes written back to each POST; then the connection is reset (``reset``,
an RST) or closed, or, if neither, kept for the next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

from tests.support.bulk_upstream import read_request

OK_JSON = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
    b"connection: x-upstream-secret\r\nx-upstream-secret: 1\r\n\r\n{}"
)


class ScriptedUpstream:
    def __init__(self, answer: bytes = OK_JSON, *, reset: bool = False, close: bool = False):
        self.answer = answer
        self.reset = reset
        self.close = close
        self.heads: list[bytes] = []  # the head of each POST received
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def headers(self, n: int = -1) -> list[tuple[bytes, bytes]]:
        """The headers of the ``n``th POST, names lower-cased, in order."""
        lines = self.heads[n].split(b"\r\n")[1:]
        pairs = [line.split(b":", 1) for line in lines if line]
        return [(name.strip().lower(), value.strip()) for name, value in pairs]

    @contextlib.contextmanager
    def running(self) -> Iterator[ScriptedUpstream]:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the scripted upstream did not start")
        try:
            yield self
        finally:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)

    def _run(self) -> None:
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            others = asyncio.all_tasks() - {asyncio.current_task()}
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await read_request(reader)
                if not head.startswith(b"POST"):
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b"content-length: 2\r\n\r\n{}"
                    )
                    await writer.drain()
                    continue
                self.heads.append(head)
                writer.write(self.answer)
                await writer.drain()
                if self.reset:
                    # Let the router read the answer first: an RST discards what it has not.
                    await asyncio.sleep(0.2)
                    sock = writer.get_extra_info("socket")
                    # SO_LINGER 0: close() sends an RST, as a crashing engine's kernel does
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return
                if self.close:
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
