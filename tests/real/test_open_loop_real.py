"""Open-loop arrivals through the router: requests come when they come, not when the last ends.

TODO(replay): the traffic issue's ``spec-router replay`` is being built on branch ``replay``;
once it is on main, drive this test with it (a short synthetic trace, e.g. ``--synthetic
poisson``) instead of ``tests.real.drive.open_loop``.
"""

from __future__ import annotations

import asyncio
import shutil
from collections import Counter
from pathlib import Path

import httpx

from router.tools.loadgen import RequestResult
from tests.real.conftest import Calibration, RouterFactory
from tests.real.drive import open_loop
from tests.support.http import router_status, wait_for

TIMEOUT = httpx.Timeout(connect=10.0, read=300.0, write=30.0, pool=None)


def test_open_loop_light_then_heavy(
    calibration: Calibration, start_router: RouterFactory, tmp_path: Path
) -> None:
    table = tmp_path / "table.json"
    shutil.copy(calibration.path, table)
    router = start_router(TABLE_PATH=str(table), EXPLORE_SHARE="0")

    async def run(rate: float, duration: float, seed: int) -> list[RequestResult]:
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            return await open_loop(client, router.url, rate, duration, seed, max_tokens=32)

    light = asyncio.run(run(0.5, 12.0, 1))
    heavy = asyncio.run(run(4.0, 15.0, 2))
    assert light and heavy
    assert all(r.ok for r in light + heavy), [r.error for r in light + heavy if not r.ok]
    assert all(r.output_tokens == 32 for r in light + heavy)
    # light: a request that finds nothing in flight goes to the speculative engine (one that
    # finds another there may do more good on the idle baseline: the default policy weighs the
    # slowdown it would cause)
    alone = [r for r in light if not any(o.start < r.start < (o.end or 0) for o in light)]
    assert len(alone) >= len(light) // 2 and {r.pool for r in alone} == {"speculative"}
    # heavy: arrivals outpace one engine; the baseline takes a share
    pools = Counter(r.pool for r in heavy)
    assert pools["baseline"] > 0 and pools["speculative"] > 0, pools
    wait_for(lambda: router_status(router.url)["in_flight"]["total"] == 0)
