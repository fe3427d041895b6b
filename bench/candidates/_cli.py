"""The command line every candidate shares: ``--upstream URL --host H --port P``.

Each candidate runs under the server settings the router uses (uvicorn with uvloop and
httptools, one worker, lifespan on, access log off) and announces its URL on stdout in the
router's one-line format, so the benchmark starts and waits for all of them the same way.
Kept self-contained rather than importing ``router.serve`` so the candidates do not change
when the router does.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable
from typing import Any

import uvicorn

LISTENING_PREFIX = "spec-router: listening on "


class AnnouncingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, url: str) -> None:
        super().__init__(config)
        self.url = url

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            print(f"{LISTENING_PREFIX}{self.url}", flush=True)


def serve(create_app: Callable[[str], Any], doc: str | None) -> int:
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
    server = AnnouncingServer(config, f"http://{host}:{port}")
    # Server.run picks the loop (uvloop) the way this uvicorn version expects.
    server.run(sockets=[sock])
    return 0 if server.started else 3
