"""Run the project's servers (sims, routers) as subprocesses: for the demo, benches and tests.

Each process is asked for ``--port 0`` and announces its URL on stdout (see
``router.serve.LISTENING_PREFIX``); we wait for that line rather than sleeping. Processes are
stopped by their PID (SIGTERM, then SIGKILL), never by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from router.serve import LISTENING_PREFIX

START_TIMEOUT = 30.0


@dataclass
class Proc:
    popen: subprocess.Popen[str]
    url: str
    output: list[str] = field(default_factory=list)
    pump: threading.Thread | None = None

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


def spawn(
    args: Sequence[str], env: dict[str, str] | None = None, prefix: Sequence[str] = ()
) -> Proc:
    """Run ``python <args>`` (after ``prefix``, e.g. ``taskset -c 0``); wait for its URL."""
    cmd = [*prefix, sys.executable, *args]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    popen = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=full_env,
    )
    assert popen.stdout is not None
    output: list[str] = []
    found: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert popen.stdout is not None
        for line in popen.stdout:
            output.append(line.rstrip("\n"))
            if not found and line.startswith(LISTENING_PREFIX):
                found.append(line[len(LISTENING_PREFIX) :].strip())
                ready.set()
        ready.set()  # EOF: the process ended

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT
    ready.wait(timeout=max(0.0, deadline - time.monotonic()))
    if not found:
        proc = Proc(popen, "", output, thread)
        proc.stop()
        raise RuntimeError(f"{' '.join(args)} did not start:\n" + "\n".join(output[-40:]))
    return Proc(popen, found[0], output, thread)


@contextmanager
def running(
    args: Sequence[str], env: dict[str, str] | None = None, prefix: Sequence[str] = ()
) -> Iterator[Proc]:
    proc = spawn(args, env, prefix)
    try:
        yield proc
    finally:
        proc.stop()
