"""One worker of ``spec-router serve --workers N`` (``router.process.supervisor`` forks it).

A whole router (``RouterApp`` with its ``WorkerContext``, ``router.workers``) under its own
uvicorn, on the listening socket it inherited. It tells the supervisor when it is serving (one
line on a pipe) instead of announcing the URL itself, so the URL is announced once, when all
are up.
"""

from __future__ import annotations

import os
import socket
import sys

import uvicorn

from router.serving import ClosingServer, uvicorn_config
from router.settings import Settings, SettingsError
from router.workers import WorkerContext


class ReadyServer(ClosingServer):
    """A uvicorn server that tells the supervisor (on ``fd``) once it is accepting."""

    def __init__(self, config: uvicorn.Config, fd: int, slot: int) -> None:
        super().__init__(config)
        self.fd = fd
        self.slot = slot

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            os.write(self.fd, f"{self.slot}\n".encode())


def run_worker(
    settings: Settings,
    sock: socket.socket,
    ctx: WorkerContext,
    ready_fd: int,
    log_level: str,
    http: str,
) -> int:
    """Serve until SIGTERM; an exit code (2: bad settings, 3: start-up failed)."""
    # Before any metric exists: this process's counters go to its own file in the run's
    # directory (PROMETHEUS_MULTIPROC_DIR), whatever was imported before the fork.
    from prometheus_client import values

    values.ValueClass = values.MultiProcessValue()
    from router.app import RouterApp

    try:
        app = RouterApp(settings, worker=ctx)
    except SettingsError as exc:
        print(f"spec-router: {exc}", file=sys.stderr)
        return 2
    config = uvicorn_config(
        app,
        log_level=log_level,
        http=http,
        request_timeout=settings.request_timeout,
        keep_alive=settings.client_keep_alive,
    )
    server = ReadyServer(config, ready_fd, ctx.slot)
    server.run(sockets=[sock])
    return 0 if server.started else 3
