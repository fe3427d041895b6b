"""``spec-router fleet``'s pure parts: the actuator's moves, the day, the score, the options."""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.planning.service import MIX_WINDOW
from router.pools import Pool
from router.tools.fleet.actuator import Landed, Leave, Restart, Slot, split, step, switch_id
from router.tools.fleet.cli import build_day, build_parser, parse_split
from router.tools.fleet.engines import initial_modes
from router.tools.fleet.run import yesterday_mix
from router.tools.fleet.score import Outage, summarize
from router.tools.fleet.workload import (
    Envelope,
    LengthSource,
    arrivals,
    engine_slo_capacity,
    per_minute,
    rescale,
)
from router.tools.goodput import Result
from router.tools.traffic import Arrival

A, B = "http://127.0.1.1:9", "http://127.0.1.2:9"


def advised(
    engine: str = A, source: str = "baseline", into: str = "speculative", sid: int = 1
) -> dict[str, Any]:
    return {"switch": {"id": sid, "engine": engine, "from": source, "into": into,
                       "phase": "advised"}}  # fmt: skip


def members(**pools: list[str]) -> dict[Pool, dict[str, dict[str, Any]]]:
    return {cast(Pool, pool): {u: {"url": u} for u in urls} for pool, urls in pools.items()}


def test_an_advised_switch_takes_the_named_engine_out_of_its_pool() -> None:
    slots = [Slot(A, "baseline", "serving"), Slot(B, "baseline", "serving")]
    moves = step(advised(), slots, members(baseline=[A, B]), {}, frozenset())
    assert moves == [Leave(A, "baseline", "speculative", "1")]


def test_a_switch_is_acted_on_once() -> None:
    slots = [Slot(A, "baseline", "serving"), Slot(B, "baseline", "serving")]
    assert step(advised(), slots, members(baseline=[A, B]), {}, frozenset({"1"})) == []


def test_nothing_moves_without_advice_or_while_only_advised_elsewhere() -> None:
    slots = [Slot(A, "baseline", "serving")]
    assert step(None, slots, members(baseline=[A]), {}, frozenset()) == []
    assert step({"switch": None}, slots, members(baseline=[A]), {}, frozenset()) == []
    draining = {"switch": {**advised()["switch"], "phase": "draining"}}
    assert step(draining, slots, members(baseline=[A]), {}, frozenset()) == []


def test_an_engine_not_in_the_source_pool_is_replaced_by_one_that_is() -> None:
    # the planner named A, which serves speculative: a baseline engine goes instead
    slots = [Slot(A, "speculative", "serving"), Slot(B, "baseline", "serving")]
    moves = step(advised(A), slots, members(speculative=[A], baseline=[B]), {}, frozenset())
    assert moves == [Leave(B, "baseline", "speculative", "1")]


def test_a_drained_engine_restarts_once_the_planner_saw_it_go() -> None:
    leaving = [Slot(A, "baseline", "leaving", "speculative", "1", 10.0)]
    # still a member (draining): wait
    assert step(advised(), leaving, members(baseline=[A]), {}, frozenset({"1"}), 11.0, 5.0) == []
    # removed, but the planner still says advised: wait, up to the patience
    assert step(advised(), leaving, members(baseline=[]), {}, frozenset({"1"}), 11.0, 5.0) == []
    late = step(advised(), leaving, members(baseline=[]), {}, frozenset({"1"}), 15.0, 5.0)
    assert late == [Restart(A, "speculative")]
    seen = {"switch": {**advised()["switch"], "phase": "restarting"}}
    assert step(seen, leaving, members(), {}, frozenset({"1"}), 11.0, 5.0) == [
        Restart(A, "speculative")
    ]


def test_one_switch_at_a_time_and_a_loading_engine_lands_when_ready() -> None:
    slots = [Slot(A, "speculative", "loading"), Slot(B, "baseline", "serving")]
    other = advised(B, sid=2)
    assert step(other, slots, members(speculative=[A], baseline=[B]), {A: False}, frozenset()) == []
    moves = step(other, slots, members(speculative=[A], baseline=[B]), {A: True}, frozenset())
    assert moves == [Landed(A, "speculative")]


