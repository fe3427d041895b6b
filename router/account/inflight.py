"""Exact in-flight accounting: counts per pool and per backend, and the lease that holds one.

A lease is taken when a request has been routed and released exactly once when its last byte
was sent or its client went away. ``release()`` is idempotent so that a ``finally`` can always
call it; counts are never clamped, so a leak would show instead of hiding.

Readers see the counts through mappings (``by_backend``, ``by_pool``, ``started``,
``slow_clients``) and ``area``; leases change them through four methods (``_open``, ``_move``,
``_close``, ``_slow``). Here those are plain dicts of this process; under ``serve --workers N``
``router.account.shared.SharedTracker`` keeps the same interface over a table every worker
writes its own slot of, so the same readers see machine-wide counts.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping

from mypy_extensions import mypyc_attr

from router.pools import POOLS, Pool

# Wall seconds within which the first tokens of one engine iteration reach the router: first
# tokens this close to a request's own came from its own prefill iteration, not a later one.
MATES = 0.005


# prefill entries a PrefillLog keeps, at least (and at most twice as many)
KEEP = 16_384


class PrefillLog:
    """Seconds of prefill against the time each ran (its request's first token), cumulative, so
    the prefill between two times is a difference; the last ``KEEP`` to ``2 * KEEP`` entries are
    kept (a lookup from before them counts from the oldest kept)."""

    __slots__ = ("times", "totals", "total", "base", "keep")

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep  # (KEEP; a test keeps fewer)
        self.times: list[float] = []
        self.totals: list[float] = []
        self.total = 0.0
        self.base = 0.0  # the total before the first entry kept

    def add(self, now: float, seconds: float) -> None:
        self.total += seconds
        self.times.append(now)
        self.totals.append(self.total)
        keep = self.keep
        if len(self.times) > 2 * keep:
            self.base = self.totals[-keep - 1]
            del self.times[:-keep], self.totals[:-keep]

    def at(self, t: float) -> float:
        i = bisect.bisect_right(self.times, t)
        return self.totals[i - 1] if i else self.base

    def between(self, start: float, end: float) -> float:
        return max(0.0, self.at(end) - self.at(start))

    def stalls(self, first: float, per_token: float, end: float) -> float:
        """The prefill that stalled a decode from ``first`` (its first token) to ``end``, at
        ``per_token`` seconds per token: the prefills whose first token came after its own,
        past ``MATES`` (not the ones prefilled with it), and by its end."""
        return self.between(first + min(per_token / 2, MATES), end)


# (router.account.shared's SharedTracker, the counts of all workers, is an interpreted subclass:
# allowed explicitly where this module is compiled, router.compiled)
@mypyc_attr(allow_interpreted_subclasses=True)
class InflightTracker:
    # What readers see (the machine-wide view, under --workers):
    by_backend: Mapping[str, int]  # requests in flight per backend
    by_pool: Mapping[str, int]
    started: Mapping[str, int]  # requests ever sent to each backend (monotonic)
    # of those in flight, responses held back by a client that reads slower than the engine
    # writes (the router buffers a little, then stops reading from the engine)
    slow_clients: Mapping[str, int]
    # this process's own in flight per backend (the same as ``by_backend`` with one process)
    own_by_backend: Mapping[str, int]

    def __init__(
        self, backends: Iterable[tuple[Pool, str]], clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``backends``: (pool, url) pairs."""
        self.clock = clock
        self.pool_of: dict[str, Pool] = {}
        self._in: dict[str, int] = {}
        self._started: dict[str, int] = {}
        # in-flight x seconds per backend, so a request's mean concurrency is a difference
        self._area: dict[str, float] = {}
        self._since: dict[str, float] = {}
        # prefill time (model seconds, as the slo policy estimated it) of this process's requests
        # whose first token came from each backend, against when: a request's stalls are the
        # prefills that ran while it decoded
        self._begun: dict[str, PrefillLog] = {}
        self._pool: dict[str, int] = dict.fromkeys(POOLS, 0)
        self._slow: dict[str, int] = dict.fromkeys(POOLS, 0)
        self._total = 0
        self.by_backend = self.own_by_backend = self._in
        self.by_pool = self._pool
        self.started = self._started
        self.slow_clients = self._slow
        # requests whose client left but which the engine still runs for a moment (SGLang
        # aborts them 2-4 s later): when each stops counting against its backend's load.
        # (This process's own, under --workers too.)
        self._lingering: dict[str, deque[float]] = {}
        # how many entries those hold, over every backend (0: no backend's load needs a look)
        self.lingered = 0
        # What this process knows of each of its requests in flight, by backend (for the slo
        # policy: router.account.outcome.Outcome; opaque here). Only leases given one appear.
        self.flights: dict[str, dict[Lease, object]] = {}
        for pool, url in backends:
            self.add(pool, url)

    def add(self, pool: Pool, url: str) -> None:
        """A backend that joined: its counts start at 0 (a comeback starts fresh too)."""
        self.pool_of[url] = pool
        self._in[url] = 0
        self._started[url] = 0
        self._area[url] = 0.0
        self._since[url] = self.clock()
        self._begun[url] = PrefillLog()
        self._lingering[url] = deque()
        self.flights[url] = {}

    def remove(self, url: str) -> None:
        """A backend that left, once nothing is in flight there: its counts are dropped."""
        held = self.by_backend.get(url, 0)
        if held:
            raise ValueError(f"{url} still has {held} request(s) in flight")
        self._in.pop(url, None)
        self._started.pop(url, None)
        self._area.pop(url, None)
        self._since.pop(url, None)
        self._begun.pop(url, None)
        self.lingered -= len(self._lingering.pop(url, ()))
        self.flights.pop(url, None)
        self.pool_of.pop(url, None)

    @property
    def total(self) -> int:
        return self._total

    def area(self, backend: str, now: float) -> float:
        """The integral of ``by_backend[backend]`` over time, up to ``now``."""
        return self._area[backend] + self._in[backend] * (now - self._since[backend])

    def prefilled(self, backend: str, now: float, seconds: float) -> None:
        """A request's first token came from ``backend``: its prefill (``seconds``) ran there."""
        self._begun[backend].add(now, seconds)

    def stalls(self, backend: str, first: float, per_token: float, end: float) -> float:
        """The prefill time that stalled a decode on ``backend`` (``PrefillLog.stalls``)."""
        return self._begun[backend].stalls(first, per_token, end)

    def linger(self, backend: str, until: float) -> None:
        """A released request still occupies its engine until ``until``."""
        queue = self._lingering[backend]
        self.lingered += 1
        if queue and queue[-1] > until:  # (kept in order: one lag, so nearly always appended)
            queue.append(until)
            self._lingering[backend] = deque(sorted(queue))
        else:
            queue.append(until)

    def lingering(self, backend: str, now: float) -> int:
        """Requests released from ``backend`` that its engine is still running at ``now``."""
        queue = self._lingering[backend]
        while queue and queue[0] <= now:
            queue.popleft()
            self.lingered -= 1
        return len(queue)

    def lingering_left(self, backend: str, now: float) -> tuple[float, ...]:
        """How much longer (seconds) each of those will run there."""
        self.lingering(backend, now)
        return tuple([until - now for until in self._lingering[backend]])

    def acquire(self, backend: str, what: object = None) -> Lease:
        """Count a request on ``backend``; ``what`` (if any) is listed in ``flights`` there
        while the lease holds."""
        return Lease(self, backend, what)

    def snapshot(self) -> dict[str, int]:
        return {**self.by_pool, "total": self.total}

    # -- what leases call ---------------------------------------------------------------------
    def _add(self, backend: str, delta: int) -> None:
        now = self.clock()
        self._area[backend] += self._in[backend] * (now - self._since[backend])
        self._since[backend] = now
        self._in[backend] += delta
        self._pool[self.pool_of[backend]] += delta

    def _open(self, backend: str) -> None:
        # (``_add(backend, 1)`` written out: this and ``_close`` run for every request)
        self._total += 1
        now = self.clock()
        count = self._in[backend]
        self._area[backend] += count * (now - self._since[backend])
        self._since[backend] = now
        self._in[backend] = count + 1
        self._pool[self.pool_of[backend]] += 1
        self._started[backend] += 1

    def _move(self, old: str, new: str) -> None:
        self._add(old, -1)
        self._add(new, 1)
        self._started[new] += 1

    def _close(self, backend: str, slow: bool) -> None:
        self._total -= 1
        now = self.clock()
        count = self._in[backend]
        self._area[backend] += count * (now - self._since[backend])
        self._since[backend] = now
        self._in[backend] = count - 1
        self._pool[self.pool_of[backend]] -= 1
        if slow:
            self._slow[self.pool_of[backend]] -= 1

    def _slow_client(self, backend: str) -> None:
        self._slow[self.pool_of[backend]] += 1


class Lease:
    """One request's hold on the counts; moves with the request when it is retried."""

    __slots__ = ("_tracker", "backend", "released", "slow", "what")

    def __init__(self, tracker: InflightTracker, backend: str, what: object = None) -> None:
        self._tracker = tracker
        self.backend = backend
        self.released = False
        self.slow = False
        self.what = what
        tracker._open(backend)
        if what is not None:
            tracker.flights[backend][self] = what

    @property
    def pool(self) -> Pool:
        return self._tracker.pool_of[self.backend]

    def mark_slow(self) -> None:
        """The client fell behind: counted in ``slow_clients`` until the lease is released."""
        if self.released or self.slow:
            return
        self.slow = True
        self._tracker._slow_client(self.backend)

    def move(self, backend: str) -> None:
        if self.released or backend == self.backend:
            return
        tracker = self._tracker
        tracker._move(self.backend, backend)
        if self.what is not None:
            del tracker.flights[self.backend][self]
            tracker.flights[backend][self] = self.what
        self.backend = backend

    def release(self) -> bool:
        """Give the slot back; True the first time, False (and no change) after."""
        if self.released:
            return False
        self.released = True
        tracker = self._tracker
        tracker._close(self.backend, self.slow)
        if self.what is not None:
            del tracker.flights[self.backend][self]
        return True
