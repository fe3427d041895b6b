"""The offline oracle: the best schedule of switches over a known day, by dynamic programming.

Inputs are static lab runs of the same requests: for every split of ``n`` engines up (``k``
speculative, ``n - k`` baseline) and every split of ``n - 1`` (an engine restarting), the
requests arriving in each bucket and how many met the strict and the relaxed SLO. The program
walks the buckets; in a stable split it may stay or start one switch, which spends the target
mode's restart (in whole buckets) with one engine of the source mode down, then lands in the
neighbouring split; one switch at a time, as the planner. It maximises the planner's objective
(``strict_weight * strict + (1 - strict_weight) * relaxed``, in requests) and may start in
any split.

Why an upper bound, roughly: it knows the whole day in advance and chooses each bucket's split
with the outcome of that bucket in hand. Why only roughly: a bucket's outcome is taken from a
run that was in that split all day, so a switch's transients are not priced (the queue a split
hands to the next, an engine's drain, the restarting engine's in-flight requests finishing
elsewhere), and those can cut either way; and the drain before each restart is not counted.
Its schedule replayed in the lab (``Schedule``) gives the realised number next to it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

Counts = Sequence[tuple[int, int, int]]  # per bucket: (arrived, strict, relaxed)
Share = tuple[float, float]  # (strict, relaxed) share of arrivals
MODES = ("baseline", "speculative")


class OraclePlan(NamedTuple):
    value: float  # objective, in requests
    strict: float  # share of all arrivals
    relaxed: float
    start: int  # speculative engines at the start
    moves: tuple[tuple[float, str], ...]  # (seconds, mode switched into)


def oracle(
    full: Mapping[int, Counts],
    short: Mapping[int, Counts],
    n: int,
    bucket: float,
    restart: Mapping[str, float],
    strict_weight: float,
) -> OraclePlan:
    """``full[k]``: counts with k speculative of n up; ``short[k]``: k speculative of n - 1."""
    buckets = len(full[0])
    ws = [strict_weight] * buckets
    wr = [1 - strict_weight] * buckets
    return _best(full, short, n, bucket, restart, ws, wr)


def _best(
    full: Mapping[int, Counts],
    short: Mapping[int, Counts],
    n: int,
    bucket: float,
    restart: Mapping[str, float],
    ws: Sequence[float],
    wr: Sequence[float],
) -> OraclePlan:
    """The program with each bucket's own weights on the strict and relaxed counts."""
    buckets = len(full[0])
    steps = {m: max(1, math.ceil(restart[m] / bucket)) for m in ("speculative", "baseline")}

    def gains(cs: Counts) -> list[float]:
        return [ws[b] * c[1] + wr[b] * c[2] for b, c in enumerate(cs)]

    full_gain = {k: gains(full[k]) for k in range(n + 1)}
    prefix_short = {k: _prefix(gains(short[k])) for k in range(n)}
    value = [[0.0] * (n + 1) for _ in range(buckets + 1)]
    choice: list[list[str | None]] = [[None] * (n + 1) for _ in range(buckets + 1)]
    for b in range(buckets - 1, -1, -1):
        for k in range(n + 1):
            best = full_gain[k][b] + value[b + 1][k]
            pick = None
            for mode in MODES:
                if (mode == "baseline" and k == 0) or (mode == "speculative" and k == n):
                    continue
                during = k - 1 if mode == "baseline" else k  # speculative ones up meanwhile
                after = k - 1 if mode == "baseline" else k + 1
                end = min(buckets, b + steps[mode])
                pre = prefix_short[during]
                got = pre[end] - pre[b] + value[end][after]
                if got > best:
                    best, pick = got, mode
            value[b][k] = best
            choice[b][k] = pick
    start = max(range(n + 1), key=lambda k: value[0][k])
    moves = []
    k, b = start, 0
    strict = relaxed = 0
    while b < buckets:
        pick = choice[b][k]
        if pick is None:
            c = full[k][b]
            strict += c[1]
            relaxed += c[2]
            b += 1
            continue
        moves.append((b * bucket, pick))
        during = k - 1 if pick == "baseline" else k
        end = min(buckets, b + steps[pick])
        for i in range(b, end):
            strict += short[during][i][1]
            relaxed += short[during][i][2]
        k = k - 1 if pick == "baseline" else k + 1
        b = end
    total = sum(c[0] for c in full[0])
    return OraclePlan(value[0][start], strict / total, relaxed / total, start, tuple(moves))


