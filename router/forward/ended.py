"""Finished requests' accounting, run when the event loop is not taking requests in.

Every request's end runs its observers (the metrics, the learner's keeper, the recent window):
~50 us in all (bench/results/fast-path.md, session 12). Under tail.py's waves a stream's end
is when its client reconnects for the next one, so those 50 us sit between the next request's
head and its first byte, once per stream of the wave. Nothing on a request's path reads what
these observers keep (routing reads the in-flight counts, released at once, as before), so
their work can wait for a turn of the loop with no request head in it.

``Ended.add`` queues a finished outcome; each turn of the loop with no new head (``busy``
says when one came) runs up to ``BATCH`` of them; the queue is run through regardless once
it holds ``LIMIT`` outcomes or its oldest ended ``MAX_AGE`` ago. ``settle`` runs all of it
now: whatever reads the observers' state (``/metrics``, ``/router/status``, the live page,
the keeper's learning step and its table, shutdown) settles first, so it reads every count.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

log = logging.getLogger("spec_router.proxy")

BATCH = 16  # outcomes run per quiet turn of the loop (~1 ms of observers)
LIMIT = 4096  # queued outcomes past which all run at once (a bound on memory)
MAX_AGE = 0.25  # seconds: the oldest outcome waits no longer than this for a quiet turn
WAIT = 0.001  # seconds to wait after a turn with a request head in it


class Loop(Protocol):
    """What ``Ended`` needs of the event loop (an asyncio loop; the unit tests' fake)."""

    def call_soon(self, callback: Callable[[], object], /) -> object: ...

    def call_later(self, delay: float, callback: Callable[[], object], /) -> object: ...


class Done(Protocol):
    @property
    def ended(self) -> float: ...


T = TypeVar("T", bound=Done)


class Ended(Generic[T]):
    """Outcomes waiting for their observers (see the module doc)."""

    __slots__ = ("observers", "clock", "_loop", "_queue", "_scheduled", "_busy")

    def __init__(
        self,
        observers: list[Callable[[T], None]],
        clock: Callable[[], float],
        loop: Loop | None = None,
    ) -> None:
        self.observers = observers
        self.clock = clock
        self._loop = loop  # (the running loop, looked up at the first outcome)
        self._queue: deque[T] = deque()
        self._scheduled = False
        self._busy = False

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, out: T) -> None:
        """``out`` is over (its ``ended`` set): its observers run at a quiet turn."""
        queue = self._queue
        queue.append(out)
        if len(queue) >= LIMIT:
            self.settle()
            return
        if not self._scheduled:
            loop = self._loop
            if loop is None:
                try:
                    loop = self._loop = asyncio.get_running_loop()
                except RuntimeError:  # (no loop: run them now)
                    self.settle()
                    return
            try:
                loop.call_soon(self._turn)
            except RuntimeError:  # (the loop is closed: run them now)
                self.settle()
                return
            self._scheduled = True

    def busy(self) -> None:
        """A request head came in: this turn of the loop is not a quiet one."""
        self._busy = True

    def settle(self) -> None:
        """Run every queued outcome's observers now (before anything reads their state)."""
        queue = self._queue
        while queue:
            self._observe(queue.popleft())

    def _turn(self) -> None:
        queue = self._queue
        if not queue:
            self._scheduled = False
            return
        loop = self._loop
        assert loop is not None
        if self._busy and self.clock() - queue[0].ended < MAX_AGE:
            self._busy = False
            loop.call_later(WAIT, self._turn)
            return
        self._busy = False
        for _ in range(min(BATCH, len(queue))):
            self._observe(queue.popleft())
        if queue:
            loop.call_soon(self._turn)
        else:
            self._scheduled = False

    def _observe(self, out: T) -> None:
        for observe in self.observers:
            try:
                observe(out)
            except Exception:  # an observer must never break the proxy
                log.exception("observer failed")
