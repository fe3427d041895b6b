"""Over HTTP at a small time scale, measured rates follow the analytic model.

The tolerance is generous (the test shares two cores with everything else);
``bench/results/sim-fidelity.md`` holds the tight numbers.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from router.sim.model import PRESETS, closed_loop
from router.tools.loadgen import run_closed_loop, window_stats
from tests.sim.conftest import SCALE
from tests.support.processes import Proc

PROMPT, OUTPUT = 32, 64


@pytest.mark.parametrize("concurrency", [1, 16])
def test_rates_follow_the_model(sim: Proc, concurrency: int) -> None:
    scale = float(SCALE)
    name = httpx.get(sim.url + "/sim/config").json()["preset"]["name"]
    model = closed_loop(PRESETS[name], concurrency, PROMPT, OUTPUT)
    warmup, window = 0.4, 1.6
    t0 = time.monotonic()
    results = asyncio.run(
        run_closed_loop(
            sim.url + "/v1",
            concurrency=concurrency,
            prompt_tokens=PROMPT,
            output_tokens=OUTPUT,
            duration=warmup + window,
        )
    )
    stats = window_stats(results, t0 + warmup, t0 + warmup + window)
    assert stats.per_request_tps == pytest.approx(model.per_request_tps / scale, rel=0.1)
    assert stats.total_tps == pytest.approx(model.total_tps / scale, rel=0.1)
