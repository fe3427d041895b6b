"""The recent window: share, reasons and latency percentiles of the last minutes, bounded."""

from __future__ import annotations

import random

import pytest

from router.account.outcome import Outcome
from router.account.recent import RATIO, RecentWindow, quantile
from router.calibrate.loadgen import percentile
from router.upstream.stream import Usage


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def finished(
    clock: Clock,
    pool: str | None,
    reason: str = "predicted_slo",
    ttft: float = 0.1,
    tpot: float = 0.02,
    tokens: int = 11,
    stream: bool = True,
    status: int = 200,
) -> Outcome:
    out = Outcome(path="/v1/chat/completions", started=clock.now)
    out.read(stream=stream)
    if pool is not None:
        out.attempt(pool, f"http://{pool}", reason)  # type: ignore[arg-type]
    out.answered(status)
    out.first_bytes(clock.now + ttft, 0.0)
    out.counted(Usage(5, tokens))
    out.finish(clock.now + ttft + tpot * (tokens - 1))
    return out


def test_share_and_reasons_count_routed_requests_only() -> None:
    clock = Clock()
    w = RecentWindow(clock)
    for _ in range(3):
        w.observe(finished(clock, "speculative", "below_crossover"))
    w.observe(finished(clock, "baseline", "above_crossover"))
    w.observe(finished(clock, None, status=503))  # the router refused: no pool
    s = w.summary()
    assert s["requests"] == {"baseline": 1, "none": 1, "speculative": 3}
    assert s["share_speculative"] == 0.75
    assert s["reasons"] == {
        "speculative": {"below_crossover": 3},
        "baseline": {"above_crossover": 1},
    }


def test_no_requests_no_share() -> None:
    s = RecentWindow(Clock()).summary()
    assert s["share_speculative"] is None
    assert s["latency"]["speculative"]["ttft_p50_ms"] is None


def test_percentiles_are_within_the_bin_width_of_the_exact_ones() -> None:
    clock = Clock()
    w = RecentWindow(clock)
    rng = random.Random(7)
    ttfts = [rng.lognormvariate(-2.0, 0.8) for _ in range(2000)]
    for t in ttfts:
        w.observe(finished(clock, "baseline", ttft=t, tpot=t / 20))
    lat = w.summary()["latency"]["baseline"]
    assert lat["ttft_n"] == lat["tpot_n"] == 2000
    for q in (50, 90):
        exact = percentile(ttfts, q) * 1000
        assert lat[f"ttft_p{q}_ms"] == pytest.approx(exact, rel=RATIO - 1)
        assert lat[f"tpot_p{q}_ms"] == pytest.approx(exact / 20, rel=RATIO - 1)


def test_latency_only_from_streams_that_succeeded() -> None:
    clock = Clock()
    w = RecentWindow(clock)
    w.observe(finished(clock, "speculative", stream=False))
    w.observe(finished(clock, "speculative", status=500))
    w.observe(finished(clock, "speculative", tokens=1))  # a TTFT, but no TPOT
    lat = w.summary()["latency"]["speculative"]
    assert (lat["ttft_n"], lat["tpot_n"]) == (1, 0)


def test_old_requests_leave_the_window_and_memory_stays_bounded() -> None:
    clock = Clock()
    w = RecentWindow(clock, window=60, bucket=5)
    for _ in range(200):  # 200 busy buckets: many more than the window holds
        w.observe(finished(clock, "speculative"))
        w.observe(finished(clock, "baseline"))
        clock.now += 5
    assert len(w._buckets) <= w.slots
    s = w.summary()
    # 12 buckets of 5 s: the last 11 with requests in them (the current one is empty)
    assert s["requests"] == {"baseline": 11, "speculative": 11}
    assert s["latency"]["speculative"]["ttft_n"] == 11
    clock.now += 61
    s = w.summary()
    assert s["requests"] == {} and s["share_speculative"] is None
    assert w._closed == {} and not w._buckets


def test_series_fills_empty_buckets_with_zero() -> None:
    clock = Clock()
    w = RecentWindow(clock, window=20, bucket=5)
    w.observe(finished(clock, "speculative"))
    clock.now += 10
    w.observe(finished(clock, "baseline"))
    w.observe(finished(clock, "baseline"))
    s = w.series()
    assert len(s["t"]) == 4 and s["bucket_s"] == 5
    assert s["t"] == sorted(s["t"]) and s["t"][-1] <= 0
    assert sum(s["speculative"]) == 1 and sum(s["baseline"]) == 2
    assert s["baseline"][-1] == 2 and s["speculative"][-1] == 0


def test_quantile_of_one_bin() -> None:
    assert quantile({}, 0.5) is None
    value = quantile({10: 3}, 0.9)
    assert value is not None and RATIO**10 <= value < RATIO**11


def test_the_share_within_the_slo_per_pool_and_over_all() -> None:
    clock = Clock()
    w = RecentWindow(clock, slo=(1.0, 0.025))
    w.observe(finished(clock, "speculative", ttft=0.5, tpot=0.02))  # strict
    w.observe(finished(clock, "speculative", ttft=2.0, tpot=0.02))  # relaxed only (3 s)
    w.observe(finished(clock, "baseline", ttft=0.5, tpot=0.06))  # neither (TPOT > 50 ms)
    w.observe(finished(clock, "baseline", ttft=0.1, tpot=0.04))  # relaxed only (2x)
    w.observe(finished(clock, None, status=503))  # refused: judged, a miss
    w.observe(finished(clock, "baseline", stream=False))  # no TTFT: not judged
    w.observe(finished(clock, "baseline", status=400))  # the client's error: not judged
    within = w.summary()["within_slo"]
    assert within["speculative"] == {"judged": 2, "strict": 0.5, "relaxed": 1.0}
    assert within["baseline"] == {"judged": 2, "strict": 0.0, "relaxed": 0.5}
    assert within["all"] == {"judged": 5, "strict": 0.2, "relaxed": 0.6}
    series = w.series()
    assert series["within_slo"]["strict"][-1] == 0.2
    assert series["within_slo"]["relaxed"][-1] == 0.6
    assert series["within_slo"]["strict"][0] is None  # (a bucket with nothing judged)


def test_the_series_carries_each_buckets_ttft_and_tpot_p90() -> None:
    clock = Clock()
    w = RecentWindow(clock, window=20, bucket=5)
    for ttft in (0.1, 0.2, 0.3, 0.4, 2.0):
        w.observe(finished(clock, "speculative", ttft=ttft, tpot=0.01))
    clock.now += 5
    s = w.series()
    ttft = s["ttft_p90_ms"]["speculative"]
    assert ttft[-1] is None  # this bucket has none yet
    assert ttft[-2] == pytest.approx(400, rel=RATIO - 1)  # rank 0.9 * 4 = 3.6 -> the 4th
    assert s["tpot_p90_ms"]["speculative"][-2] == pytest.approx(10, rel=RATIO - 1)
    assert s["ttft_p90_ms"]["baseline"] == [None] * 4
