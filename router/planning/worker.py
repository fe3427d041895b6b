"""``PlanWorker``: the plan's arithmetic in a child process, off the router's event loop and GIL.

The router gathers a round's inputs on its event loop (plain values: ``service.Round``), sends
them to one child process (``python -m router.planning.worker``) that runs ``service.decide``
and sends the outcome back; the goodput model's caches live in the child and stay warm from one
plan to the next. A plan costs seconds of CPU when those caches are cold: in a thread it held
the GIL the proxy needs, in a process the operating system shares the cores.

The protocol is pickles over the child's stdin and stdout, each behind an 8-byte length. The
child is started at the first round and stopped by ``close`` (the lifecycle's exit, on every
path: the planning task's ``finally``). When it dies (killed, out of memory) or a plan overruns
its timeout, the round fails with ``WorkerFailed`` and the next round starts a new child; the
planner marks its plan stale meanwhile. One that died between two rounds is replaced at the
next (no plan lost); either way the restart is counted. The child also ends by itself
when the router goes away without closing it (its stdin's end), ignores SIGINT (a terminal's
Ctrl-C is the router's to handle), and runs at a lower priority (``NICE``).

With ``record`` (``PLAN_RECORD_PATH``) the child appends each round it is given and the outcome
it sent back to that file, in the protocol's own framing (``rounds`` reads them back): a plan
over sockets can then be replayed through ``service.decide`` offline, decision for decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import signal
import struct
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

log = logging.getLogger("spec_router.plan")

HEADER = struct.Struct("!Q")
# The child's niceness: a plan is background work, the proxy and what it serves come first on
# a busy machine (a plan a little late costs little, and the intervals it misses are observed
# all the same: ``service.Round.missed``; a request a little late is a miss). The most there
# is: over sockets (bench/fleet.py, a compressed day, a plan due every 0.375 s wall) the child
# used 134-137 CPU seconds of a 186 s run, more than the router, the four engines and the load
# together (75), on the same two cores; at nice 5 a busy core still gave it a quarter.
NICE = 19
# Seconds a child gets to exit after SIGTERM before it is killed.
STOP_GRACE = 2.0


class WorkerFailed(RuntimeError):
    """The plan worker died, or its plan overran: the round has no outcome."""


class PlanWorker:
    """One child process that runs ``service.decide`` (see the module's docstring)."""

    def __init__(
        self, argv: tuple[str, ...] = ("-m", "router.planning.worker"), record: Path | None = None
    ) -> None:
        self.argv = argv if record is None else (*argv, "--record", str(record))
        self.proc: asyncio.subprocess.Process | None = None
        self.started = 0  # children started
        self.failures = 0  # rounds lost to a child that died or overran
        self.last_failure: str | None = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def restarts(self) -> int:
        """Children started after the first (each after one died or was stopped for overrunning)."""
        return max(0, self.started - 1)

    async def _ensure(self) -> asyncio.subprocess.Process:
        proc = self.proc
        if proc is not None and proc.returncode is None:
            return proc
        if proc is not None:  # (it died between two plans: none was lost)
            log.warning("the plan worker (pid %d) exited (%s): a new one starts", proc.pid,
                        proc.returncode)  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.proc = proc
        self.started += 1
        log.info("plan worker started (pid %d)", proc.pid)
        return proc

    async def run(self, job: Any, timeout: float) -> Any:
        """``decide(job)`` in the child; ``WorkerFailed`` if it dies or takes over ``timeout``
        seconds (it is then stopped; the next call starts another)."""
        proc = await self._ensure()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            async with asyncio.timeout(timeout):
                body = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
                proc.stdin.write(HEADER.pack(len(body)) + body)
                await proc.stdin.drain()
                (size,) = HEADER.unpack(await proc.stdout.readexactly(HEADER.size))
                status, value = pickle.loads(await proc.stdout.readexactly(size))
        except TimeoutError:
            await self._lost(f"a plan took over {timeout:g} s: its worker was stopped")
        except (asyncio.IncompleteReadError, ConnectionError, pickle.UnpicklingError) as exc:
            await self._lost(f"the plan worker died ({_exit(proc, exc)})")
        if status == "error":
            raise RuntimeError(f"the plan failed in its worker:\n{value}")
        return value

    async def _lost(self, why: str) -> None:
        self.failures += 1
        self.last_failure = why
        log.warning("%s; a new one starts at the next plan", why)
        await self.close()
        raise WorkerFailed(why)

    async def close(self) -> None:
        """Stop the child (SIGTERM, then SIGKILL after ``STOP_GRACE``) and reap it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), STOP_GRACE)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        log.info("plan worker stopped (pid %d, exit %s)", proc.pid, proc.returncode)


def _exit(proc: asyncio.subprocess.Process, exc: BaseException) -> str:
    code = proc.returncode
    return f"exit {code}" if code is not None else type(exc).__name__


# -- the child -----------------------------------------------------------------------------------


def serve(inp: BinaryIO, out: BinaryIO, record: BinaryIO | None = None) -> None:
    """The child's loop: read a round, decide, write the outcome; return at end of input. With
    ``record``, each round and its outcome are appended to it (see the module's docstring)."""
    from router.planning.service import decide  # (the child's one import of weight)

    while True:
        head = inp.read(HEADER.size)
        if len(head) < HEADER.size:
            return  # the router closed our stdin, or is gone
        (size,) = HEADER.unpack(head)
        body = inp.read(size)
        if len(body) < size:
            return
        try:
            reply: tuple[str, Any] = ("ok", decide(pickle.loads(body)))
        except Exception:
            reply = ("error", traceback.format_exc())
        data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        if record is not None:
            try:
                record.write(HEADER.pack(len(body)) + body + HEADER.pack(len(data)) + data)
                record.flush()
            except OSError as exc:  # (a full disk loses the record, not the plan)
                print(f"plan worker: the record stops: {exc}", file=sys.stderr)
                record = None
        try:
            out.write(HEADER.pack(len(data)) + data)
            out.flush()
        except (BrokenPipeError, OSError):
            return


def rounds(path: Path) -> Iterator[tuple[Any, tuple[str, Any]]]:
    """A record's rounds and the outcomes sent back for them, in order (a last one cut short,
    as by a child killed mid-write, is left out)."""
    with path.open("rb") as f:
        while True:
            parts = []
            for _ in range(2):
                head = f.read(HEADER.size)
                if len(head) < HEADER.size:
                    return
                (size,) = HEADER.unpack(head)
                body = f.read(size)
                if len(body) < size:
                    return
                parts.append(pickle.loads(body))
            yield parts[0], parts[1]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    record = Path(args[1]) if args[:1] == ["--record"] and len(args) > 1 else None
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        os.nice(NICE)
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # (a stray print must not corrupt the protocol)
    if record is None:
        serve(sys.stdin.buffer, out)
        return
    with record.open("ab") as f:
        serve(sys.stdin.buffer, out, f)


if __name__ == "__main__":
    main()
