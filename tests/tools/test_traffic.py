"""Workloads as plain values: trace loaders, generators and shaping."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from router.tools import traffic
from router.tools.traffic import Arrival, Lengths

FIXED = Lengths(100, 0.0)  # sigma 0: always the median


def write_azure(path: Path, rows: list[tuple[str, int, int]]) -> Path:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [f"{t},{p},{o}" for t, p, o in rows]
    path.write_text("\n".join(lines))  # the real files have no final newline either
    return path


def test_azure_csv_times_are_seconds_from_the_first_row(tmp_path: Path) -> None:
    path = write_azure(
        tmp_path / "t.csv",
        [
            ("2023-11-16 18:15:46.6805900", 374, 44),
            ("2023-11-16 18:15:50.9951690", 396, 109),
            ("2023-11-16 18:16:46.6805900", 91, 16),
        ],
    )
    arrivals = traffic.load_trace(path)
    assert [a.prompt_tokens for a in arrivals] == [374, 396, 91]
    assert [a.output_tokens for a in arrivals] == [44, 109, 16]
    assert arrivals[0].at == 0.0
    assert arrivals[1].at == pytest.approx(4.314579, abs=1e-6)
    assert arrivals[2].at == pytest.approx(60.0, abs=1e-6)
    assert all(a.temperature == 0.0 for a in arrivals)


def test_azure_csv_rows_out_of_order_are_sorted(tmp_path: Path) -> None:
    path = write_azure(
        tmp_path / "t.csv", [("2023-11-16 10:00:05", 2, 3), ("2023-11-16 10:00:01", 4, 5)]
    )
    arrivals = traffic.load_azure_csv(path)
    assert [(a.at, a.prompt_tokens) for a in arrivals] == [(0.0, 4), (4.0, 2)]


def test_mooncake_jsonl_timestamps_are_milliseconds(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 1000, "input_length": 10, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 1500, "input_length": 20, "output_length": 6},
        {"timestamp": 4000, "input_length": 30, "output_length": 7},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    arrivals = traffic.load_trace(path)
    assert arrivals == [Arrival(0.0, 10, 5), Arrival(0.5, 20, 6), Arrival(3.0, 30, 7)]


def test_lengths_are_lognormal_around_the_median_and_clipped() -> None:
    import random

    rng = random.Random(1)
    spread = Lengths(1000, 1.0, lo=100, hi=8192)
    draws = [spread.draw(rng) for _ in range(4000)]
    assert min(draws) >= 100 and max(draws) <= 8192
    assert 100 in draws and 8192 in draws  # both clips, ~2 sigma out, are reached
    median = sorted(draws)[len(draws) // 2]
    assert 900 < median < 1100
    assert {FIXED.draw(rng) for _ in range(10)} == {100}
    with pytest.raises(ValueError):
        Lengths(0, 1.0)
    with pytest.raises(ValueError):
        Lengths(10, 1.0, lo=5, hi=4)


def test_poisson_is_seeded_and_has_its_rate() -> None:
    a = traffic.poisson(50.0, 100.0, FIXED, Lengths(20, 0.5), seed=3)
    assert a == traffic.poisson(50.0, 100.0, FIXED, Lengths(20, 0.5), seed=3)
    assert a != traffic.poisson(50.0, 100.0, FIXED, Lengths(20, 0.5), seed=4)
    assert abs(len(a) - 5000) < 4 * math.sqrt(5000)
    assert all(0 <= x.at < 100 for x in a)
    assert [x.at for x in a] == sorted(x.at for x in a)
    # Other lengths, same seed: the same arrival times.
    b = traffic.poisson(50.0, 100.0, Lengths(7, 0.0), Lengths(3, 0.0), seed=3)
    assert [x.at for x in b] == [x.at for x in a]
    assert {(x.prompt_tokens, x.output_tokens) for x in b} == {(7, 3)}


def test_on_off_keeps_the_mean_rate_and_bursts_in_the_on_phase() -> None:
    rate_at, peak = traffic.on_off_rate(2.0, burst=4.0, on_s=10.0, off_s=20.0)
    assert (rate_at(5.0), rate_at(25.0), rate_at(35.0), peak) == (1.0, 4.0, 1.0, 4.0)
    arrivals = traffic.on_off(2.0, 3000.0, FIXED, FIXED, burst=4, on_s=10, off_s=20, seed=1)
    assert abs(len(arrivals) - 6000) < 4 * math.sqrt(6000)
    on = sum(a.at % 30 >= 20 for a in arrivals)
    # 10 s at 4/s against 20 s at 1/s per cycle: twice as many in the on-phases.
    assert on / (len(arrivals) - on) == pytest.approx(2.0, rel=0.1)
    with pytest.raises(ValueError):
        traffic.on_off_rate(1.0, burst=0.5, on_s=1, off_s=1)


def test_diurnal_swings_around_its_mean() -> None:
    arrivals = traffic.diurnal(10.0, 1200.0, FIXED, FIXED, period_s=120, amplitude=0.5, seed=2)
    assert abs(len(arrivals) - 12000) < 4 * math.sqrt(12000)
    rising = sum(a.at % 120 < 60 for a in arrivals)  # sin > 0 in the first half-period
    # Mean rate over the halves: 10 * (1 +- 0.5 * 2 / pi).
    expected = (1 + 1 / math.pi) / (1 - 1 / math.pi)
    assert rising / (len(arrivals) - rising) == pytest.approx(expected, rel=0.1)


def test_compress_reaches_the_rate_and_keeps_the_order() -> None:
    arrivals = [Arrival(t, 1, 1) for t in (0.0, 1.0, 3.0, 4.0)]  # 0.75 req/s
    assert traffic.mean_rate(arrivals) == 0.75
    slower = traffic.compress(arrivals, 0.375)
    assert [a.at for a in slower] == [0.0, 2.0, 6.0, 8.0]
    faster = traffic.compress(arrivals, 3.0)
    assert traffic.mean_rate(faster) == pytest.approx(3.0)
    assert math.isnan(traffic.mean_rate(arrivals[:1]))
    with pytest.raises(ValueError):
        traffic.compress(arrivals[:1], 1.0)


def test_thin_keeps_nested_subsets_at_the_target_rate() -> None:
    arrivals = traffic.poisson(20.0, 500.0, FIXED, FIXED, seed=5)
    low = traffic.thin(arrivals, 2.0, 500.0, seed=9)
    high = traffic.thin(arrivals, 6.0, 500.0, seed=9)
    assert abs(len(low) - 1000) < 4 * math.sqrt(1000)
    assert abs(len(high) - 3000) < 4 * math.sqrt(3000)
    assert set(low) <= set(high)  # a lower load is a subset of a higher one
    assert traffic.thin(arrivals, 2.0, 500.0, seed=9) == low
    with pytest.raises(ValueError, match="compress"):
        traffic.thin(arrivals, 40.0, 500.0)


def test_window_shifts_and_counts() -> None:
    arrivals = [Arrival(float(t), t + 1, 1) for t in range(10)]
    w = traffic.window(arrivals, start=3.0, duration=4.0)
    assert [(a.at, a.prompt_tokens) for a in w] == [(0.0, 4), (1.0, 5), (2.0, 6), (3.0, 7)]
    assert len(traffic.window(arrivals, start=3.0, count=2)) == 2
    assert traffic.window(arrivals) == arrivals


def test_caps_clip_lengths() -> None:
    arrivals = [Arrival(0.0, 5000, 900), Arrival(1.0, 10, 3)]
    assert traffic.cap_lengths(arrivals, prompt=4096, output=512) == [
        Arrival(0.0, 4096, 512),
        Arrival(1.0, 10, 3),
    ]
    assert traffic.cap_lengths(arrivals) == arrivals


def test_temperature_mix_is_exact_and_seeded() -> None:
    arrivals = [Arrival(float(t), 1, 1) for t in range(101)]
    mixed = traffic.with_temperatures(arrivals, 0.5, seed=1)
    assert sum(a.temperature == 1.0 for a in mixed) == 50
    assert {a.temperature for a in mixed} == {0.0, 1.0}
    assert mixed == traffic.with_temperatures(arrivals, 0.5, seed=1)
    assert mixed != traffic.with_temperatures(arrivals, 0.5, seed=2)
    assert all(a.temperature == 1.0 for a in traffic.with_temperatures(arrivals, 1.0))
    with pytest.raises(ValueError):
        traffic.with_temperatures(arrivals, 1.5)


def test_describe() -> None:
    arrivals = [Arrival(0.0, 10, 1), Arrival(2.0, 20, 3, 1.0), Arrival(4.0, 60, 8)]
    p = traffic.describe(arrivals)
    assert (p.count, p.span, p.rate) == (3, 4.0, 0.5)
    assert (p.prompt_mean, p.prompt_median, p.output_mean, p.output_median) == (30, 20, 4, 3)
    assert p.hot_share == pytest.approx(1 / 3)
    assert traffic.describe([]).count == 0
