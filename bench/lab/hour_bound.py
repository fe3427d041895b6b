"""An exact upper bound on one hour's two goodput tiers over every schedule, restarts free.

The issue's clause asks each hour's strict and relaxed goodput to be at least the better of
all-speculative and all-baseline *in that tier* minus 3 points. ``fleet_oracle.hour_reach``
searches for a schedule that does (a heuristic); this module bounds what any schedule can do,
exactly, so a negative answer is a proof (within the model below).

The model (the oracle's): minute ``m`` spent in split ``k`` yields the strict and relaxed
counts of the static run in split ``k`` over that minute's arrivals. The relaxation: any split
each minute, switching free and instant, and even a mixture of splits within a minute (weights
``x[m][k] >= 0`` summing to 1, yielding the weighted counts). Every real schedule with
restarts is one of these (a restarting minute in the oracle's model is worth a split of
``n - 1`` engines, which the static runs of ``n`` bound from above only if an engine more
never hurts; the schedules here need no restarting minute at all), so the bound's value is
at least any schedule's, given the per-minute values.

The program, for targets ``ts`` and ``tr`` (shares of the hour's ``A`` arrivals)::

    max over x of  min(S(x) / A - ts,  R(x) / A - tr)

with ``S`` and ``R`` linear in ``x``. Over ``lam`` in [0, 1], ``min(a, b) = min lam * a +
(1 - lam) * b``; ``x`` ranges over a product of simplices (compact, convex) and the function is
bilinear, so max-min equals min-max (von Neumann's minimax theorem; equivalently LP duality for
the program with an epigraph variable)::

    bound = min over lam of g(lam),
    g(lam) = sum over m of max over k of (lam * s[m][k] + (1 - lam) * r[m][k]) / A
             - lam * ts - (1 - lam) * tr

Each minute chooses on its own once ``lam`` is fixed. ``g`` is convex and piecewise linear;
its minimum lies at 0, 1 or a point where two of one minute's lines cross, so the candidates
are enumerated and evaluated in rational arithmetic: the bound is exact. The schedule that
attains it (the primal) is built from the minutes' best splits at the minimising ``lam``
(ties resolved toward one tier, then the other, one minute at a time, mixing within one minute
at most), and its value equals the bound: that equality is the certificate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import NamedTuple

Minute = tuple[int, int, int]  # (arrived, strict, relaxed)


class HourBound(NamedTuple):
    """The bound for one hour, and the schedule that attains it."""

    bound: Fraction  # max over schedules of the worse tier's gap to its target (share)
    lam: Fraction  # the weight on strict where the dual is tightest (the certificate)
    target: tuple[Fraction, Fraction]  # (strict, relaxed) targets, shares of the arrivals
    strict: Fraction  # the attaining schedule's strict share
    relaxed: Fraction
    strict_alone: Fraction  # the most strict share any schedule gets, relaxed ignored
    relaxed_alone: Fraction
    schedule: tuple[tuple[tuple[int, Fraction], ...], ...]  # per minute: (split, weight), ...
    arrived: int


def pure_targets(
    splits: Mapping[int, Sequence[Minute]], pure: Sequence[int], slack: Fraction
) -> tuple[Fraction, Fraction]:
    """Each tier's target: the better of the ``pure`` splits' shares in that tier minus
    ``slack`` (the issue's reading: each tier against its own better pure split)."""
    arrived = _arrived(splits)
    best = [max(Fraction(sum(c[t] for c in splits[k]), arrived) for k in pure) for t in (1, 2)]
    return best[0] - slack, best[1] - slack


def hour_bound(
    splits: Mapping[int, Sequence[Minute]], target_strict: Fraction, target_relaxed: Fraction
) -> HourBound:
    """The exact bound over one hour: ``splits[k]`` is the hour's minutes in split ``k`` (the
    same arrivals in every split)."""
    arrived = _arrived(splits)
    ks = sorted(splits)
    minutes = len(splits[ks[0]])
    lines = [[(splits[k][m][1], splits[k][m][2], k) for k in ks] for m in range(minutes)]
    ts, tr = Fraction(target_strict), Fraction(target_relaxed)

    def g(lam: Fraction) -> Fraction:
        top = sum(max(lam * s + (1 - lam) * r for s, r, _ in ms) for ms in lines)
        return Fraction(top, arrived) - lam * ts - (1 - lam) * tr

    candidates = {Fraction(0), Fraction(1)}
    for ms in lines:
        for i, (s1, r1, _) in enumerate(ms):
            for s2, r2, _ in ms[i + 1 :]:
                # lam * s1 + (1 - lam) * r1 == lam * s2 + (1 - lam) * r2
                den = (s1 - r1) - (s2 - r2)
                if den:
                    lam = Fraction(r2 - r1, den)
                    if 0 < lam < 1:
                        candidates.add(lam)
    lam = min(sorted(candidates), key=g)
    bound = g(lam)
    schedule = _attaining(lines, lam, arrived, ts, tr)
    strict = Fraction(sum(w * _at(lines[m], k)[0] for m, mix in enumerate(schedule)
                          for k, w in mix), arrived)  # fmt: skip
    relaxed = Fraction(sum(w * _at(lines[m], k)[1] for m, mix in enumerate(schedule)
                           for k, w in mix), arrived)  # fmt: skip
    if min(strict - ts, relaxed - tr) != bound:
        raise AssertionError("the attaining schedule misses the dual's value")  # a bug
    return HourBound(
        bound,
        lam,
        (ts, tr),
        strict,
        relaxed,
        Fraction(sum(max(s for s, _, _ in ms) for ms in lines), arrived),
        Fraction(sum(max(r for _, r, _ in ms) for ms in lines), arrived),
        schedule,
        arrived,
    )


def value_of(
    splits: Mapping[int, Sequence[Minute]],
    schedule: Sequence[Sequence[tuple[int, Fraction]]],
) -> tuple[Fraction, Fraction]:
    """(strict, relaxed) shares of a schedule (per minute: (split, weight), ...) in the model."""
    arrived = _arrived(splits)
    s = sum(w * splits[k][m][1] for m, mix in enumerate(schedule) for k, w in mix)
    r = sum(w * splits[k][m][2] for m, mix in enumerate(schedule) for k, w in mix)
    return Fraction(s, arrived), Fraction(r, arrived)


def _arrived(splits: Mapping[int, Sequence[Minute]]) -> int:
    counts = {tuple(c[0] for c in cs) for cs in splits.values()}
    if len(counts) != 1:
        raise ValueError("every split must see the same arrivals per minute")
    return max(1, sum(next(iter(counts))))


def _at(ms: Sequence[tuple[int, int, int]], k: int) -> tuple[int, int]:
    return next((s, r) for s, r, kk in ms if kk == k)


def _attaining(
    lines: Sequence[Sequence[tuple[int, int, int]]],
    lam: Fraction,
    arrived: int,
    ts: Fraction,
    tr: Fraction,
) -> tuple[tuple[tuple[int, Fraction], ...], ...]:
    """A schedule optimal at ``lam`` whose worse gap is the bound: every minute picks among its
    best splits at ``lam``. Inside (0, 1), the picks that favour relaxed (least strict minus
    relaxed) leave the strict gap behind and those that favour strict put it ahead (``g``'s
    left and right slopes at its minimum); minutes turn one at a time from the first to the
    second until the gaps are equal, the last minute mixed."""
    left, right = [], []
    for ms in lines:
        top = max(lam * s + (1 - lam) * r for s, r, _ in ms)
        best = [(s - r, s, k) for s, r, k in ms if lam * s + (1 - lam) * r == top]
        left.append(min(best))
        right.append(max(best))

    def diff(picks: Sequence[tuple[int, int, int]]) -> Fraction:
        # strict gap minus relaxed gap
        return Fraction(sum(d for d, _, _ in picks), arrived) - ts + tr

    def whole(picks: Sequence[tuple[int, int, int]]) -> list[tuple[tuple[int, Fraction], ...]]:
        return [((k, Fraction(1)),) for _, _, k in picks]

    # at lam = 0 relaxed binds and strict may lead (the right picks lead most); at lam = 1 the
    # other way round; inside, the gaps must be equal
    if lam == 0 or diff(right) == 0:
        return tuple(whole(right))
    d = diff(left)
    if lam == 1 or d == 0:
        return tuple(whole(left))
    picks = whole(left)
    for m, (lo, hi) in enumerate(zip(left, right, strict=True)):
        step = Fraction(hi[0] - lo[0], arrived)
        if step == 0:
            continue
        if d + step >= 0:
            theta = -d / step  # weight on the strict-favouring pick
            picks[m] = tuple((k, w) for k, w in ((hi[2], theta), (lo[2], 1 - theta)) if w)
            return tuple(picks)
        picks[m] = ((hi[2], Fraction(1)),)
        d += step
    raise AssertionError("no crossing inside: lam is not the minimum")  # a bug
