"""Candidate: the floor of any Python proxy -- a TCP pipe on uvloop, no HTTP at all.

Each client connection gets its own upstream connection, and every read on either side is
written to the other from the socket callback (``data_received`` -> ``transport.write``), with
back-pressure both ways. No parsing, no framing, no decision, no metrics: whatever a Python
reverse proxy does per chunk, it does at least this, so this candidate's CPU per stream is the
least the interpreter and the event loop can cost, and its streaming tail the best a proxy
written in Python could hope for on the same core.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
from typing import Any
from urllib.parse import urlsplit

import uvloop
from _cli import LISTENING_PREFIX


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


async def main(upstream: str, host: str, port: int) -> None:
    parts = urlsplit(upstream)
    up_host, up_port = parts.hostname or "127.0.0.1", parts.port or 80
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(4096)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(up_host, up_port), sock=sock)
    bound_host, bound_port = sock.getsockname()[:2]
    print(f"{LISTENING_PREFIX}http://{bound_host}:{bound_port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--upstream", default=os.environ.get("BENCH_UPSTREAM", "http://127.0.0.1:30001")
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    uvloop.run(main(args.upstream, args.host, args.port))
