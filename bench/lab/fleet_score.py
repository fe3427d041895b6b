"""Scoring the fleet lab's runs: goodput under the strict and relaxed SLO, tokens per second.

A request meets the strict SLO with TTFT <= 1 s and TPOT <= 25 ms, the relaxed one with
3 s and 50 ms (the router's defaults and its relaxed tier); a dropped request meets neither.
Shares are of the requests that *arrived* in the span scored; tok/s counts their output tokens
over the span.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from fleet_engine import Req

from router.plan import Slo

SLO = Slo()


class Score(NamedTuple):
    strict: float
    relaxed: float
    tok_s: float
    n: int


def meets(r: Req, slo: Slo = SLO) -> tuple[bool, bool]:
    if r.dropped or r.last != r.last:  # NaN: never finished
        return False, False
    ttft, tpot = r.ttft, r.tpot
    strict = ttft <= slo.ttft and tpot <= slo.tpot
    relaxed = ttft <= slo.ttft * slo.relaxed_ttft and tpot <= slo.tpot * slo.relaxed_tpot
    return strict, relaxed


def score(reqs: Sequence[Req], start: float, end: float) -> Score:
    rs = [r for r in reqs if start <= r.at < end]
    if not rs:
        return Score(float("nan"), float("nan"), 0.0, 0)
    strict = relaxed = tokens = 0
    for r in rs:
        s, x = meets(r)
        strict += s
        relaxed += x
        if not r.dropped:
            tokens += r.output
    return Score(strict / len(rs), relaxed / len(rs), tokens / (end - start), len(rs))


def buckets(reqs: Sequence[Req], duration: float, size: float) -> list[Score]:
    n = max(1, round(duration / size))
    return [score(reqs, i * size, (i + 1) * size) for i in range(n)]


def per_bucket_good(reqs: Sequence[Req], duration: float, size: float
                    ) -> list[tuple[int, int, int]]:  # fmt: skip
    """(arrived, strict, relaxed) counts per bucket of ``size`` seconds, by arrival."""
    n = max(1, round(duration / size))
    out = [[0, 0, 0] for _ in range(n)]
    for r in reqs:
        i = min(n - 1, int(r.at // size))
        s, x = meets(r)
        out[i][0] += 1
        out[i][1] += s
        out[i][2] += x
    return [(a, b, c) for a, b, c in out]