def replay_counts(
    plan: OraclePlan,
    full: Mapping[int, Counts],
    short: Mapping[int, Counts],
    bucket: float,
    restart: Mapping[str, float],
) -> list[tuple[int, int, int]]:
    """Each bucket's counts along ``plan``'s schedule (from the static runs, as the program
    values it)."""
    steps = {m: max(1, math.ceil(restart[m] / bucket)) for m in ("speculative", "baseline")}
    buckets = len(full[0])
    out: list[tuple[int, int, int]] = []
    moves = list(plan.moves)
    k, b = plan.start, 0
    while b < buckets:
        if moves and moves[0][0] <= b * bucket:
            _, mode = moves.pop(0)
            during = k - 1 if mode == "baseline" else k
            end = min(buckets, b + steps[mode])
            out += [tuple(short[during][i]) for i in range(b, end)]  # type: ignore[misc]
            k = k - 1 if mode == "baseline" else k + 1
            b = end
            continue
        out.append(tuple(full[k][b]))  # type: ignore[arg-type]
        b += 1
    return out


def hours_of(counts: Counts, per_hour: int) -> list[tuple[float, float]]:
    """(strict, relaxed) share of each hour's arrivals."""
    out = []
    for h in range(0, len(counts), per_hour):
        cs = counts[h : h + per_hour]
        n = max(1, sum(c[0] for c in cs))
        out.append((sum(c[1] for c in cs) / n, sum(c[2] for c in cs) / n))
    return out


class HourReach(NamedTuple):
    """The per-hour target's reachability by a schedule with the oracle's restart cost."""

    worst: float  # the best schedule found: its worst hour's slack (share; >= -slack meets it)
    worst_oracle: float  # the day's oracle (best objective): its worst hour's slack
    objective: float  # the best-found schedule's day objective (share of arrivals)
    switches: int
    rounds: int


def hour_reach(
    full: Mapping[int, Counts],
    short: Mapping[int, Counts],
    n: int,
    bucket: float,
    restart: Mapping[str, float],
    strict_weight: float,
    hour: float = 3600.0,
    slack: float = 0.03,
    rounds: int = 40,
) -> HourReach:
    """Can any schedule (one switch at a time, the same restarts) keep every hour's strict and
    relaxed goodput within ``slack`` of the better of all-speculative and all-baseline in that
    tier? The program re-weighted per hour and tier: each round doubles the weight of every
    (hour, tier) still short, and the schedule whose worst slack is best is kept. A heuristic
    search (a Lagrangian one), so "not found" is evidence, not proof (``hour_dual`` bounds it
    from above); the hours' targets come from the same static runs the program reads."""
    per = max(1, round(hour / bucket))
    buckets = len(full[0])
    tiers = tier_gaps(full, n, per)
    ws = [strict_weight] * buckets
    wr = [1 - strict_weight] * buckets
    total = sum(c[0] for c in full[0])

    def worst_of(p: OraclePlan) -> tuple[float, list[tuple[float, float]]]:
        got = gaps_of(p, full, short, bucket, restart, per, tiers)
        return min(got), list(zip(got[::2], got[1::2], strict=True))  # (strict, relaxed)

    best_plan: OraclePlan | None = None
    best_worst = worst_oracle = -math.inf
    done = 0
    while done < rounds:
        p = _best(full, short, n, bucket, restart, ws, wr)
        w, gaps = worst_of(p)
        done += 1
        if best_plan is None:
            worst_oracle = w  # the first round is the oracle's own program
        if best_plan is None or w > best_worst:
            best_plan, best_worst = p, w
        if w >= -slack:
            break
        for h, (gs, gr) in enumerate(gaps):
            for b in range(h * per, min(buckets, (h + 1) * per)):
                ws[b] *= 2.0 if gs < -slack else 1.0
                wr[b] *= 2.0 if gr < -slack else 1.0
    assert best_plan is not None
    counts = replay_counts(best_plan, full, short, bucket, restart)
    obj = sum(strict_weight * c[1] + (1 - strict_weight) * c[2] for c in counts) / total
    return HourReach(best_worst, worst_oracle, obj, len(best_plan.moves), done)


