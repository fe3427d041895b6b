"""The fleet run's score: the summary and per-hour buckets of ``spec-router fleet``. Pure.

Requests are scored as the replay scores them (``router.tools.goodput``: a request meets an
SLO when it ended well with its TTFT and TPOT within it, in the engines' model time). A
request belongs to the bucket its arrival falls in. Switches and out-of-service time come from
the actuator's outages: ``(engine, left, back, into)`` in day seconds, ``back`` None for an
engine still out when the run ended (counted to the end). ``tok_s`` is output tokens of the
requests that succeeded per second of the engines' clock; ``restart_engine_s`` is
engine-seconds out of service, on the day's clock (the one ``--restart-s`` is given in).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from router.tools.goodput import RELAXED, STRICT, Result

HOUR = 3600.0


class Outage(NamedTuple):
    """An engine out of service for a switch: from when it left its pool until it served in
    the other (day seconds)."""

    engine: str
    left: float
    back: float | None
    into: str
    in_flight: int = 0  # requests the router had on it when it left (the drain lets them end)


def _score(results: Sequence[Result], engine_seconds: float) -> dict[str, Any]:
    n = len(results)
    tokens = sum(r.output_tokens or 0 for r in results if r.ok)
    return {
        "requests": n,
        "ok": sum(r.ok for r in results),
        "goodput_strict": sum(r.meets(STRICT) for r in results) / n if n else math.nan,
        "goodput_relaxed": sum(r.meets(RELAXED) for r in results) / n if n else math.nan,
        "tok_s": tokens / engine_seconds if engine_seconds > 0 else math.nan,
        "speculative_share": (
            sum(r.pool == "speculative" for r in results if r.ok)
            / max(1, sum(r.ok for r in results))
        ),
    }


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def summarize(
    results: Sequence[Result],
    outages: Sequence[Outage],
    day_seconds: float,
    compress: float,
    bucket: float = HOUR,
) -> dict[str, Any]:
    """The whole run and each ``bucket`` of the day (day seconds): goodput in both tiers, tok/s,
    switches begun, engine-seconds out of service."""
    closed = [(o.left, day_seconds if o.back is None else o.back) for o in outages]
    out = _score(results, day_seconds / compress)
    out["switches"] = len(outages)
    out["switches_landed"] = sum(o.back is not None for o in outages)
    out["restart_engine_s"] = sum(max(0.0, b - a) for a, b in closed)
    buckets = []
    n = max(1, math.ceil(day_seconds / bucket - 1e-9))
    for i in range(n):
        lo, hi = i * bucket, min(day_seconds, (i + 1) * bucket)
        mine = [r for r in results if lo <= r.arrival.at * compress < hi]
        row = {"start_h": lo / HOUR, "end_h": hi / HOUR}
        row.update(_score(mine, (hi - lo) / compress))
        row["switches"] = sum(lo <= o.left < hi for o in outages)
        row["restart_engine_s"] = sum(_overlap(a, b, lo, hi) for a, b in closed)
        buckets.append(row)
    out["buckets"] = buckets
    return out
