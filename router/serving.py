"""Serving an ASGI app under uvicorn on a socket bound here, and announcing its URL.

``run`` serves any ASGI app (the router's ``spec-router serve``, the sims, the tests' own
servers) on a socket bound first: binding first lets ``--port 0`` pick a free port and lets us
announce the real address on stdout in one fixed line (``LISTENING_PREFIX`` + URL) that tests
and the demo wait for, instead of sleeping or polling a port they do not know yet. It imports
nothing of the router's app or settings, so a sim starts without loading them.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any

import uvicorn

from router.fastpath.protocol import http_protocol
from router.keepalive import CLIENT_KEEP_ALIVE

LISTENING_PREFIX = "spec-router: listening on "


def bind_socket(host: str, port: int, backlog: int = 4096) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def socket_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def uvicorn_config(
    app: Any,
    *,
    log_level: str = "warning",
    access_log: bool = False,
    graceful_shutdown: float | None = 30.0,
    http: str = "httptools",
    keep_alive: float = CLIENT_KEEP_ALIVE,
    request_timeout: float | None = None,
) -> uvicorn.Config:
    """``request_timeout``: under httptools, a deadline for each request's headers
    (``router.fastpath.protocol``); None leaves uvicorn's protocol as it is (the sims)."""
    protocol: str | type[asyncio.Protocol] = http
    if http == "httptools" and request_timeout is not None:
        protocol = http_protocol(request_timeout)
    # uvloop + httptools: the fast server stack; lifespan "on" so start-up errors stop the process.
    return uvicorn.Config(
        app,
        loop="uvloop",
        http=protocol,
        lifespan="on",
        log_level=log_level,
        access_log=access_log,
        # (uvicorn hints int; it only ever hands the value to call_later)
        timeout_keep_alive=keep_alive,  # type: ignore[arg-type]
        backlog=4096,
        # Upstream responses carry their own Date/Server headers; do not add a second pair.
        server_header=False,
        date_header=False,
        # The router appends X-Forwarded-For itself; uvicorn's rewrite of the client address
        # from it is a per-request middleware the proxy does not need.
        proxy_headers=False,
        # On SIGTERM, give streams this long to finish, then cancel them (their leases are
        # released by the proxy's own finally).
        # (uvicorn hints int, but it only ever hands the value to asyncio as a timeout)
        timeout_graceful_shutdown=graceful_shutdown,  # type: ignore[arg-type]
    )


class ClosingServer(uvicorn.Server):
    """A uvicorn server that tells the app it is stopping (``app.closing()``, when it has one)
    before it waits for open responses: those that never end on their own (the live page's
    feed) end first, since uvicorn runs the lifespan's shutdown only after every response."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        closing = getattr(self.config.app, "closing", None)
        if callable(closing):
            closing()
        await super().shutdown(sockets=sockets)


class AnnouncingServer(ClosingServer):
    """A uvicorn server that prints its URL once it is accepting connections."""

    def __init__(self, config: uvicorn.Config, url: str) -> None:
        super().__init__(config)
        self.url = url

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            print(f"{LISTENING_PREFIX}{self.url}", flush=True)


def run(
    app: Any,
    host: str,
    port: int,
    *,
    log_level: str = "warning",
    http: str = "httptools",
    graceful_shutdown: float | None = 30.0,
    request_timeout: float | None = None,
    keep_alive: float = CLIENT_KEEP_ALIVE,
) -> int:
    """Serve ``app`` until SIGINT/SIGTERM; returns a process exit code."""
    try:
        sock = bind_socket(host, port)
    except OSError as exc:
        print(f"spec-router: cannot listen on {host}:{port}: {exc.strerror}", file=sys.stderr)
        return 1
    config = uvicorn_config(
        app,
        log_level=log_level,
        http=http,
        graceful_shutdown=graceful_shutdown,
        request_timeout=request_timeout,
        keep_alive=keep_alive,
    )
    server = AnnouncingServer(config, socket_url(sock))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    # uvicorn sets should_exit on signals; a failed lifespan start-up leaves started False.
    return 0 if server.started else 3