def test_switch_id_falls_back_to_engine_and_time() -> None:
    assert switch_id({"id": 7}) == "7"
    assert switch_id({"engine": A, "advised_at": 1.5}) == f"{A}@1.5"


def test_split_counts_serving_engines() -> None:
    slots = [Slot(A, "speculative", "serving"), Slot(B, "baseline", "leaving", "speculative")]
    assert split(slots) == {"speculative": 1, "baseline": 0}


@given(st.integers(1, 8), st.integers(0, 8))
def test_initial_modes(n: int, k: int) -> None:
    if k > n:
        with pytest.raises(ValueError):
            initial_modes(n, k)
    else:
        modes = initial_modes(n, k)
        assert modes.count("speculative") == k and len(modes) == n


def test_parse_split() -> None:
    assert parse_split("planner", 4) == (True, None)
    assert parse_split("static:3", 4) == (False, 3)
    for bad in ("static:5", "static:-1", "static:x", "half"):
        with pytest.raises(ValueError, match="static:K"):
            parse_split(bad, 4)


def test_the_diurnal_day_runs_trough_peak_trough_and_the_surge_multiplies() -> None:
    env = Envelope("surge", hours=8, lo=0.1, hi=1.1, surge_at=3600, surge_length=600)
    assert env.share(0) == pytest.approx(0.1)
    assert env.share(4 * 3600) == pytest.approx(1.1)
    assert env.share(3600 + 1) == pytest.approx(3 * Envelope(hours=8).share(3600 + 1))
    assert env.share(3600 + 601) == pytest.approx(Envelope(hours=8).share(3600 + 601))
    assert Envelope("flat", hi=0.5).share(1234) == 0.5
    with pytest.raises(ValueError):
        Envelope("weekly")


