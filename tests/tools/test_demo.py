"""``spec-router demo``: it names the live page, the page answers while the demo runs, and
``--hold`` keeps the stack up (ramping load through the router) and still ends on its own."""

from __future__ import annotations

import argparse
import asyncio
import math
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from router.settings import Settings
from router.sim.model import BASELINE, EAGLE3, EAGLE3_CHAIN, closed_loop
from router.tools.demo import (
    FAITHFUL,
    LOADGEN_LIMIT,
    Point,
    attained,
    engine_facts,
    hold_levels,
    router_env,
    run_target,
    saturated,
    scrape_metrics,
    shortfalls,
)
from router.tools.loadgen import RequestResult, run_closed_loop
from router.tools.processes import Proc


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


def test_each_run_measures_the_load_generators_own_cpu(sims: dict[str, Proc]) -> None:
    # this process is the load generator: a run of 0.6 s costs it some CPU, and no more than
    # the run's length (one thread)
    args = argparse.Namespace(duration=0.6, prompt_tokens=32, output_tokens=32, time_scale=0.05)
    point, _ = asyncio.run(run_target(sims["baseline"].url, "baseline", 4, args))
    assert point.total_tps > 0
    assert 0.0 < point.loadgen_cpu <= 1.05


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


def test_the_demo_table_has_the_engines_acceptance_length_and_caps(sims: dict[str, Proc]) -> None:
    # as calibrate reads them: a table that says 1.0 for an engine that accepts 2.8 tokens an
    # iteration makes the router take each of its iterations for 2.8 times shorter than it is
    spec, base = sims["speculative"].url, sims["baseline"].url
    before = asyncio.run(scrape_metrics(spec))
    asyncio.run(
        run_closed_loop(
            f"{spec}/v1", concurrency=2, prompt_tokens=32, output_tokens=64, duration=1.0
        )
    )
    urls = {"speculative": spec, "baseline": base}
    tau, caps = asyncio.run(engine_facts(spec, urls, before))
    assert tau == pytest.approx(EAGLE3.tau, rel=0.15)  # greedy requests: the preset's 2.8
    assert caps == {"speculative": EAGLE3.max_running, "baseline": BASELINE.max_running}


@pytest.mark.slow
def test_the_demo_names_its_live_page_and_holds(tmp_path: Path) -> None:
    # (short requests: a run of 0.4 s measures several after its warm-up)
    cmd = [sys.executable, "-m", "router", "demo", "--levels", "2", "--duration", "0.4"]
    cmd += ["--output-tokens", "32"]
    cmd += ["--hold", "1.5", "--hold-step", "0.5", "--plot", str(tmp_path / "demo.png")]
    began = time.monotonic()
    lines: list[str] = []
    page = None
    up_while_holding = False
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("live page: "):
                    page = line.split()[2]
                    r = httpx.get(page, follow_redirects=True, timeout=10)
                    assert r.status_code == 200 and "spec-router live" in r.text
                if line.startswith("holding for") and page is not None:
                    r = httpx.get(page.replace("/router/ui", "/ready"), timeout=10)
                    up_while_holding = r.status_code == 200
            assert proc.wait(timeout=120) == 0, "".join(lines)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert page is not None, "".join(lines)
    assert up_while_holding, "".join(lines)
    assert (tmp_path / "demo.png").exists()
    assert time.monotonic() - began < 120
