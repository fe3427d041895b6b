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
    steps = {m: max(1, math.ceil(restart[m] / bucket)) for m in ("speculative", "baseline")}

    def gain(c: tuple[int, int, int]) -> float:
        return strict_weight * c[1] + (1 - strict_weight) * c[2]

    prefix_short = {k: _prefix([gain(c) for c in short[k]]) for k in range(n)}
    value = [[0.0] * (n + 1) for _ in range(buckets + 1)]
    choice: list[list[str | None]] = [[None] * (n + 1) for _ in range(buckets + 1)]
    for b in range(buckets - 1, -1, -1):
        for k in range(n + 1):
            best = gain(full[k][b]) + value[b + 1][k]
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


def _prefix(xs: Sequence[float]) -> list[float]:
    out = [0.0]
    for x in xs:
        out.append(out[-1] + x)
    return out
