"""The part the test upstreams share: an asyncio server on a thread of its own (its own event
loop), so a test may block while it serves; GETs (health probes) get ``{}`` and each POST goes
to the subclass's ``post``."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Self

EMPTY_JSON = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """Read one request (head, and a ``Content-Length`` or chunked body) off ``reader``;
    returns the head. (Envoy sends request bodies chunked when ext_proc streams them.)"""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    chunked = False
    for line in head.split(b"\r\n"):
        lower = line.lower()
        if lower.startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
        elif lower.startswith(b"transfer-encoding:") and b"chunked" in lower:
            chunked = True
    if not chunked:
        await reader.readexactly(length)
        return head
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
        if size == 0:
            await _trailers(reader)
            return head
        await reader.readexactly(size + 2)


async def _trailers(reader: asyncio.StreamReader) -> None:
    while (await reader.readuntil(b"\r\n")) != b"\r\n":
        pass


class ThreadedUpstream:
    def __init__(self) -> None:
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def post(self, head: bytes, writer: asyncio.StreamWriter) -> bool:
        """Answer one POST; False ends the connection."""
        raise NotImplementedError

    def stopping(self) -> None:
        """Called (from the test's thread) before the server stops."""

    @contextlib.contextmanager
    def running(self) -> Iterator[Self]:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"the {type(self).__name__} did not start")
        try:
            yield self
        finally:
            self.stopping()
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
                if head.startswith(b"POST"):
                    if not await self.post(head, writer):
                        return
                else:
                    writer.write(EMPTY_JSON)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went, or the upstream is stopping
        finally:
            writer.close()
