"""Test helpers around ``router.tools.processes``: sims on free ports, ports nothing listens on."""

from __future__ import annotations

import socket

from router.tools.processes import Proc, running, spawn

__all__ = ["Proc", "free_port", "running", "sim_args", "sim_on", "spawn"]


def sim_args(preset: str, *extra: str) -> list[str]:
    return ["-m", "router.sim", "--preset", preset, "--port", "0", *extra]


def sim_on(preset: str, port: int, *extra: str) -> list[str]:
    return ["-m", "router.sim", "--preset", preset, "--port", str(port), *extra]


def free_port() -> int:
    """A port nothing listens on right now (for servers that must come up later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
