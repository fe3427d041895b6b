"""``bench/lab/family_bound.py``: the bound on both goodput tiers over every placement of a
workload in the optimistic engine model, checked against every placement enumerated on a tiny
workload (each request dropped, or on one pool in one tier), and the model against the lab's
own engine for one placement."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from router.sim.model import BASELINE, EAGLE3
from tests.support.modules import load_script

fb = load_script(Path(__file__).resolve().parents[2] / "bench" / "lab" / "family_bound.py")

# Three 400-token requests 0.2 s apart on two slow engines: the speculative one meets the
# strict TPOT with one running (67 ms / 2.8 a token), the relaxed with two, not three; the
# baseline one the relaxed with one (50 ms), never the strict. One strict request (alone on the
# speculative engine for 9.6 s, longer than the others' 3 s TTFT) or all three relaxed.
SPEC = EAGLE3.replace(name="slow-speculative", b=0.040)
BASE = BASELINE.replace(name="slow-baseline", a=0.040, b=0.010)
ENGINES = fb.Engines((SPEC, BASE), (1, 1))
JOBS = [fb.Job(0.2 * i, 100, 400, False, True) for i in range(3)]
END = 40.0
SLOT = 1.0
OPTIONS = [None, *itertools.product((0, 1), (fb.STRICT, fb.RELAXED))]


def placements() -> list[tuple[float, float]]:
    """(strict, relaxed) shares of every placement the model holds in full."""
    out = []
    for choice in itertools.product(OPTIONS, repeat=len(JOBS)):
        outcome = {i: c for i, c in enumerate(choice) if c is not None}
        if outcome and fb.accommodate(JOBS, ENGINES, END, outcome, SLOT) < len(outcome) - 1e-6:
            continue
        n = len(JOBS)
        strict = sum(1 for c in outcome.values() if c[1] == fb.STRICT) / n
        out.append((strict, len(outcome) / n))
    return out


EVERY = placements()


def test_the_model_holds_what_the_engines_can_and_not_more() -> None:
    def held(outcome: dict[int, tuple[int, int]]) -> float:
        return float(fb.accommodate(JOBS, ENGINES, END, outcome, SLOT))

    assert held({0: (0, fb.STRICT)}) == pytest.approx(1.0)
    assert held({0: (0, fb.STRICT), 1: (0, fb.STRICT)}) < 2 - 0.1
    assert held({0: (1, fb.STRICT)}) < 1 - 0.1
    assert held({0: (0, fb.RELAXED), 1: (0, fb.RELAXED), 2: (1, fb.RELAXED)}) == pytest.approx(3.0)
    # a strict request alone, and another started within its 3 s TTFT beside it: not both
    assert held({0: (0, fb.STRICT), 1: (0, fb.RELAXED), 2: (1, fb.RELAXED)}) < 3 - 0.1


def test_every_placement_trades_one_tier_for_the_other() -> None:
    assert max(s for s, _ in EVERY) == pytest.approx(1 / 3)
    assert max(r for _, r in EVERY) == pytest.approx(1.0)
    assert max(min(s - 1 / 3, r - 1.0) for s, r in EVERY) == pytest.approx(-1 / 3)


def test_the_bound_is_above_every_placement_and_its_certificate_above_the_bound() -> None:
    best_s = max(s for s, _ in EVERY)
    best_r = max(r for _, r in EVERY)
    worst = max(min(s - best_s, r - best_r) for s, r in EVERY)
    b = fb.bound(JOBS, ENGINES, END, (best_s, best_r), SLOT, certify=True)
    assert worst <= b.bound + 1e-6  # no placement beats the bound
    assert b.bound <= b.certified + 1e-6  # the certificate's lam bounds it too
    assert 0.0 <= b.lam <= 1.0
    # and at that lam, F bounds every placement's weighted gap, not only the worst
    for s, r in EVERY:
        assert (1 - b.lam) * (s - best_s) + b.lam * (r - best_r) <= b.certified + 1e-6
    # the most of each tier alone is at least what any placement gets of it
    assert fb.most(JOBS, ENGINES, END, fb.STRICT, SLOT) >= best_s - 1e-6
    assert fb.most(JOBS, ENGINES, END, fb.RELAXED, SLOT) >= best_r - 1e-6


def test_whole_requests_close_the_gap_the_shares_leave() -> None:
    """The linear program lets shares of requests take turns in a seat, so on this instance it
    reaches both bests at once; with whole requests (a mixed-integer program) its max-min is
    the enumeration's."""
    best_s = max(s for s, _ in EVERY)
    best_r = max(r for _, r in EVERY)
    worst = max(min(s - best_s, r - best_r) for s, r in EVERY)
    assert fb.bound(JOBS, ENGINES, END, (best_s, best_r), SLOT).bound == pytest.approx(0, abs=1e-6)
    whole = fb.whole_bound(JOBS, ENGINES, END, (best_s, best_r), SLOT)
    assert whole == pytest.approx(worst, abs=1e-6)


def test_a_placement_the_lab_engine_serves_is_held_by_the_model() -> None:
    """The lab's engine (``bench/lab_sim.Engine``) given the three requests, alternately on each
    engine: its outcome (which met which tier) is one the model holds in full."""
    import sys

    bench = str(Path(__file__).resolve().parents[2] / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import lab_sim as lab

    from router.tools.traffic import Arrival

    engines = [lab.Engine(SPEC, "s", 1), lab.Engine(BASE, "b", 2)]
    reqs = [lab.Req(Arrival(j.at, j.prompt, j.output)) for j in JOBS]
    pending = sorted(range(len(JOBS)), key=lambda i: JOBS[i].at)
    now = 0.0
    while True:
        ends = [e.busy_until for e in engines if e.busy_until is not None]
        busy = [e for e in engines if e.busy_until is not None]
        nxt = min(ends, default=None)
        if pending and (nxt is None or JOBS[pending[0]].at <= nxt):
            i = pending.pop(0)
            now = JOBS[i].at
            engines[i % 2].submit(reqs[i], now)
            continue
        if nxt is None:
            break
        now = nxt
        for e in busy:
            if e.busy_until == now:
                e.finish_iteration(now, [], [])
    served = [(i % 2, r.first, r.last) for i, r in enumerate(reqs)]
    outcome = fb.outcome_of(JOBS, served, END)
    assert outcome  # some met a tier
    assert fb.accommodate(JOBS, ENGINES, END, outcome, SLOT) == pytest.approx(len(outcome))
