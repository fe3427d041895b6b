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
import threading

from tests.support.threaded import ThreadedUpstream

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
DONE = b"data: [DONE]\n\n"
CAP = 64 << 20  # an open-ended stream ends here even if nobody calls finish()


def sse_event(n: int, size: int) -> bytes:
    """The ``n``th SSE event of about ``size`` bytes; every one is different."""
    pad = b"x" * max(0, size - 80)
    return b'data: {"object":"chat.completion.chunk","n":%d,"pad":"%s"}\n\n' % (n, pad)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class BulkUpstream(ThreadedUpstream):
    def __init__(self, size: int, events: int | None = None) -> None:
        super().__init__()
        self.size = size
        self.events = events
        self.body = b""
        self.other_url = ""  # (for a test's own use)
        self.posts = 0
        self._finish = threading.Event()

    def finish(self) -> None:
        """End an open-ended stream: [DONE] follows the next event the socket takes."""
        self._finish.set()

    def stopping(self) -> None:
        self._finish.set()

    def _done(self, n: int, sent: int) -> bool:
        if self.events is not None:
            return n >= self.events
        return self._finish.is_set() or sent >= CAP

    async def post(self, head: bytes, writer: asyncio.StreamWriter) -> bool:
        self.posts += 1
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
        return True
