"""The learner's work paced to ``LEARN_SHARE`` of the core (``router.lifecycle.keep_learning``,
``in_slices``), through a real router on a socket in front of the sims: under a steady stream
of requests from a real client each stretch of it is followed by its rest, every surface the
timer computed is still installed, and in full (what computing it at once gives), and every
request is served meanwhile; idle, it never rests (full speed, as before the pacing).
Counters, not timings."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import uvicorn

from router import lifecycle
from router.app import RouterApp
from router.decide import table as tables
from router.decide.capacity import Surface
from router.forward.decider import Decider, SurfaceJob
from router.settings import Settings
from router.sim.model import EAGLE3
from tests.conftest import TIME_SCALE
from tests.support.http import await_for
from tests.support.processes import Proc
from tests.support.tables import model_table

pytestmark = pytest.mark.anyio

SLO_TTFT, SLO_TPOT = 0.1, 0.0025  # wall seconds: 1 s and 25 ms of model time at scale 0.1
CLIENTS = 8  # streams kept in flight by the client


def body() -> dict[str, Any]:
    return {
        "model": "sim",
        "messages": [{"role": "user", "content": "abc " * 100}],
        "max_tokens": 16,
        "stream": True,
    }


@asynccontextmanager
async def on_a_socket(app: RouterApp) -> AsyncIterator[str]:
    """``app`` running and served by uvicorn on a loopback port, both pools usable: its URL.
    (Lifespan off: ``running`` is entered here, without the process-wide tuning a server's
    start-up adds.)"""
    async with app.running():

        async def ready() -> bool:
            return all(app.usable_pools().values())

        await await_for(ready)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, lifespan="off", log_level="warning", access_log=False
        )
        server = uvicorn.Server(config)
        task = asyncio.get_running_loop().create_task(server.serve())

        async def started() -> bool:
            return server.started

        try:
            await await_for(started)
            port = server.servers[0].sockets[0].getsockname()[1]
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            await task


async def test_paced_surfaces_are_installed_under_load_and_idle_ones_are_not_paced(
    sims: dict[str, Proc], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = model_table(400, 200, time_scale=float(TIME_SCALE), tau_sampling=EAGLE3.tau_sampling)
    tables.save(table, tmp_path / "t.json")
    settings = Settings(
        speculative_urls=[sims["speculative"].url],
        baseline_urls=[sims["baseline"].url],
        policy="slo",
        table_path=tmp_path / "t.json",
        learn_interval=0.05,
        health_interval=0.1,
        explore_share=0,
        ramp_seconds=0,
        slo_ttft_ms=SLO_TTFT * 1000,
        slo_tpot_ms=SLO_TPOT * 1000,
    )
    assert settings.learn_share == 0.1  # (the default)
    # what happened, in order: ("rest", busy, seconds) after each stretch of the learner's
    # work, ("install", job, surfaces) for each job the timer installed
    events: list[tuple[Any, ...]] = []
    pause = lifecycle.learning_pause

    def counted(worked: float, share: float, busy: bool) -> float:
        seconds = pause(worked, share, busy)
        events.append(("rest", busy, seconds))
        return seconds

    monkeypatch.setattr(lifecycle, "learning_pause", counted)
    app = RouterApp(settings)

    class Installs:
        """What the keeper's timer sees of the decider, each install noted (the decider's
        methods cannot be patched where it is compiled: ``router.compiled``)."""

        def __init__(self, decider: Decider) -> None:
            self.decider = decider

        def pending(self) -> SurfaceJob | None:
            return self.decider.pending()

        def install(self, job: SurfaceJob, computed: Mapping[int | None, Surface]) -> None:
            events.append(("install", job, dict(computed)))
            self.decider.install(job, computed)

    keep_learning = lifecycle.keep_learning

    def noted(keeper: Any, decider: Decider | None = None, pace: Any = None) -> Any:
        assert decider is app.decider
        return keep_learning(keeper, cast(Decider, Installs(decider)), pace)

    monkeypatch.setattr(lifecycle, "keep_learning", noted)

    def installs_after(kind: str, busy: bool) -> int:
        """Installs after the first rest of that kind (``busy`` while requests were in
        flight)."""
        first = next(
            (i for i, e in enumerate(events) if e[0] == kind and e[1] is busy and e[2] > 0), None
        )
        return 0 if first is None else sum(1 for e in events[first:] if e[0] == "install")

    statuses: Counter[int] = Counter()
    pools: Counter[str] = Counter()
    stop = asyncio.Event()

    async def keep_asking(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            r = await client.post("/v1/chat/completions", json=body())
            statuses[r.status_code] += 1
            pools[r.headers.get("x-spec-router-pool", "")] += 1

    async with (
        on_a_socket(app) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        askers = [asyncio.create_task(keep_asking(client)) for _ in range(CLIENTS)]
        try:

            async def two_paced_installs() -> bool:
                return installs_after("rest", True) >= 2

            # the timer's jobs rest while the requests are in flight, and are installed
            await await_for(two_paced_installs, timeout=30)
        finally:
            stop.set()
            await asyncio.gather(*askers)

        async def idle() -> bool:
            return app.tracker.total == 0

        await await_for(idle)
        quiet = len(events)

        async def two_more_installs() -> bool:
            return sum(1 for e in events[quiet:] if e[0] == "install") >= 2

        await await_for(two_more_installs)
        # idle: no rest at all (a turn of the loop between slices, as before the pacing)
        rests = [e for e in events[quiet:] if e[0] == "rest"]
        assert rests and all(e[1:] == (False, 0.0) for e in rests)

    assert statuses and set(statuses) == {200}, statuses
    assert "" not in pools  # (every one routed by the slo policy)
    busy = [e for e in events if e[0] == "rest" and e[1]]
    assert busy and all(e[2] > 0 for e in busy)
    # every job installed in full: each bucket asked for, each surface what computing the job
    # at once gives (paced slices change when it comes, never what)
    jobs = [e for e in events if e[0] == "install"]
    for _, job, computed in jobs:
        assert set(computed) == set(job.buckets)
        assert computed == job.compute()
    assert app.decider.surface() is not None
