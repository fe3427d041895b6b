"""The plan's worker process in a real router: restarted when it dies (the plan marked stale
meanwhile), stopped by the router's shutdown, gone by itself when the router is killed."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.decide import table as tables
from tests.conftest import TIME_SCALE, RouterFactory
from tests.planning.test_worker import gone
from tests.support.http import wait_for
from tests.support.processes import Proc
from tests.support.tables import model_table


def plan_of(url: str) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(f"{url}/router/plan", timeout=5).json()
    return doc


def worker_pid(url: str) -> int | None:
    w = plan_of(url).get("worker")
    return None if w is None else w["pid"]


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture
def planning_router(start_router: RouterFactory, tmp_path: Path) -> Proc:
    table = tmp_path / "table.json"
    scale = float(TIME_SCALE)
    tables.save(model_table(256, 32, time_scale=scale), table)
    return start_router(table_path=str(table), planner="advisory", plan_time_scale="0.005",
                        slo_ttft_ms=str(1000 * scale), slo_tpot_ms=str(25 * scale))  # fmt: skip


def test_the_router_replaces_a_dead_worker_and_stops_it_on_exit(planning_router: Proc) -> None:
    url = planning_router.url
    first = wait_for(lambda: worker_pid(url) or 0, timeout=60)
    assert parent_of(first) == planning_router.pid
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: worker_pid(url) not in (None, first), timeout=60)
    second = worker_pid(url)
    assert second is not None and parent_of(second) == planning_router.pid
    doc = plan_of(url)
    assert doc["worker"]["restarts"] == 1 and not doc["stale"]
    metrics = httpx.get(f"{url}/metrics", timeout=5).text
    assert "spec_router_plan_worker_restarts_total 1.0" in metrics
    # the lifespan's end stops it (uvicorn re-raises the SIGTERM once it has shut down)
    assert planning_router.stop() in (0, -signal.SIGTERM)
    assert gone(second), Path(f"/proc/{second}/stat").read_text()


def test_a_router_killed_outright_leaves_no_worker_behind(planning_router: Proc) -> None:
    pid = wait_for(lambda: worker_pid(planning_router.url) or 0, timeout=60)
    planning_router.kill()
    # its stdin ends with the router: it exits by itself
    wait_for(lambda: gone(pid), timeout=60)
