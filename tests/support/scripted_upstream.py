"""An upstream that answers every POST with bytes a test scripts, and records what it received.

For the faults a sim does not make: a response cut short inside a Content-Length body, bytes
that are not HTTP, and for checking the request headers the router forwards. It runs on a thread
of its own (its own event loop), like ``bulk_upstream``; GETs (health probes) get ``{}``.

``answer`` is the bytes written back to each POST; then the connection is reset (``reset``,
an RST) or closed, or, if neither, kept for the next request.
"""

from __future__ import annotations

import asyncio
import socket
import struct

from tests.support.threaded import ThreadedUpstream

OK_JSON = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
    b"connection: x-upstream-secret\r\nx-upstream-secret: 1\r\n\r\n{}"
)


class ScriptedUpstream(ThreadedUpstream):
    def __init__(self, answer: bytes = OK_JSON, *, reset: bool = False, close: bool = False):
        super().__init__()
        self.answer = answer
        self.reset = reset
        self.close = close
        self.heads: list[bytes] = []  # the head of each POST received

    def headers(self, n: int = -1) -> list[tuple[bytes, bytes]]:
        """The headers of the ``n``th POST, names lower-cased, in order."""
        lines = self.heads[n].split(b"\r\n")[1:]
        pairs = [line.split(b":", 1) for line in lines if line]
        return [(name.strip().lower(), value.strip()) for name, value in pairs]

    async def post(self, head: bytes, writer: asyncio.StreamWriter) -> bool:
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
            return False
        return not self.close