def test_arrivals_follow_the_envelope_and_rescale_to_the_engines_clock() -> None:
    env = Envelope("diurnal", hours=2)
    pairs = [(100, 50), (1000, 200)]
    day = arrivals(env, 2.0, LengthSource(pairs), 0.5, seed=3)
    expected = sum(env.share(t + 0.5) * 2.0 for t in range(int(env.duration)))
    assert abs(len(day) - expected) < 4 * math.sqrt(expected)
    first, second = day[: len(day) // 4], day[len(day) // 4 : len(day) // 2]
    assert len(second) > len(first)  # rising towards the peak
    assert {(a.prompt_tokens, a.output_tokens) for a in day} <= set(pairs)
    assert 0.4 < sum(a.temperature for a in day) / len(day) < 0.6
    fast = rescale(day, 10.0)
    assert fast[5].at == pytest.approx(day[5].at / 10)
    assert sum(per_minute(day, env.duration)) * 60 == len(day)


def test_capacity_is_the_baselines_relaxed_tpot_rate() -> None:
    from router.sim.model import BASELINE

    cap = engine_slo_capacity(BASELINE, 1155, 211, 0.8)
    assert 0.6 < cap < 1.0  # the lab's 0.77 req/s on the conversation mix
    assert engine_slo_capacity(BASELINE, 1155, 211, 0.8, tpot=0.1) > cap


def result(at: float, ok: bool, ttft: float, tpot: float, tokens: int = 10) -> Result:
    return Result(Arrival(at, 10, tokens), at, 200 if ok else 503, ttft, tpot, 1.0,
                  tokens if ok else None, "baseline", None, None if ok else "x")  # fmt: skip


def test_summary_and_hourly_buckets() -> None:
    # compress 10: engine second t is day second 10 t; two day hours
    rs = [
        result(10.0, True, 0.5, 0.02),  # hour 0: strict
        result(20.0, True, 2.0, 0.04),  # hour 0: relaxed only
        result(400.0, False, 0.1, 0.01),  # hour 1: failed
        result(500.0, True, 0.5, 0.02, tokens=30),  # hour 1: strict
    ]
    outages = [Outage(A, 3000.0, 4200.0, "speculative"), Outage(B, 7000.0, None, "baseline")]
    s = summarize(rs, outages, 7200.0, 10.0)
    assert s["goodput_strict"] == 0.5 and s["goodput_relaxed"] == 0.75
    assert s["tok_s"] == pytest.approx(50 / 720)
    assert s["switches"] == 2 and s["switches_landed"] == 1
    assert s["restart_engine_s"] == pytest.approx(1200 + 200)
    h0, h1 = s["buckets"]
    assert (h0["requests"], h0["goodput_strict"], h0["goodput_relaxed"]) == (2, 0.5, 1.0)
    assert (h1["requests"], h1["goodput_strict"], h1["goodput_relaxed"]) == (2, 0.5, 0.5)
    assert h0["restart_engine_s"] == pytest.approx(600) and h1["restart_engine_s"] == 800
    assert (h0["switches"], h1["switches"]) == (1, 1)


def test_lognormal_lengths_have_sane_means() -> None:
    from router.tools.traffic import Lengths

    src = LengthSource(prompt=Lengths(1000, 0.5, 1, 10000), output=Lengths(100, 0.5, 2, 1000))
    p, o = src.means(4000)
    assert 900 < p < 1300 and 90 < o < 130
    assert src.draw(random.Random(1))[0] >= 1
    with pytest.raises(ValueError):
        LengthSource()


def day_options(*extra: str) -> argparse.Namespace:
    return build_parser().parse_args(["--engines", "4", *extra])


def test_the_synthetic_day_and_yesterday(tmp_path: Path) -> None:
    d = build_day(day_options("--synthetic", "surge", "--hours", "2", "--compress", "10"))
    assert d.seconds == 7200 and d.envelope is not None and "x3" in d.label
    assert 4 * 0.5 < d.capacity < 4 * 1.0  # four baseline engines on the lognormal mix
    # the rate is the envelope's share of capacity per *engine* second: compress 10 plays
    # ten day seconds per engine second, so a day second sees a tenth of it
    engine_seconds = d.seconds / 10
    expected = sum(d.envelope.share(t + 0.5) for t in range(7200)) / 7200 * d.capacity
    assert abs(len(d.arrivals) / engine_seconds - expected) < 0.25 * expected
    assert len(d.yesterday) == 120  # one count a minute, no surge in it
    quiet = build_day(day_options("--synthetic", "diurnal", "--hours", "2", "--no-yesterday"))
    assert quiet.yesterday == () and quiet.yesterday_mix is None


def test_yesterday_kept_the_mix_of_its_own_requests() -> None:
    """A router that served the day before keeps its mix (PLAN_STATE_PATH): the fleet's
    yesterday is another draw of the same lengths and temperatures, not today's requests."""
    d = build_day(day_options("--synthetic", "diurnal", "--hours", "2", "--compress", "10"))
    assert d.yesterday_mix is not None
    mix, kept = d.yesterday_mix
    assert 0 < kept.requests <= MIX_WINDOW and len(mix.prompts) == len(mix.outputs) == 12
    assert kept.prompt_sd > 0 and kept.output_sd > 0
    today = yesterday_mix(d.arrivals)[0]
    assert mix != today  # (another day's requests)
    assert abs(mix.prompt_mean - today.prompt_mean) < 0.25 * today.prompt_mean
    assert 0.6 < mix.sampling < 1.0  # (80% at temperature 1)
    day = [Arrival(float(i), 10 * (i + 1), 2, float(i % 2)) for i in range(MIX_WINDOW + 10)]
    mix, kept = yesterday_mix(day)
    n = kept.requests
    assert n == MIX_WINDOW and mix.sampling == 0.5
    # (the last MIX_WINDOW: prompts 110 on; the mean of twelve near-equal bins)
    assert mix.prompt_mean == pytest.approx(sum(10 * (i + 11) for i in range(n)) / n, rel=1e-3)
    assert min(mix.prompts) > 100


def test_a_trace_day_keeps_its_arrivals_and_lengths(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,100,20\n"
        "2023-11-16 18:15:50.6805900,300,40\n"
        "2023-11-16 19:30:00.0000000,500,60\n"
    )
    d = build_day(day_options("--trace", str(trace), "--hours", "1", "--temperature-share", "0"))
    assert [a.at for a in d.arrivals] == pytest.approx([0.0, 4.0])
    assert (d.prompt_mean, d.output_mean) == (200, 30)
    assert d.envelope is None and d.yesterday == ()
    with pytest.raises(ValueError, match="no arrival"):
        build_day(day_options("--synthetic", "flat", "--hi", "1e-6", "--hours", "0.01"))
