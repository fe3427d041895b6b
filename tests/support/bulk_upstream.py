"""An upstream that answers every POST with one large SSE stream, as fast as the socket takes it.

For tests of back-pressure: the simulated engines pace their tokens, this one does not, so a
client that stops reading fills every buffer between it and the upstream within milliseconds.
It runs on a thread of its own (its own event loop), so a test may block while it serves. GETs
(health probes) get ``{}``. The body is known in advance (``body``), so a test can check that what
reached its client is byte for byte what the upstream sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def sse_body(events: int, size: int) -> list[bytes]:
    """``events`` SSE events of about ``size`` bytes each, every one different, then [DONE]."""
    pad = "x" * max(0, size - 80)
    out = [
        b'data: {"object":"chat.completion.chunk","n":%d,"pad":"%s"}\n\n' % (i, pad.encode())
        for i in range(events)
    ]
    out.append(b"data: [DONE]\n\n")
    return out


class BulkUpstream:
    def __init__(self, events: int, size: int) -> None:
        self.events = sse_body(events, size)
        self.body = b"".join(self.events)
        self.url = ""
        self.other_url = ""  # (for a test's own use)
        self.posts = 0
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event
        self._writers: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @contextlib.contextmanager
    def running(self) -> Iterator[BulkUpstream]:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the bulk upstream did not start")
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
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()
            await asyncio.gather(
                *asyncio.all_tasks() - {asyncio.current_task()}, return_exceptions=True
            )

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stream = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in self.events) + b"0\r\n\r\n"
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                if head.startswith(b"POST"):
                    self.posts += 1
                    writer.write(HEAD + stream)
                else:
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b"content-length: 2\r\n\r\n{}"
                    )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
