"""An optional, bounded router-side queue for requests no backend can serve within their SLO.

Off by default (``QUEUE_SIZE=0``). When on, a request the ``slo`` policy routes as ``overflow``
(it cannot meet even the relaxed SLO anywhere) waits here instead of adding to an engine's
batch, until a request in flight ends and a new decision admits it, or its deadline
(``QUEUE_TIMEOUT``) passes: then 503 with ``Retry-After``. A full queue answers 429 at once.
Waiters are woken oldest first, one per released request; each place in the queue is given
back on every path (admitted, timed out, client gone, cancelled), and ``queued`` is exact.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from router.errors import QueueFull

# What ``meter`` is told: a place taken (+1) or given back (-1) as "queued", and each way out.
Meter = Callable[[str, int], None]


class Admission:
    def __init__(self, size: int, meter: Meter | None = None) -> None:
        """``meter``: for metrics kept outside this object (under ``serve --workers``, one
        file per worker that prometheus-client merges); single-process metrics read the
        counts below at scrape time instead."""
        self.size = size
        self.meter = meter
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.queued = 0  # requests holding a place now
        self.admitted = 0  # that left the queue for a backend
        self.timed_out = 0
        self.full = 0  # refused because the queue was full

    @property
    def enabled(self) -> bool:
        return self.size > 0

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

    def status(self) -> dict[str, int]:
        return {
            "size": self.size,
            "queued": self.queued,
            "admitted": self.admitted,
            "timed_out": self.timed_out,
            "refused_full": self.full,
        }