class Gap(NamedTuple):
    """One requirement on one hour: ``strict * S + relaxed * R - target >= -slack``, where
    ``S`` and ``R`` are the hour's strict and relaxed shares (a reading of the clause is a list
    of these)."""

    hour: int
    strict: float
    relaxed: float
    target: float
    name: str


def _pure_hours(full: Mapping[int, Counts], n: int, per: int) -> list[tuple[Share, Share]]:
    """Each hour's (strict, relaxed) shares all-speculative and all-baseline."""
    return list(zip(hours_of(full[n], per), hours_of(full[0], per), strict=True))


def _tiers(targets: Iterable[Share]) -> list[Gap]:
    """Each hour's strict and relaxed share against its (strict, relaxed) target, in order."""
    out = []
    for h, (s, r) in enumerate(targets):
        out += [Gap(h, 1.0, 0.0, s, "strict"), Gap(h, 0.0, 1.0, r, "relaxed")]
    return out


def tier_gaps(full: Mapping[int, Counts], n: int, per: int) -> list[Gap]:
    """The clause as written: each tier against the better pure split in that tier."""
    return _tiers((max(a[0], b[0]), max(a[1], b[1])) for a, b in _pure_hours(full, n, per))


def pure_gaps(full: Mapping[int, Counts], n: int, per: int, weight: float) -> list[Gap]:
    """Both tiers against the hour's one pure split with the better objective."""
    return _tiers(
        max(a, b, key=lambda x: weight * x[0] + (1 - weight) * x[1])
        for a, b in _pure_hours(full, n, per)
    )


def objective_gaps(full: Mapping[int, Counts], n: int, per: int, weight: float) -> list[Gap]:
    """The hour's objective against the better pure split's."""
    out = []
    for h, (a, b) in enumerate(_pure_hours(full, n, per)):
        t = max(weight * x[0] + (1 - weight) * x[1] for x in (a, b))
        out.append(Gap(h, weight, 1 - weight, t, "objective"))
    return out


def gaps_of(
    plan: OraclePlan,
    full: Mapping[int, Counts],
    short: Mapping[int, Counts],
    bucket: float,
    restart: Mapping[str, float],
    per: int,
    gaps: Sequence[Gap],
) -> list[float]:
    """Each requirement's gap along ``plan`` (shares)."""
    got = hours_of(replay_counts(plan, full, short, bucket, restart), per)
    return [g.strict * got[g.hour][0] + g.relaxed * got[g.hour][1] - g.target for g in gaps]


def dual_value(
    full: Mapping[int, Counts],
    short: Mapping[int, Counts],
    n: int,
    bucket: float,
    restart: Mapping[str, float],
    per: int,
    gaps: Sequence[Gap],
    mu: Sequence[float],
) -> tuple[float, OraclePlan]:
    """``F(mu)``: the most any schedule of the program gets of the ``mu``-weighted mean of the
    requirements' gaps (shares), and the schedule that gets it. For weights ``mu >= 0``, a
    mean is at least the least of what it averages, so no schedule's worst gap exceeds
    ``F(mu)``: any ``mu`` bounds the reading from above, and ``F(mu) < -slack`` proves no
    schedule of the program meets it. (Exact up to float sums.)"""
    total = sum(mu)
    buckets = len(full[0])
    hours = max(g.hour for g in gaps) + 1
    arrived = [max(1, sum(c[0] for c in full[0][h * per : (h + 1) * per])) for h in range(hours)]
    ws, wr = [0.0] * buckets, [0.0] * buckets
    for g, m in zip(gaps, mu, strict=True):
        for b in range(g.hour * per, min(buckets, (g.hour + 1) * per)):
            ws[b] += m * g.strict / total / arrived[g.hour]
            wr[b] += m * g.relaxed / total / arrived[g.hour]
    p = _best(full, short, n, bucket, restart, ws, wr)
    return p.value - sum(m * g.target for g, m in zip(gaps, mu, strict=True)) / total, p


