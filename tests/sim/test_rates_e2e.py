"""Over HTTP at a small time scale, measured rates follow the analytic model.

The tolerance is generous (the test shares two cores with everything else);
``bench/results/sim-fidelity.md`` holds the tight numbers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from router.calibrate.loadgen import run_closed_loop, window_stats
from router.sim.model import PRESETS, closed_loop
from tests.support.processes import Proc, running, sim_args

PROMPT, OUTPUT = 32, 64
# Slower than the other sim tests' 0.05: there, 16 streams are ~6,300 SSE events/s for the
# client in this process to parse, more than one core of a slow host keeps up with (2026-12-04,
# this test's loop at 0.05: baseline, 16 streams, 438-490 tok/s per request against the model's
# 408, and 10-20% short of its total). A client that falls behind keeps fewer requests in the
# batch than it was asked to, so the engine runs faster per request and slower in total than the
# model at 16 says, and the test would measure the client. At 0.1 it needs half that (the same
# loop on the same host: within 6% of the model).
SCALE = "0.1"


@pytest.fixture(scope="module", params=["eagle3", "baseline"])
def sim(request: pytest.FixtureRequest) -> Iterator[Proc]:
    with running(sim_args(request.param, "--time-scale", SCALE, "--seed", "1")) as proc:
        yield proc


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
