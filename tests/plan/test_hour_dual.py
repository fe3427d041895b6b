"""``bench/lab/fleet_oracle.py``'s ``hour_dual``: a bound on the per-hour clause over every
schedule of the oracle's program (one switch at a time, restarts in whole buckets), checked
against every such schedule enumerated on small hand-made days."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.modules import load_script

fo = load_script(Path(__file__).resolve().parents[2] / "bench" / "lab" / "fleet_oracle.py")
Counts = list[tuple[int, int, int]]
RESTART = {"speculative": 60.0, "baseline": 60.0}  # one bucket each


def schedules(full: dict[int, Counts], short: dict[int, Counts], n: int,
              steps: int) -> Iterator[Counts]:  # fmt: skip
    """Every schedule of the program, as its buckets' counts: start in any split; in a split,
    stay a bucket or start a switch, which spends ``steps`` buckets with one engine of the
    source mode down, then lands in the neighbouring split."""
    buckets = len(full[0])

    def walk(b: int, k: int) -> Iterator[Counts]:
        if b >= buckets:
            yield []
            return
        for rest in walk(b + 1, k):
            yield [full[k][b], *rest]
        for during, after in ((k - 1, k - 1), (k, k + 1)):  # into baseline, into speculative
            if not 0 <= after <= n:
                continue
            end = min(buckets, b + steps)
            for rest in walk(end, after):
                yield [short[during][i] for i in range(b, end)] + rest

    for k in range(n + 1):
        yield from walk(0, k)


def worst(counts: Counts, gaps: list[Any], per: int) -> float:
    hours = fo.hours_of(counts, per)
    return float(min(g.strict * hours[g.hour][0] + g.relaxed * hours[g.hour][1] - g.target
                     for g in gaps))  # fmt: skip


# One engine (split 0 baseline, 1 speculative), two hours of two one-minute buckets. Hour 0:
# baseline at least as good in both tiers; hour 1: speculative. Switching costs a bucket with
# nothing up, so every schedule pays it in one hour or serves the wrong mode in one.
FULL = {
    0: [(10, 6, 10), (10, 6, 10), (10, 3, 10), (10, 3, 10)],
    1: [(10, 5, 4), (10, 5, 4), (10, 9, 10), (10, 9, 10)],
}
DOWN = {0: [(10, 0, 0)] * 4}


def test_an_unavoidable_switch_makes_the_clause_infeasible_and_the_certificate_proves_it() -> None:
    gaps = fo.tier_gaps(FULL, 1, 2)
    d = fo.hour_dual(FULL, DOWN, 1, 60.0, RESTART, gaps, hour=120.0, rounds=100)
    every = [worst(c, gaps, 2) for c in schedules(FULL, DOWN, 1, 1)]
    assert max(every) == pytest.approx(-0.5)  # switch at the hour's boundary, either side
    assert d.found == pytest.approx(max(every))  # the search meets the best schedule
    assert all(w <= d.bound + 1e-12 for w in every)  # the bound holds for each of them
    assert d.bound < -0.03  # and proves the clause (3 points) cannot be met
    # the certificate is what it says: F at its weights, recomputed
    f, _ = fo.dual_value(FULL, DOWN, 1, 60.0, RESTART, 2, gaps, d.weights)
    assert f == d.bound and abs(sum(d.weights) - 1) < 1e-3


def test_with_the_switch_free_the_clause_is_met_and_the_bound_says_so() -> None:
    # a restarting bucket as good as either side (tier by tier): the switch costs nothing
    free = fo.neighbours(FULL, max)
    gaps = fo.tier_gaps(FULL, 1, 2)
    d = fo.hour_dual(FULL, free, 1, 60.0, RESTART, gaps, hour=120.0, rounds=100)
    every = [worst(c, gaps, 2) for c in schedules(FULL, free, 1, 1)]
    assert max(every) == pytest.approx(0.0) == pytest.approx(d.found)
    assert d.bound >= d.found and d.bound == pytest.approx(0.0, abs=1e-9)


def test_the_objective_reading_of_the_same_day_is_bounded_above_every_schedule() -> None:
    gaps = fo.objective_gaps(FULL, 1, 2, 0.2)
    assert [g.target for g in gaps] == pytest.approx([0.2 * 0.6 + 0.8, 0.2 * 0.9 + 0.8])
    d = fo.hour_dual(FULL, DOWN, 1, 60.0, RESTART, gaps, hour=120.0, rounds=100)
    every = [worst(c, gaps, 2) for c in schedules(FULL, DOWN, 1, 1)]
    assert d.found == pytest.approx(max(every))
    assert all(w <= d.bound + 1e-12 for w in every)
