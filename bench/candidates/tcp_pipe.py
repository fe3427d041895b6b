"""Candidate: the floor of any Python proxy -- a TCP pipe on uvloop, no HTTP at all.

Each client connection gets its own upstream connection, and every read on either side is
written to the other from the socket callback (``data_received`` -> ``transport.write``), with
back-pressure both ways. No parsing, no framing, no decision, no metrics: whatever a Python
reverse proxy does per chunk, it does at least this, so this candidate's CPU per stream is the
least the interpreter and the event loop can cost, and its streaming tail the best a proxy
written in Python could hope for on the same core.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from _cli import serve_protocol


class _Side(asyncio.Protocol):
    """One end of the pipe; ``peer`` is the other end's transport once it exists."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.peer: Any = None
        self.early: list[bytes] = []  # client bytes that came before the upstream connected

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self.early.append(data)
        else:
            self.peer.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()

    def pause_writing(self) -> None:  # our outgoing buffer is full: stop reading the other side
        if self.peer is not None:
            self.peer.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None:
            self.peer.resume_reading()


class _Client(_Side):
    def __init__(self, host: str, port: int) -> None:
        super().__init__()
        self.upstream = (host, port)

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            up_transport, up = await loop.create_connection(_Side, *self.upstream)
        except OSError:
            self.transport.close()
            return
        up.peer = self.transport
        self.peer = up_transport
        if self.transport.is_closing():
            up_transport.close()
            return
        if self.early:
            up_transport.write(b"".join(self.early))
            self.early.clear()


def clients_of(host: str, port: int) -> Callable[[], _Client]:
    return lambda: _Client(host, port)


if __name__ == "__main__":
    serve_protocol(clients_of, __doc__)