class HourDual(NamedTuple):
    """A reading of the per-hour clause against every schedule of the program, from above
    and below."""

    bound: float  # no schedule's worst gap exceeds this (share): F at ``weights``
    weights: tuple[float, ...]  # the certificate: one weight per requirement
    found: float  # the best worst gap of the schedules met on the way (one that is reached)
    plan: OraclePlan  # that schedule
    rounds: int


def hour_dual(
    full: Mapping[int, Counts],
    short: Mapping[int, Counts],
    n: int,
    bucket: float,
    restart: Mapping[str, float],
    gaps: Sequence[Gap],
    hour: float = 3600.0,
    rounds: int = 300,
    etas: Sequence[float] = (5.0, 20.0, 80.0),
    digits: int = 4,
) -> HourDual:
    """Search the weights ``mu`` for the lowest ``F(mu)`` (``dual_value``): multiplicative
    weights (``rounds`` at each step size of ``etas``), each round's best schedule raising the
    weight of the requirements it does worst in; then, between every two of the three
    heaviest, a ternary search along the segment (``F`` is convex). The minimum of ``F`` is
    the max-min over mixtures of schedules (LP duality), so the bound is tight up to the
    search and to mixing; the best schedules met give the max-min from below. The
    certificate's weights are rounded to ``digits`` and ``F`` evaluated again at them, so the
    bound is exactly what they give."""
    per = max(1, round(hour / bucket))
    live = [sum(c[0] for c in full[0][g.hour * per : (g.hour + 1) * per]) > 0 for g in gaps]
    best_f, best_mu = math.inf, [0.0] * len(gaps)
    found, found_plan = -math.inf, None

    def value(mu: Sequence[float]) -> tuple[float, list[float]]:
        nonlocal found, found_plan, best_f, best_mu
        f, p = dual_value(full, short, n, bucket, restart, per, gaps, mu)
        if f < best_f:
            best_f, best_mu = f, list(mu)
        got = gaps_of(p, full, short, bucket, restart, per, gaps)
        worst = min(g for g, x in zip(got, live, strict=True) if x)
        if worst > found:
            found, found_plan = worst, p
        return f, got

    for eta in etas:
        mu = [1.0 if x else 0.0 for x in live]
        for _ in range(rounds):
            _, got = value(mu)
            mu = [m * math.exp(-eta * g) for m, g in zip(mu, got, strict=True)]
            total = sum(mu)
            mu = [m / total for m in mu]
    heavy = sorted(range(len(gaps)), key=lambda j: -best_mu[j])[:3]
    for i, j1 in enumerate(heavy):
        for j2 in heavy[i + 1 :]:

            def on(lam: float, j1: int = j1, j2: int = j2) -> float:
                mu = [0.0] * len(gaps)
                mu[j1] += lam
                mu[j2] += 1 - lam
                return value(mu)[0]

            lo, hi = 0.0, 1.0
            for _ in range(40):
                a, b = lo + (hi - lo) / 3, hi - (hi - lo) / 3
                if on(a) <= on(b):
                    hi = b
                else:
                    lo = a
    total = sum(best_mu)
    cert = tuple(round(m / total, digits) for m in best_mu)
    bound, _ = dual_value(full, short, n, bucket, restart, per, gaps, cert)
    assert found_plan is not None
    return HourDual(bound, cert, found, found_plan, len(etas) * rounds)


def neighbours(full: Mapping[int, Counts], pick: Callable[[int, int], int]) -> dict[int, Counts]:
    """Restarting minutes valued from the two splits of ``n`` engines a switch goes between
    (split ``d`` while one engine restarts lies between ``d`` and ``d + 1``), tier by tier:
    ``min`` is an upper bound on the minute if an engine more never hurts (the engines up are
    a subset of either neighbour's), ``max`` a looser one still."""
    return {d: [(a[0], pick(a[1], b[1]), pick(a[2], b[2]))
                for a, b in zip(full[d], full[d + 1], strict=True)]
            for d in range(len(full) - 1)}  # fmt: skip


def _prefix(xs: Sequence[float]) -> list[float]:
    out = [0.0]
    for x in xs:
        out.append(out[-1] + x)
    return out
