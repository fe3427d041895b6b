"""The plan's worker process: the same outcome as the plan in this process, a new child after
one dies or overruns, none left running after ``close``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from router.plan import EngineState, PlanState
from router.planning.service import Round, decide
from router.planning.traffic import Estimate, Traffic
from router.planning.worker import PlanWorker, WorkerFailed
from router.pools import BASELINE, SPECULATIVE
from tests.plan.fixtures import MIX, SEED
from tests.plan.test_planner import SPIKY


def a_round(now: float = 600.0, arrivals: int = 90) -> Round:
    fleet = [EngineState("e0", SPECULATIVE), EngineState("e1", BASELINE)]
    est = Estimate(arrivals, 60.0, arrivals / 60.0, 0.0, 2 * arrivals / 60.0, None, None, 0)
    return Round(now, 60.0, Traffic(60.0, arrivals, "engines", None, None), fleet, MIX, SEED,
                 PlanState(), SPIKY, est)  # fmt: skip


def gone(pid: int) -> bool:
    """No such process, or one that has exited (a zombie awaiting its reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_the_worker_plans_what_this_process_plans_and_is_stopped_on_close() -> None:
    async def go() -> tuple[Any, int, int]:
        worker = PlanWorker()
        try:
            got = await worker.run(a_round(), timeout=120)
            pid = worker.pid
            assert pid is not None and not gone(pid)
            again = await worker.run(a_round(660.0, 95), timeout=120)  # the same child
            assert worker.pid == pid and worker.started == 1
            assert again[0] == "planning"
        finally:
            await worker.close()
        return got, pid, worker.started

    got, pid, started = asyncio.run(go())
    assert gone(pid) and started == 1
    assert got == decide(a_round())


def test_a_worker_that_dies_in_a_round_fails_it_and_a_new_one_plans_the_next() -> None:
    # a child that reads the round and dies
    dying = ("-c", "import os, signal, sys; sys.stdin.buffer.read(8); "
             "os.kill(os.getpid(), signal.SIGKILL)")  # fmt: skip

    async def go() -> None:
        worker = PlanWorker(dying)
        with pytest.raises(WorkerFailed, match="died"):
            await worker.run(a_round(), timeout=120)
        assert worker.failures == 1 and worker.pid is None
        worker.argv = PlanWorker().argv
        try:
            out = await worker.run(a_round(660.0), timeout=120)
            assert out[0] == "planning" and worker.restarts == 1
        finally:
            await worker.close()

    asyncio.run(go())


def test_a_worker_that_died_between_rounds_is_replaced_and_no_round_is_lost() -> None:
    async def go() -> None:
        worker = PlanWorker()
        try:
            await worker.run(a_round(), timeout=120)
            proc = worker.proc
            assert proc is not None
            proc.kill()
            await proc.wait()
            out = await worker.run(a_round(660.0), timeout=120)
            assert out[0] == "planning" and worker.pid not in (None, proc.pid)
            assert worker.restarts == 1 and worker.failures == 0
        finally:
            await worker.close()

    asyncio.run(go())


def test_a_plan_that_overruns_its_timeout_stops_its_worker() -> None:
    # a child that reads the round and never answers
    silent = ("-c", "import sys, time; sys.stdin.buffer.read(8); time.sleep(600)")

    async def go() -> None:
        worker = PlanWorker(silent)
        with pytest.raises(WorkerFailed, match="took over"):
            await worker.run(a_round(), timeout=0.5)
        assert worker.pid is None and worker.failures == 1

    asyncio.run(go())
