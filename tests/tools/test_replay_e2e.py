"""``spec-router replay`` against real routers and sims: what it records is what happened."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import httpx

from router.tools import goodput, traffic
from router.tools.replay import main, replay
from router.tools.replay_report import read_json
from tests.conftest import TIME_SCALE, RouterFactory
from tests.support.http import metric_value
from tests.support.processes import Proc

SCALE = float(TIME_SCALE)


REASONS = {"below_crossover", "above_crossover", "predicted_gain", "failover", "retry", "explore"}


def short_trace(count: int = 30, seed: int = 7) -> list[traffic.Arrival]:
    """~30 requests over ~20 model seconds (2 s of wall time at the tests' time scale), long
    enough outputs that several overlap and a crossover of 2 sends some to each pool."""
    arrivals = traffic.poisson(
        1.5,
        60.0,
        traffic.Lengths(200, 0.8, lo=8, hi=2000),
        traffic.Lengths(150, 0.5, lo=2, hi=600),
        temperature_share=0.5,
        seed=seed,
    )
    return traffic.window(arrivals, count=count)


def router_metrics(url: str) -> str:
    return httpx.get(f"{url}/metrics", timeout=5).text


def test_replay_through_the_router_records_every_request(start_router: RouterFactory) -> None:
    router = start_router(crossover="2", learn="false", explore_share="0")
    arrivals = short_trace()
    assert len(arrivals) == 30
    results = asyncio.run(replay(arrivals, router.url, time_scale=SCALE, drain=60.0))

    assert [r.arrival for r in results] == arrivals
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    for r in results:
        assert r.output_tokens == r.arrival.output_tokens
        assert r.ttft is not None and r.e2e is not None and r.tpot is not None
        assert 0 < r.ttft < r.e2e
        assert r.tpot > 0
        assert r.sent_at is not None and r.lateness is not None
        assert r.reason in REASONS
    pools = [r.pool for r in results]
    assert set(pools) == {"speculative", "baseline"}
    # What the headers said is what the router counted, pool by pool ...
    text = router_metrics(router.url)
    for pool in ("speculative", "baseline"):
        counted = metric_value(text, "spec_router_requests_total", pool=pool, code="200")
        assert counted == pools.count(pool)
    # ... and the prompts were exactly as long as asked (the sims count words).
    prompts = metric_value(text, "spec_router_prompt_tokens_total")
    assert prompts == sum(a.prompt_tokens for a in arrivals)
    summary = goodput.summarize(results)
    assert (summary.count, summary.ok, summary.rejections, summary.errors) == (30, 30, 0, 0)
    assert summary.speculative_share == pools.count("speculative") / 30


def test_completions_endpoint_sends_token_id_prompts(start_router: RouterFactory) -> None:
    router = start_router()
    arrivals = short_trace(count=8, seed=3)
    results = asyncio.run(
        replay(arrivals, f"{router.url}/v1", endpoint="completions", time_scale=SCALE)
    )
    assert all(r.ok and r.output_tokens == r.arrival.output_tokens for r in results)
    text = router_metrics(router.url)
    assert metric_value(text, "spec_router_prompt_tokens_total") == sum(
        a.prompt_tokens for a in arrivals
    )


def test_a_503_from_the_engine_is_a_rejection(sims: dict[str, Proc]) -> None:
    arrivals = [traffic.Arrival(i * 0.05, 10, 5) for i in range(20)]
    results = asyncio.run(
        replay(
            arrivals,
            sims["baseline"].url,
            headers={"x-sim-fault": "status=503,p=0.5"},
            time_scale=SCALE,
        )
    )
    refused = [r for r in results if r.status == 503]
    assert 0 < len(refused) < 20
    assert all(r.rejected and not r.ok and r.ttft is None for r in refused)
    s = goodput.summarize(results)
    assert (s.rejections, s.errors, s.ok) == (len(refused), 0, 20 - len(refused))
    assert s.relaxed <= s.ok / 20
    assert s.error_kinds == {"HTTP 503": len(refused)}
    assert math.isnan(s.speculative_share)  # no router, no pool header


def test_a_503_passed_through_the_router_is_a_rejection(start_router: RouterFactory) -> None:
    router = start_router(max_attempts="1")
    arrivals = [traffic.Arrival(i * 0.05, 10, 5) for i in range(6)]
    results = asyncio.run(
        replay(arrivals, router.url, headers={"x-sim-fault": "status=503"}, time_scale=SCALE)
    )
    s = goodput.summarize(results)
    assert (s.rejections, s.errors, s.ok, s.relaxed) == (6, 0, 0, 0.0)


def test_the_command_writes_results_and_a_report(sims: dict[str, Proc], tmp_path: Path) -> None:
    out, report = tmp_path / "run.json", tmp_path / "run.md"
    argv = [
        "--url", sims["speculative"].url, "--synthetic", "bursty",
        "--rate", "10", "--duration", "3", "--seed", "1", "--prompt-median", "30",
        "--output-median", "20", "--temperature-share", "0.5", "--time-scale", TIME_SCALE,
        "--slo-tpot-ms", "40", "--out", str(out), "--report", str(report),
    ]  # fmt: skip
    assert main(argv) == 0
    meta, results = read_json(out)
    assert meta["time_scale"] == SCALE and meta["command"].startswith("spec-router replay")
    assert results and all(r.ok for r in results)
    assert len(results) == meta["workload"]["count"]
    assert 0.3 < sum(r.arrival.temperature == 1.0 for r in results) / len(results) < 0.7
    text = report.read_text()
    assert "goodput custom" in text and f"{len(results)}/{len(results)}" in text
