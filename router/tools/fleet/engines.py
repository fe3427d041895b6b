"""The fleet's engines: simulated engines (``router.sim``) that can switch mode.

Each engine has its own loopback address (``127.0.1.i``) and all listen on one port, so a
pool's DNS name answers a set of addresses as a headless Service does. Switching mode is what
it is on a GPU: the process stops, a new one starts in the other mode and loads for that mode's
restart time (``--startup-delay``, scaled by the sims' ``--time-scale`` like every duration)
without listening, then serves. Processes are stopped by their PID, never by name; their
output goes to a log file per engine and start.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from router.pools import BASELINE, SPECULATIVE, Pool

STOP_TIMEOUT = 10.0
# The sims answer like SGLang 0.5.23 (/ready, /metrics with request counters).
ENGINE = "sglang"


def address(i: int) -> str:
    """Engine ``i``'s loopback address."""
    return f"127.0.1.{i + 1}"


def free_port(hosts: list[str], tries: int = 50) -> int:
    """A port free on every one of ``hosts`` (picked on the first, checked on the rest)."""
    for _ in range(tries):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port: int = s.getsockname()[1]
        ok = True
        for host in hosts[1:]:
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
    raise RuntimeError("no port free on every engine address")


@dataclass
class Engine:
    """One engine slot: its address, its mode and the process serving it now (if any)."""

    index: int
    port: int
    mode: Pool
    presets: dict[Pool, str]
    time_scale: float
    logs: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    pids: list[int] = field(default_factory=list)

    @property
    def host(self) -> str:
        return address(self.index)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self, mode: Pool, delay: float) -> list[str]:
        """The sim's command line: ``mode``'s preset, loading ``delay`` model seconds first."""
        return [
            sys.executable, "-m", "router.sim",
            "--preset", self.presets[mode],
            "--engine", ENGINE,
            "--host", self.host,
            "--port", str(self.port),
            "--time-scale", f"{self.time_scale:g}",
            "--startup-delay", f"{delay:g}",
            "--startup-mode", "refuse",
            "--log-level", "warning",
        ]  # fmt: skip

    def start(self, mode: Pool, delay: float = 0.0) -> None:
        """Start the engine in ``mode`` (it listens after ``delay`` model seconds)."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"engine {self.index} is running")
        self.mode = mode
        self.starts += 1
        log = self.logs / f"engine{self.index}.{self.starts}.{mode}.log"
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                self.command(mode, delay),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.pids.append(self.proc.pid)

    def stop(self) -> int | None:
        """SIGTERM by PID (SIGKILL if it lingers); its return code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=STOP_TIMEOUT)
        self.proc = None
        return proc.returncode

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def initial_modes(n: int, speculative: int) -> list[Pool]:
    """The first ``speculative`` engines speculative, the rest baseline."""
    if not 0 <= speculative <= n:
        raise ValueError(f"need 0 <= speculative <= {n}")
    return [SPECULATIVE if i < speculative else BASELINE for i in range(n)]
