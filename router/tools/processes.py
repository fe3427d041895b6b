"""Run the project's servers (sims, routers) as subprocesses: for the demo, benches and tests.

Each process is asked for ``--port 0`` and announces its URL on stdout (see
``router.serving.LISTENING_PREFIX``); we wait for that line rather than sleeping. Processes are
stopped by their PID (SIGTERM, then SIGKILL), never by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from router.serving import LISTENING_PREFIX

START_TIMEOUT = 30.0
MAX_OUTPUT_LINES = 5000  # kept for error messages and tests; the rest is read and dropped


@dataclass
class Proc:
    popen: subprocess.Popen[str]
    url: str
    output: list[str] = field(default_factory=list)
    pump: threading.Thread | None = None
    terminated: bool = False  # SIGTERM sent by ``terminate``

    def terminate(self) -> None:
        """SIGTERM, without waiting (``stop`` waits): lets several processes stop side by side."""
        if self.popen.poll() is None and not self.terminated:
            os.kill(self.popen.pid, signal.SIGTERM)
            self.terminated = True

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kill(self) -> None:
        """SIGKILL: an abrupt crash, as when an engine dies."""
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=10)
        self._close_output()

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.popen.poll() is None:
            if not self.terminated:
                os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=timeout)
        self._close_output()
        return self.popen.returncode

    def _close_output(self) -> None:
        if self.pump is not None:
            self.pump.join(timeout=5)
        if self.popen.stdout is not None and (self.pump is None or not self.pump.is_alive()):
            self.popen.stdout.close()


def stop_all(procs: Iterable[Proc]) -> None:
    """``stop`` each, their shutdowns side by side (SIGTERM to all, then wait for each)."""
    procs = list(procs)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.stop()


def pinned(core: int | None) -> list[str]:
    """A ``taskset`` prefix pinning a process to ``core`` (none on a one-core machine)."""
    if core is None or (os.cpu_count() or 1) < 2:
        return []
    return ["taskset", "-c", str(core)]


def spawn_command(
    cmd: Sequence[str], env: dict[str, str] | None = None, cwd: str | None = None
) -> Proc:
    """Run ``cmd`` and wait for the URL it announces (``LISTENING_PREFIX``)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    popen = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=full_env,
        cwd=cwd,
    )
    assert popen.stdout is not None
    output: list[str] = []
    found: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert popen.stdout is not None
        for line in popen.stdout:
            if len(output) < MAX_OUTPUT_LINES:
                output.append(line.rstrip("\n"))
            if not found and line.startswith(LISTENING_PREFIX):
                found.append(line[len(LISTENING_PREFIX) :].strip())
                ready.set()
        ready.set()  # EOF: the process ended

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    ready.wait(timeout=START_TIMEOUT)
    if not found:
        proc = Proc(popen, "", output, thread)
        proc.stop()
        raise RuntimeError(f"{' '.join(cmd)} did not start:\n" + "\n".join(output[-40:]))
    return Proc(popen, found[0], output, thread)


def spawn(
    args: Sequence[str], env: dict[str, str] | None = None, prefix: Sequence[str] = ()
) -> Proc:
    """Run ``python <args>`` (after ``prefix``, e.g. ``pinned(0)``); wait for its URL."""
    return spawn_command([*prefix, sys.executable, *args], env)


@contextmanager
def running(
    args: Sequence[str], env: dict[str, str] | None = None, prefix: Sequence[str] = ()
) -> Iterator[Proc]:
    proc = spawn(args, env, prefix)
    try:
        yield proc
    finally:
        proc.stop()
