"""``spec-router demo``'s own arithmetic: the hold's ramp, shortfalls, a busy load generator,
judging the SLO in model time, and the router's settings in the sims' time (against real sims:
test_demo_e2e.py, where it names the live page and ``--hold`` keeps the stack up)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from router.calibrate.loadgen import RequestResult
from router.settings import Settings
from router.sim.model import BASELINE, EAGLE3, EAGLE3_CHAIN, closed_loop
from router.tools.demo import (
    FAITHFUL,
    LOADGEN_LIMIT,
    Point,
    attained,
    hold_levels,
    router_env,
    saturated,
    shortfalls,
)


def test_the_hold_ramps_up_and_back_down() -> None:
    assert hold_levels([1, 2, 4, 8]) == [1, 2, 4, 8, 4, 2]
    assert hold_levels([4, 1]) == [1, 4]
    assert hold_levels([3]) == [3]


def _point(target: str, n: int, total: float) -> Point:
    return Point(target, n, per_request_tps=1.0, total_tps=total, ttft_p50=0.1, spec_share=None,
                 errors=0)  # fmt: skip


def test_a_pool_that_delivers_less_than_its_model_is_a_shortfall() -> None:
    spec32 = closed_loop(EAGLE3, 32, 32, 96).total_tps
    base32 = closed_loop(BASELINE, 32, 32, 96).total_tps
    base64 = closed_loop(BASELINE, 64, 32, 96).total_tps
    points = [
        _point("speculative", 32, spec32 * 0.97),  # within the model: fine
        _point("baseline", 32, base32 * (FAITHFUL - 0.08)),  # behind
        _point("baseline", 64, math.nan),  # nothing measured
        _point("router", 32, 1.0),  # routers are what is compared, not a check
        _point("round_robin", 64, 1.0),
    ]
    behind = shortfalls(points, 32, 96)
    assert [(pool, n) for pool, n, _ in behind] == [("baseline", 32), ("baseline", 64)]
    assert behind[0][2] == pytest.approx(FAITHFUL - 0.08)
    # the same figures at the model's own throughput are faithful
    assert shortfalls([_point("baseline", 64, base64)], 32, 96) == []


def test_the_speculative_pool_is_judged_by_its_regime() -> None:
    # --regime eagle3-chain: eagle3's throughput at 32 users is half what that sim should give
    eagle3 = closed_loop(EAGLE3, 32, 32, 96).total_tps
    chain = closed_loop(EAGLE3_CHAIN, 32, 32, 96).total_tps
    assert eagle3 < FAITHFUL * chain
    behind = shortfalls([_point("speculative", 32, eagle3)], 32, 96, "eagle3-chain")
    assert [(pool, n) for pool, n, _ in behind] == [("speculative", 32)]
    assert shortfalls([_point("speculative", 32, chain)], 32, 96, "eagle3-chain") == []
    assert shortfalls([_point("speculative", 32, eagle3)], 32, 96) == []  # eagle3 by default


def test_a_run_through_which_the_load_generator_was_busy_is_saturated() -> None:
    """Pool-alone runs and the routers' alike: a load generator at its core's limit is what the
    run measures, whatever the sims deliver."""
    points = [
        replace(_point("baseline", 64, 1.0), loadgen_cpu=LOADGEN_LIMIT + 0.05),
        replace(_point("speculative", 64, 1.0), loadgen_cpu=LOADGEN_LIMIT - 0.05),
        _point("router", 8, 1.0),  # not measured (NaN): not a finding
        replace(_point("router", 64, 1.0), loadgen_cpu=1.0),
    ]
    busy = saturated(points)
    assert [(target, n) for target, n, _ in busy] == [("baseline", 64), ("router", 64)]
    assert busy[0][2] == pytest.approx(LOADGEN_LIMIT + 0.05)


def test_within_slo_is_judged_in_model_time() -> None:
    # sims at 0.1: 0.08 s to the first token is 0.8 model s; 97 tokens over 0.192 s is 20 ms
    # per token (strict and relaxed); over 0.384 s, 40 ms (relaxed only); a failure meets none
    def result(first: float, last: float, status: int = 200) -> RequestResult:
        return RequestResult(0, 0, 10.0, 97, status, chunk_times=[10.0 + first, 10.0 + last],
                             output_tokens=97)  # fmt: skip

    assert attained(result(0.08, 0.08 + 0.192), 0.1) == (True, True)
    assert attained(result(0.08, 0.08 + 0.384), 0.1) == (False, True)
    assert attained(result(0.25, 0.25 + 0.192), 0.1) == (False, True)  # 2.5 s to the first
    assert attained(result(0.35, 0.35 + 0.192), 0.1) == (False, False)
    assert attained(result(0.08, 0.08 + 0.192, status=502), 0.1) == (False, False)
    no_usage = result(0.08, 0.08 + 0.192)
    no_usage.output_tokens = None  # an answer without its usage counts as failed (goodput.py)
    assert attained(no_usage, 0.1) == (False, False)


def test_the_routers_slo_and_engine_lags_are_the_defaults_in_the_sims_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # sims at 0.1 run ten times as fast as the engines they model: the router's SLO in wall
    # time is a tenth of serve's default (1 s, 25 ms), as the router reads its environment;
    # so are the engines' lags (SGLang aborts a left client's stream 2 s later: 0.2 s here)
    def settings(time_scale: float) -> Settings:
        env = router_env("http://127.0.0.1:9", "http://127.0.0.1:10", "slo", None, time_scale)
        for key, value in env.items():
            if key.startswith("SPEC_ROUTER_"):
                monkeypatch.setenv(key, value)
        return Settings()

    unscaled, scaled = settings(1.0), settings(0.1)
    assert (unscaled.slo_ttft_ms, unscaled.slo_tpot_ms) == (1000.0, 25.0)
    assert scaled.slo_ttft_ms == pytest.approx(100.0)
    assert scaled.slo_tpot_ms == pytest.approx(2.5)
    assert (unscaled.engine_abort_lag, unscaled.engine_gauge_lag) == (2.0, 2.0)
    assert scaled.engine_abort_lag == pytest.approx(0.2)
    assert scaled.engine_gauge_lag == pytest.approx(0.2)
