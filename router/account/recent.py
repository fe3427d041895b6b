"""The last few minutes of finished requests: share per pool, routing reasons, TTFT and TPOT,
and the share within the SLO (strict and relaxed: ``router.account.objective``).

An ``Outcome`` observer, cheaper than the metrics one: a finished request adds to a few counters
of the time bucket it ended in (O(1), nothing per chunk), and latencies go into log-spaced bins
(5% wide) rather than a list, so memory is bounded by the number of buckets times the number of
bins in use, whatever the request rate. A running total over the closed buckets is kept as
buckets close and expire, so a summary costs O(bins), not O(requests). Read once a second by
the live page (``router.control.feed``) and by ``/router/status``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from router.account.objective import TIERS, within_slo
from router.pools import POOLS, SPECULATIVE

if TYPE_CHECKING:
    from router.account.outcome import Outcome

WINDOW_S = 300.0  # "the last minutes"
BUCKET_S = 5.0
# Latency bins: bin k holds values in [RATIO**k, RATIO**(k+1)) seconds; its estimate is the
# geometric middle, within 2.5% of any value in it.
RATIO = 1.05
_LOG_RATIO = math.log(RATIO)
LATENCIES = ("ttft", "tpot")

Histogram = dict[int, int]
K = TypeVar("K")


def _bin(seconds: float) -> int:
    return math.floor(math.log(max(seconds, 1e-7)) / _LOG_RATIO)


def quantile(hist: Mapping[int, int], q: float) -> float | None:
    """The ``q`` quantile (0..1) of a binned distribution: the middle of the bin it falls in."""
    total = sum(hist.values())
    if total == 0:
        return None
    rank = q * (total - 1)
    seen = 0
    for k in sorted(hist):
        seen += hist[k]
        if seen > rank:
            return float(RATIO ** (k + 0.5))
    return float(RATIO ** (max(hist) + 0.5))  # (not reached: the loop always returns)


def _add(into: dict[K, int], counts: Mapping[K, int], sign: int) -> None:
    for k, n in counts.items():
        left = into.get(k, 0) + sign * n
        if left:
            into[k] = left
        else:
            into.pop(k, None)


# A bucket's counts, in one flat dict: ("n", pool) requests (pool "none": the router refused),
# ("r", pool, reason) routing reasons, ("ttft" | "tpot", pool, bin) latencies, ("j", pool)
# requests judged against the SLO and ("s", pool, tier) those within it. One dict and
# short tuple keys: the cheapest per request, and one way to add and drop whole buckets.
Counts = dict[tuple[Any, ...], int]


@dataclass(slots=True)
class Bucket:
    """Requests that ended in one ``BUCKET_S`` slot."""

    index: int
    counts: Counts = field(default_factory=dict)


def within_document(totals: Mapping[tuple[Any, ...], int]) -> dict[str, Any]:
    """Per pool and over all judged requests (refusals too): how many were judged against the
    SLO, and the share within it at each tier (``router.account.objective``)."""
    doc: dict[str, Any] = {}
    for pool in (*POOLS, "all"):
        judged = sum(
            n for k, n in totals.items() if k[0] == "j" and (pool == "all" or k[1] == pool)
        )
        row: dict[str, Any] = {"judged": judged}
        for tier in TIERS:
            met = sum(
                n
                for k, n in totals.items()
                if k[0] == "s" and k[2] == tier and (pool == "all" or k[1] == pool)
            )
            row[tier] = round(met / judged, 4) if judged else None
        doc[pool] = row
    return doc


class RecentWindow:
    def __init__(
        self,
        clock: Callable[[], float],
        window: float = WINDOW_S,
        bucket: float = BUCKET_S,
        slo: tuple[float, float] = (1.0, 0.025),
    ) -> None:
        self.clock = clock
        self.slo = slo  # TTFT, TPOT (s) a request without its own is judged against
        self.bucket = bucket
        self.slots = max(1, round(window / bucket))
        # every bucket in the window but the newest, which requests are still landing in, is
        # summed in _closed: adding a request touches the newest bucket only
        self._buckets: deque[Bucket] = deque()
        self._closed: Counts = {}

    @property
    def window(self) -> float:
        return self.slots * self.bucket

    # -- input (per finished request) -------------------------------------------------------
    def observe(self, out: Outcome) -> None:
        """Outcome observer: count the request in the bucket of the time it ended."""
        index = int(out.ended // self.bucket)
        buckets = self._buckets
        # (a request that ended a moment before the last one counted still lands there)
        c = buckets[-1].counts if buckets and buckets[-1].index >= index else self._open(index)
        pool = out.pool
        attained = within_slo(out, *self.slo)
        if attained is not None:
            judged = pool or "none"
            key: tuple[Any, ...] = ("j", judged)
            c[key] = c.get(key, 0) + 1
            if attained.strict:
                key = ("s", judged, "strict")
                c[key] = c.get(key, 0) + 1
            if attained.relaxed:
                key = ("s", judged, "relaxed")
                c[key] = c.get(key, 0) + 1
        if pool is None:
            key = ("n", "none")
            c[key] = c.get(key, 0) + 1
            return
        key = ("n", pool)
        c[key] = c.get(key, 0) + 1
        key = ("r", pool, out.reason)
        c[key] = c.get(key, 0) + 1
        first = out.first_byte
        if not out.stream or first is None or out.status >= 400:
            return  # (as the metrics: a non-streamed answer's first byte is not a TTFT)
        key = ("ttft", pool, _bin(first - out.started))
        c[key] = c.get(key, 0) + 1
        usage = out.usage
        if usage is not None and usage.completion_tokens > 1:
            key = ("tpot", pool, _bin((out.ended - first) / (usage.completion_tokens - 1)))
            c[key] = c.get(key, 0) + 1

    def _open(self, index: int) -> Counts:
        buckets = self._buckets
        if buckets:
            _add(self._closed, buckets[-1].counts, 1)
        b = Bucket(index)
        buckets.append(b)
        self._expire(index)
        return b.counts

    def _expire(self, index: int) -> None:
        """Drop the buckets that fell out of the window ending at bucket ``index``."""
        buckets = self._buckets
        while buckets and buckets[0].index <= index - self.slots:
            old = buckets.popleft()
            if buckets:  # (the newest is never in _closed)
                _add(self._closed, old.counts, -1)

    def _totals(self) -> Counts:
        self._expire(int(self.clock() // self.bucket))
        totals = dict(self._closed)
        if self._buckets:
            _add(totals, self._buckets[-1].counts, 1)
        return totals

    # -- output (once a second at most) -------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Counts, the share routed to speculative, reasons, TTFT/TPOT p50/p90 (ms) by pool."""
        requests: dict[str, int] = {}
        reasons: dict[str, dict[str, int]] = {p: {} for p in POOLS}
        hists: dict[tuple[str, str], Histogram] = {}
        totals = self._totals()
        for key, n in totals.items():
            if key[0] == "n":
                requests[key[1]] = n
            elif key[0] == "r":
                reasons.setdefault(key[1], {})[key[2]] = n
            elif key[0] in LATENCIES:
                hists.setdefault((key[1], key[0]), {})[key[2]] = n
        routed = sum(requests.get(p, 0) for p in POOLS)
        latency: dict[str, dict[str, float | int | None]] = {}
        for pool in POOLS:
            row: dict[str, float | int | None] = {}
            for kind in LATENCIES:
                hist = hists.get((pool, kind), {})
                row[f"{kind}_n"] = sum(hist.values())
                for q in (50, 90):
                    value = quantile(hist, q / 100)
                    row[f"{kind}_p{q}_ms"] = None if value is None else round(value * 1000, 3)
            latency[pool] = row
        return {
            "window_s": self.window,
            "requests": dict(sorted(requests.items())),
            "share_speculative": (
                round(requests.get(SPECULATIVE, 0) / routed, 3) if routed else None
            ),
            "reasons": {p: dict(sorted(r.items())) for p, r in reasons.items()},
            "latency": latency,
            "within_slo": within_document(totals),
        }

    def series(self) -> dict[str, Any]:
        """Requests per bucket by pool over the window, oldest first (empty buckets as 0);
        ``t`` is each bucket's start in seconds before now (negative)."""
        now = self.clock()
        last = int(now // self.bucket)
        self._expire(last)
        by_index = {b.index: b.counts for b in self._buckets}
        out: dict[str, Any] = {"bucket_s": self.bucket, "t": []}
        p90: dict[str, dict[str, list[float | None]]] = {
            f"{kind}_p90_ms": {pool: [] for pool in POOLS} for kind in LATENCIES
        }
        within: dict[str, list[float | None]] = {tier: [] for tier in TIERS}
        for pool in POOLS:
            out[pool] = []
        for index in range(last - self.slots + 1, last + 1):
            out["t"].append(round(index * self.bucket - now, 3))
            counts = by_index.get(index, {})
            for pool in POOLS:
                out[pool].append(counts.get(("n", pool), 0))
                for kind in LATENCIES:
                    hist = {k[2]: n for k, n in counts.items() if k[0] == kind and k[1] == pool}
                    value = quantile(hist, 0.9)
                    p90[f"{kind}_p90_ms"][pool].append(
                        None if value is None else round(value * 1000, 3)
                    )
            judged = sum(n for k, n in counts.items() if k[0] == "j")
            for tier in TIERS:
                met = sum(n for k, n in counts.items() if k[0] == "s" and k[2] == tier)
                within[tier].append(round(met / judged, 4) if judged else None)
        return {**out, **p90, "within_slo": within}
