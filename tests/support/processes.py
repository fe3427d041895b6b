"""Test helpers around ``router.tools.processes``: sims on free ports, ports nothing listens on."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

from router.tools.processes import Proc, running, spawn, stop_all

__all__ = [
    "Background",
    "HeldPort",
    "Proc",
    "free_port",
    "refused_port",
    "running",
    "sim_args",
    "sim_on",
    "spawn",
    "stop_all",
]


def sim_args(preset: str, *extra: str) -> list[str]:
    return ["-m", "router.sim", "--preset", preset, "--port", "0", *extra]


def sim_on(preset: str, port: int, *extra: str) -> list[str]:
    return ["-m", "router.sim", "--preset", preset, "--port", str(port), *extra]


def free_port() -> int:
    """A port nothing listens on right now (for servers that must come up later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A port on 127.0.0.1 bound here and never listened on: connecting is refused for as long
    as this holds, and no other process can take it meanwhile (``free_port``'s port is only
    free when asked: under load another test's server may take it)."""
    with HeldPort() as held:
        yield held.port


class HeldPort:
    """``refused_port`` for a server that comes up on the port later: bound here (connections
    refused, no other process takes it) until ``release()``, called just before the server
    starts on it, or the end of the ``with``."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])

    def release(self) -> None:
        self._sock.close()

    def __enter__(self) -> HeldPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Background:
    """``spawn`` on a thread: for a server that does not announce itself for a while (it is
    loading, or warming up), so the test can watch it meanwhile."""

    def __init__(self, args: list[str]) -> None:
        self.began = time.monotonic()
        self._box: list[Proc] = []
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(args,), daemon=True)
        self._thread.start()

    def _run(self, args: list[str]) -> None:
        try:
            self._box.append(spawn(args))
        except BaseException as exc:  # reported by proc()
            self._errors.append(exc)

    def proc(self, timeout: float = 30.0) -> Proc:
        """The process, once it has announced itself."""
        self._thread.join(timeout=timeout)
        if self._errors:
            raise self._errors[0]
        assert self._box, "the process did not announce itself in time"
        return self._box[0]

    def stop(self) -> None:
        self._thread.join(timeout=30)
        for proc in self._box:
            proc.stop()
