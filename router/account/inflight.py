"""Exact in-flight accounting: counts per pool and per backend, and the lease that holds one.

A lease is taken when a request has been routed and released exactly once when its last byte
was sent or its client went away. ``release()`` is idempotent so that a ``finally`` can always
call it; counts are never clamped, so a leak would show instead of hiding.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from router.pools import POOLS, Pool


class InflightTracker:
    def __init__(
        self, backends: Iterable[tuple[Pool, str]], clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``backends``: (pool, url) pairs."""
        self.clock = clock
        self.pool_of: dict[str, Pool] = {}
        self.by_backend: dict[str, int] = {}
        self.started: dict[str, int] = {}  # requests ever sent to each backend (monotonic)
        # in-flight x seconds per backend, so a request's mean concurrency is a difference
        self._area: dict[str, float] = {}
        self._since: dict[str, float] = {}
        now = clock()
        for pool, url in backends:
            self.pool_of[url] = pool
            self.by_backend[url] = 0
            self.started[url] = 0
            self._area[url] = 0.0
            self._since[url] = now
        self.by_pool: dict[str, int] = dict.fromkeys(POOLS, 0)
        self.total = 0
        # of those in flight, responses held back by a client that reads slower than the
        # engine writes (the router buffers a little, then stops reading from the engine)
        self.slow_clients: dict[str, int] = dict.fromkeys(POOLS, 0)

    def area(self, backend: str, now: float) -> float:
        """The integral of ``by_backend[backend]`` over time, up to ``now``."""
        return self._area[backend] + self.by_backend[backend] * (now - self._since[backend])

    def acquire(self, backend: str) -> Lease:
        return Lease(self, backend)

    def _add(self, backend: str, delta: int) -> None:
        now = self.clock()
        self._area[backend] += self.by_backend[backend] * (now - self._since[backend])
        self._since[backend] = now
        self.by_backend[backend] += delta
        self.by_pool[self.pool_of[backend]] += delta

    def snapshot(self) -> dict[str, int]:
        return {**self.by_pool, "total": self.total}


class Lease:
    """One request's hold on the counts; moves with the request when it is retried."""

    __slots__ = ("_tracker", "backend", "released", "slow")

    def __init__(self, tracker: InflightTracker, backend: str) -> None:
        self._tracker = tracker
        self.backend = backend
        self.released = False
        self.slow = False
        tracker.total += 1
        tracker._add(backend, 1)
        tracker.started[backend] += 1

    @property
    def pool(self) -> Pool:
        return self._tracker.pool_of[self.backend]

    def mark_slow(self) -> None:
        """The client fell behind: counted in ``slow_clients`` until the lease is released."""
        if self.released or self.slow:
            return
        self.slow = True
        self._tracker.slow_clients[self.pool] += 1

    def move(self, backend: str) -> None:
        if self.released or backend == self.backend:
            return
        tracker = self._tracker
        tracker._add(self.backend, -1)
        tracker._add(backend, 1)
        tracker.started[backend] += 1
        self.backend = backend

    def release(self) -> bool:
        """Give the slot back; True the first time, False (and no change) after."""
        if self.released:
            return False
        self.released = True
        tracker = self._tracker
        tracker.total -= 1
        tracker._add(self.backend, -1)
        if self.slow:
            tracker.slow_clients[self.pool] -= 1
        return True
