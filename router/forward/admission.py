"""The bounded router-side queue for requests no backend can serve within their SLO, held
only under measured overload.

Off by default (``QUEUE_SIZE=0``; 64 is what was measured). A request the ``slo`` policy
routes as ``overflow`` (no engine has room for it within even the relaxed SLO by the curves)
waits here only when the overload is measured, not merely predicted (``holds``):

- the engine it would go to is past the relaxed SLO by what the router measured of its recent
  requests (``Strain``: at least half of them, by a decayed count, missed the relaxed TTFT or
  TPOT of the router's own SLO); an engine whose measured latency is fine is never queued
  against, whatever the table says of its capacity;
- and the engines' capacity is steady (``steady``, given by the app: every engine usable, none
  loading or draining, no planned switch under way): capacity on its way is not a reason to
  answer 503.

Otherwise it goes to that engine as before. A held request waits until a request in flight ends
and a new decision admits it (or its engine's measured latency is fine again), or its deadline
passes: ``QUEUE_TIMEOUT``, by default the request's own strict TTFT target, so that a request
admitted at its deadline still has twice that for its prefill within the relaxed TTFT; then 503
with ``Retry-After``. A full queue answers 429 at once. Waiters are woken oldest first, one per
released request; each place in the queue is given back on every path (admitted, timed out,
client gone, cancelled), and ``queued`` is exact.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from router.account.outcome import Outcome
from router.decide.capacity import RELAXED_TPOT, RELAXED_TTFT
from router.errors import QueueFull

# What ``meter`` is told: a place taken (+1) or given back (-1) as "queued", each way out, and
# each overflowing request sent on unheld ("sent_fine", "sent_changing").
Meter = Callable[[str, int], None]

# An engine is past the relaxed SLO (measured) when, of its requests that ended lately (weights
# halving every HALF_LIFE relaxed TTFTs of the router's SLO) and those in flight already past
# the relaxed TTFT without a first byte, at least SEEN were judged and at least SHARE of them
# missed the relaxed TTFT or TPOT.
HALF_LIFE = 2.0
SEEN = 2.0
SHARE = 0.5
# A verdict is reused for this many strict TTFTs (waiters look again every 50 ms).
KEEP = 0.02

# What /router/status says the queue does.
RULE = (
    "a request no engine has room for within the relaxed SLO (slo rule, step 3) waits here "
    "only while the engine it would go to is measured past the relaxed SLO (strained: at "
    "least half of its recent requests missed it) and every engine is usable, none loading, "
    "draining or switching; up to timeout_s (null: the request's strict TTFT target), then "
    "503; 429 when full. Otherwise it is sent on at once (sent_fine, sent_changing)"
)


class Strain:
    """What the router measured of each engine lately, against the relaxed tier of each
    request's SLO (its own ``x-slo-*`` headers, else the router's ``SLO_TTFT_MS`` and
    ``SLO_TPOT_MS``): its requests as they end (a miss: TTFT or TPOT past it; TTFT is judged
    only for a request that did not wait in the queue, whose TTFT counts its wait), and its
    requests in flight that have waited past the relaxed TTFT for their first byte (a miss
    known before they end: what an engine's own queue looks like from here). A request that
    failed or whose client left says nothing of latency. Counts of ended requests decay with
    time, so an engine nothing ends on lately is not strained by its past.

    ``flights``: the requests in flight per backend (``InflightTracker.flights``: their
    ``Outcome``), None where the first byte is not seen (the gateway's EPP)."""

    def __init__(
        self,
        slo_ttft: float,
        slo_tpot: float,
        clock: Callable[[], float],
        flights: Mapping[str, Mapping[Any, object]] | None = None,
    ) -> None:
        self.slo_ttft, self.slo_tpot = slo_ttft, slo_tpot
        self.half_life = HALF_LIFE * slo_ttft * RELAXED_TTFT
        self.clock = clock
        self.flights = flights
        self._seen: dict[str, tuple[float, float, float]] = {}  # url -> (judged, missed, at)
        # url -> (until, verdict): a verdict is kept for a moment (waiters look every 50 ms)
        self._kept: dict[str, tuple[float, bool]] = {}

    def _targets(self, out: Outcome) -> tuple[float, float]:
        req = out.request
        ttft, tpot = (self.slo_ttft, self.slo_tpot) if req is None else (req.slo_ttft, req.slo_tpot)
        return ttft * RELAXED_TTFT, tpot * RELAXED_TPOT

    def observe(self, out: Outcome) -> None:
        """An ``Outcome`` observer: a request ended."""
        url, first = out.backend, out.first_byte
        if url is None or first is None or not out.stream or out.client_gone:
            return
        if out.status != 200 or out.error is not None:
            return
        ttft, tpot = self._targets(out)
        missed = not out.was_queued and first - out.started > ttft
        usage = out.usage
        if not missed and usage is not None and usage.completion_tokens > 1:
            missed = (out.ended - first) / (usage.completion_tokens - 1) > tpot
        now = self.clock()
        judged, miss = self._ended(url, now)
        self._seen[url] = (judged + 1.0, miss + (1.0 if missed else 0.0), now)
        self._kept.pop(url, None)

    def _ended(self, url: str, now: float) -> tuple[float, float]:
        seen = self._seen.get(url)
        if seen is None:
            return 0.0, 0.0
        judged, missed, at = seen
        decay = 0.5 ** (max(0.0, now - at) / self.half_life)
        return judged * decay, missed * decay

    def _late(self, url: str, now: float) -> int:
        """Requests in flight on ``url`` still without a first byte past the relaxed TTFT."""
        flights = None if self.flights is None else self.flights.get(url)
        if not flights:
            return 0
        late = 0
        for out in flights.values():
            if (
                isinstance(out, Outcome)
                and out.stream
                and out.first_byte is None
                and not out.was_queued
                and now - out.started > self._targets(out)[0]
            ):
                late += 1
        return late

    def counts(self, url: str) -> tuple[float, float]:
        """(judged, missed) on ``url`` now."""
        now = self.clock()
        judged, missed = self._ended(url, now)
        late = self._late(url, now)
        return judged + late, missed + late

    def strained(self, url: str) -> bool:
        now = self.clock()
        kept = self._kept.get(url)
        if kept is not None and now < kept[0]:
            return kept[1]
        judged, missed = self.counts(url)
        verdict = judged >= SEEN and missed >= SHARE * judged
        self._kept[url] = (now + KEEP * self.slo_ttft, verdict)
        return verdict

    def forget(self, url: str) -> None:
        """The backend left (a new one at the same URL starts unmeasured)."""
        self._seen.pop(url, None)
        self._kept.pop(url, None)

    def status(self) -> dict[str, dict[str, Any]]:
        out = {}
        urls = set(self._seen) | set(u for u, f in (self.flights or {}).items() if f)
        for url in sorted(urls):
            judged, missed = self.counts(url)
            if judged <= 0:
                continue
            out[url] = {
                "judged": round(judged, 2),
                "missed_share": round(missed / judged, 3),
                "strained": judged >= SEEN and missed >= SHARE * judged,
            }
        return out


class Admission:
    def __init__(
        self,
        size: int,
        meter: Meter | None = None,
        strain: Strain | None = None,
        steady: Callable[[], bool] | None = None,
        timeout: float | None = None,
    ) -> None:
        """``meter``: for metrics kept outside this object (under ``serve --workers``, one
        file per worker that prometheus-client merges); single-process metrics read the
        counts below at scrape time instead. ``strain``: the measured latencies a request is
        held on (None: every overflowing request is held, as in the lab's old runs);
        ``steady``: whether the engines' capacity is steady (None: always); ``timeout``: the
        deadline in seconds, as shown (None: each request's strict TTFT target)."""
        self.size = size
        self.meter = meter
        self.strain = strain
        self.steady = steady
        self.timeout = timeout
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.queued = 0  # requests holding a place now
        self.admitted = 0  # that left the queue for a backend
        self.timed_out = 0
        self.full = 0  # refused because the queue was full
        self.sent_fine = 0  # overflowing, sent on: its engine's measured latency is fine
        self.sent_changing = 0  # overflowing, sent on: capacity loading or switching

    @property
    def enabled(self) -> bool:
        return self.size > 0

    def holds(self, backend: str) -> bool:
        """Whether an overflowing request the policy sends to ``backend`` waits here (counted
        when not: ``sent_fine``, ``sent_changing``)."""
        if self.size <= 0:
            return False
        why = self._unheld(backend)
        if why is None:
            return True
        if why == "sent_fine":
            self.sent_fine += 1
        else:
            self.sent_changing += 1
        if self.meter is not None:
            self.meter(why, 1)
        return False

    def still_holds(self, backend: str) -> bool:
        """``holds`` for a request already waiting (counts nothing)."""
        return self._unheld(backend) is None

    def _unheld(self, backend: str) -> str | None:
        if self.steady is not None and not self.steady():
            return "sent_changing"
        if self.strain is not None and not self.strain.strained(backend):
            return "sent_fine"
        return None

    def enter(self, retry_after: int) -> None:
        """Take a place; the caller must ``leave()`` on every path. A full queue raises
        ``QueueFull`` (429, with ``retry_after``)."""
        meter = self.meter
        if self.queued >= self.size:
            self.full += 1
            if meter is not None:
                meter("refused_full", 1)
            raise QueueFull("the router's queue is full", retry_after)
        self.queued += 1
        if meter is not None:
            meter("queued", 1)

    def leave(self, admitted: bool) -> None:
        self.queued -= 1
        if admitted:
            self.admitted += 1
        if self.meter is not None:
            self.meter("queued", -1)
            if admitted:
                self.meter("admitted", 1)

    def time_out(self) -> None:
        """A waiter's deadline passed (it still ``leave()``s)."""
        self.timed_out += 1
        if self.meter is not None:
            self.meter("timed_out", 1)

    async def wait(self, timeout: float, again: bool = False) -> bool:
        """Wait for a request in flight to end; False when ``timeout`` passed first. ``again``:
        woken before but not admitted, it keeps its place at the head of the queue."""
        waiter = asyncio.get_running_loop().create_future()
        if again:
            self._waiters.appendleft(waiter)
        else:
            self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
            return True
        except TimeoutError:
            return False
        finally:
            if not waiter.done():
                waiter.cancel()
            try:
                self._waiters.remove(waiter)
            except ValueError:
                pass

    def released(self) -> None:
        """A request in flight ended: the oldest waiter may try again."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def status(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "timeout_s": self.timeout,
            "queued": self.queued,
            "admitted": self.admitted,
            "timed_out": self.timed_out,
            "refused_full": self.full,
            "sent_fine": self.sent_fine,
            "sent_changing": self.sent_changing,
            "steady": None if self.steady is None else self.steady(),
            "engines": None if self.strain is None else self.strain.status(),
            "rule": RULE,
        }
