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
from collections.abc import Mapping, Sequence
from typing import NamedTuple

Counts = Sequence[tuple[int, int, int]]  # per bucket: (arrived, strict, relaxed)
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
    search (a Lagrangian one), so "not found" is evidence, not proof; the hours' targets come
    from the same static runs the program reads."""
    per = max(1, round(hour / bucket))
    buckets = len(full[0])
    spec, base = hours_of(full[n], per), hours_of(full[0], per)
    target = [(max(a[0], b[0]), max(a[1], b[1])) for a, b in zip(spec, base, strict=True)]
    ws = [strict_weight] * buckets
    wr = [1 - strict_weight] * buckets
    total = sum(c[0] for c in full[0])

    def worst_of(p: OraclePlan) -> tuple[float, list[tuple[float, float]]]:
        got = hours_of(replay_counts(p, full, short, bucket, restart), per)
        gaps = [(g[0] - t[0], g[1] - t[1]) for g, t in zip(got, target, strict=True)]
        return min(min(g) for g in gaps), gaps

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


def _prefix(xs: Sequence[float]) -> list[float]:
    out = [0.0]
    for x in xs:
        out.append(out[-1] + x)
    return out
