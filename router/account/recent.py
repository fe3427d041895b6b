"""The last few minutes of finished requests: share per pool, routing reasons, TTFT and TPOT.

An ``Outcome`` observer, as cheap as the metrics one: a finished request adds to a few counters
of the time bucket it ended in (O(1), nothing per chunk), and latencies go into log-spaced bins
(5% wide) rather than a list, so memory is bounded by the number of buckets times the number of
bins in use, whatever the request rate. Running totals over the live buckets are kept as buckets
are added and dropped, so a summary costs O(bins), not O(requests). Read once a second by the
live page (``router.control.feed``) and by ``/router/status``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

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


@dataclass(slots=True)
class Bucket:
    """Requests that ended in one ``BUCKET_S`` slot."""

    index: int
    requests: dict[str, int] = field(default_factory=dict)  # by pool ("none": router refused)
    reasons: dict[tuple[str, str], int] = field(default_factory=dict)  # (pool, reason)
    latency: dict[tuple[str, str], Histogram] = field(default_factory=dict)  # (pool, kind)


class RecentWindow:
    def __init__(
        self,
        clock: Callable[[], float],
        window: float = WINDOW_S,
        bucket: float = BUCKET_S,
    ) -> None:
        self.clock = clock
        self.bucket = bucket
        self.slots = max(1, round(window / bucket))
        self._buckets: deque[Bucket] = deque()
        self._requests: dict[str, int] = {}
        self._reasons: dict[tuple[str, str], int] = {}
        self._latency: dict[tuple[str, str], Histogram] = {}

    @property
    def window(self) -> float:
        return self.slots * self.bucket

    # -- input (per finished request) -------------------------------------------------------
    def observe(self, out: Outcome) -> None:
        """Outcome observer: count the request in the bucket of the time it ended."""
        b = self._current(int(out.ended // self.bucket))
        pool = out.pool or "none"
        b.requests[pool] = b.requests.get(pool, 0) + 1
        self._requests[pool] = self._requests.get(pool, 0) + 1
        if out.pool is None:
            return
        key = (pool, out.reason)
        b.reasons[key] = b.reasons.get(key, 0) + 1
        self._reasons[key] = self._reasons.get(key, 0) + 1
        first = out.first_byte
        if not out.stream or first is None or out.status >= 400:
            return  # (as the metrics: a non-streamed answer's first byte is not a TTFT)
        self._record(b, pool, "ttft", first - out.started)
        usage = out.usage
        if usage is not None and usage.completion_tokens > 1:
            self._record(b, pool, "tpot", (out.ended - first) / (usage.completion_tokens - 1))

    def _record(self, b: Bucket, pool: str, kind: str, seconds: float) -> None:
        k = _bin(seconds)
        hist = b.latency.setdefault((pool, kind), {})
        hist[k] = hist.get(k, 0) + 1
        total = self._latency.setdefault((pool, kind), {})
        total[k] = total.get(k, 0) + 1

    def _current(self, index: int) -> Bucket:
        buckets = self._buckets
        if buckets and buckets[-1].index >= index:
            # (a request that ended a moment before the last one counted still lands here)
            return buckets[-1]
        self._expire(index)
        b = Bucket(index)
        buckets.append(b)
        return b

    def _expire(self, index: int) -> None:
        """Drop the buckets that fell out of the window ending at bucket ``index``."""
        buckets = self._buckets
        while buckets and buckets[0].index <= index - self.slots:
            old = buckets.popleft()
            _add(self._requests, old.requests, -1)
            _add(self._reasons, old.reasons, -1)
            for key, hist in old.latency.items():
                total = self._latency[key]
                _add(total, hist, -1)
                if not total:
                    del self._latency[key]

    # -- output (once a second at most) -------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Counts, the share routed to speculative, reasons, TTFT/TPOT p50/p90 (ms) by pool."""
        self._expire(int(self.clock() // self.bucket))
        routed = sum(self._requests.get(p, 0) for p in POOLS)
        spec = self._requests.get(SPECULATIVE, 0)
        reasons: dict[str, dict[str, int]] = {p: {} for p in POOLS}
        for (pool, reason), n in sorted(self._reasons.items()):
            reasons.setdefault(pool, {})[reason] = n
        latency: dict[str, dict[str, float | int | None]] = {}
        for pool in POOLS:
            row: dict[str, float | int | None] = {}
            for kind in LATENCIES:
                hist = self._latency.get((pool, kind), {})
                row[f"{kind}_n"] = sum(hist.values())
                for q in (50, 90):
                    value = quantile(hist, q / 100)
                    row[f"{kind}_p{q}_ms"] = None if value is None else round(value * 1000, 3)
            latency[pool] = row
        return {
            "window_s": self.window,
            "requests": dict(sorted(self._requests.items())),
            "share_speculative": round(spec / routed, 3) if routed else None,
            "reasons": reasons,
            "latency": latency,
        }

    def series(self) -> dict[str, Any]:
        """Requests per bucket by pool over the window, oldest first (empty buckets as 0);
        ``t`` is each bucket's start in seconds before now (negative)."""
        now = self.clock()
        last = int(now // self.bucket)
        self._expire(last)
        by_index = {b.index: b for b in self._buckets}
        out: dict[str, Any] = {"bucket_s": self.bucket, "t": []}
        for pool in POOLS:
            out[pool] = []
        for index in range(last - self.slots + 1, last + 1):
            out["t"].append(round(index * self.bucket - now, 3))
            b = by_index.get(index)
            for pool in POOLS:
                out[pool].append(0 if b is None else b.requests.get(pool, 0))
        return out
