"""An upstream that answers every POST with one large SSE stream, as fast as the socket takes it.

For tests of back-pressure: the simulated engines pace their tokens, this one does not, so a
client that stops reading fills every buffer between it and the upstream within milliseconds.
It runs on a thread of its own (its own event loop), so a test may block while it serves. GETs
(health probes) get ``{}``.

With ``events`` the stream is that many events, known in advance. Without, it goes on until the
test calls ``finish()``: how much the kernel buffers between two sockets differs from machine to
machine (``net.ipv4.tcp_wmem``), so a test that must fill those buffers cannot size its stream in
advance. Either way ``body`` is, once the stream has ended, byte for byte what the upstream sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
DONE = b"data: [DONE]\n\n"
CAP = 64 << 20  # an open-ended stream ends here even if nobody calls finish()


def sse_event(n: int, size: int) -> bytes:
    """The ``n``th SSE event of about ``size`` bytes; every one is different."""
    pad = b"x" * max(0, size - 80)
    return b'data: {"object":"chat.completion.chunk","n":%d,"pad":"%s"}\n\n' % (n, pad)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """Read one request (head and ``Content-Length`` body) off ``reader``; returns the head."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return head


class BulkUpstream:
    def __init__(self, size: int, events: int | None = None) -> None:
        self.size = size
        self.events = events
        self.body = b""
        self.url = ""
        self.other_url = ""  # (for a test's own use)
        self.posts = 0
        self._finish = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def finish(self) -> None:
        """End an open-ended stream: [DONE] follows the next event the socket takes."""
        self._finish.set()

    @contextlib.contextmanager
    def running(self) -> Iterator[BulkUpstream]:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the bulk upstream did not start")
        try:
            yield self
        finally:
            self._finish.set()
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

    def _done(self, n: int, sent: int) -> bool:
        if self.events is not None:
            return n >= self.events
        return self._finish.is_set() or sent >= CAP

    async def _stream(self, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD)
        sent: list[bytes] = []
        total = n = 0
        while not self._done(n, total):
            event = sse_event(n, self.size)
            writer.write(chunk(event))
            sent.append(event)
            total += len(event)
            n += 1
            if n % 64 == 0:
                await writer.drain()  # blocks while the router has stopped reading
        sent.append(DONE)
        self.body = b"".join(sent)  # before the end goes out: a test reads it once it is there
        writer.write(chunk(DONE) + b"0\r\n\r\n")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await read_request(reader)
                if head.startswith(b"POST"):
                    self.posts += 1
                    await self._stream(writer)
                else:
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b"content-length: 2\r\n\r\n{}"
                    )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went, or the upstream is stopping
        finally:
            writer.close()
