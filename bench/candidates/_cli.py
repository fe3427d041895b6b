"""The command line every candidate shares: ``--upstream URL --host H --port P``.

Each ASGI candidate runs under the server settings the router uses (uvicorn with uvloop and
httptools, one worker, lifespan on, access log off; ``serve``); the protocol candidates run
their own ``asyncio.Protocol`` on uvloop (``serve_protocol``). Each announces its URL on stdout
in the router's one-line format, so the benchmark starts and waits for all of them the same way.
Kept self-contained rather than importing ``router.serving`` so the candidates do not change
when the router does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import uvicorn
import uvloop

LISTENING_PREFIX = "spec-router: listening on "


class AnnouncingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, url: str) -> None:
        super().__init__(config)
        self.url = url

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            print(f"{LISTENING_PREFIX}{self.url}", flush=True)


def _listen(doc: str | None) -> tuple[argparse.Namespace, socket.socket, str]:
    """The parsed command line, a listening socket on ``--host``/``--port``, and its URL."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument(
        "--upstream", default=os.environ.get("BENCH_UPSTREAM", "http://127.0.0.1:30001")
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(4096)
    host, port = sock.getsockname()[:2]
    return args, sock, f"http://{host}:{port}"


def serve(create_app: Callable[[str], Any], doc: str | None) -> int:
    args, sock, url = _listen(doc)
    config = uvicorn.Config(
        create_app(args.upstream.rstrip("/")),
        loop="uvloop",
        http="httptools",
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=75,
        backlog=4096,
    )
    server = AnnouncingServer(config, url)
    # Server.run picks the loop (uvloop) the way this uvicorn version expects.
    server.run(sockets=[sock])
    return 0 if server.started else 3


def serve_protocol(
    protocol_for: Callable[[str, int], Callable[[], asyncio.Protocol]], doc: str | None
) -> None:
    """Serve ``protocol_for(upstream host, upstream port)``'s protocols on uvloop until killed."""
    args, sock, url = _listen(doc)
    parts = urlsplit(args.upstream)
    factory = protocol_for(parts.hostname or "127.0.0.1", parts.port or 80)

    async def run() -> None:
        server = await asyncio.get_running_loop().create_server(factory, sock=sock)
        print(f"{LISTENING_PREFIX}{url}", flush=True)
        async with server:
            await server.serve_forever()

    uvloop.run(run())
