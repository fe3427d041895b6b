"""Finished requests' accounting, run when the event loop is not taking requests in.

Every request's end runs its observers (the metrics, the learner's keeper, the recent window):
~50 us in all (bench/results/fast-path.md, session 12). Under tail.py's waves a stream's end
is when its client reconnects for the next one, so those 50 us sit between the next request's
head and its first byte, once per stream of the wave. Routing reads the in-flight counts
(released at once, as before) and the keeper's traffic averages (``Keeper.traffic``: fed at
once by ``Keeper.observe_traffic``, not queued here), so the rest of the work can wait a little.

``Ended.add`` queues a finished outcome and asks for a turn of the loop. Each turn runs
every queued outcome that ended ``MAX_AGE`` ago or earlier, then, if the turn is quiet, up to
``BATCH`` more; while anything is left it asks for the next turn (``WAIT`` later after a busy
turn, at once after a quiet one). So no outcome waits much past ``MAX_AGE`` (the next turn
after it: ``WAIT`` later, or one loop iteration when the loop is saturated), and the queue
holds at most what ends in ``MAX_AGE`` plus one turn's ends. "Quiet" means no request head came
in since the last turn; only the callback path says when one came (``busy``:
``router.forward.callback``), so under ``spec-router serve``'s protocol, the plain proxy and the
gateway every turn counts as quiet and deferral only moves the work a turn or so later,
``BATCH`` at a time. ``LIMIT`` is an emergency bound on memory: a turn that finds that many
queued runs them all (logged once per episode: until a turn empties the queue the normal way);
``add`` never runs them, except when ``4 * LIMIT`` are queued, which only happens when no turn
comes at all (the loop it was scheduled on stopped; logged).

``settle`` runs all of it now: whatever reads the observers' state (``/metrics``,
``/router/status``, the live page, the keeper's learning step, table, replacement and
persistence, a backend's removal, shutdown) settles first, so it reads every count.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

log = logging.getLogger("spec_router.proxy")

BATCH = 16  # outcomes run past the old ones in a quiet turn of the loop (~1 ms of observers)
LIMIT = 4096  # queued outcomes a turn runs all at once (an emergency bound on memory)
MAX_AGE = 0.25  # seconds: an outcome this old runs at the next turn, quiet or not
WAIT = 0.001  # seconds to the next turn after a turn with a request head in it


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

    __slots__ = ("observers", "clock", "_loop", "_queue", "_scheduled", "_busy", "_over")

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
        self._over = False  # (LIMIT was hit and the queue has not been emptied since)

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, out: T) -> None:
        """``out`` is over (its ``ended`` set): its observers run at a later turn."""
        queue = self._queue
        queue.append(out)
        if self._scheduled:
            if len(queue) >= 4 * LIMIT:  # (no turn comes: see the module doc)
                log.warning("%d finished requests' accounting queued: no turn came", len(queue))
                self.settle()
            return
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

    def detach(self) -> None:
        """Forget the loop (its lifecycle is over: ``RouterApp.running``, after the final
        ``settle``): the next outcome asks the loop running then for a turn."""
        self._scheduled = False
        self._loop = None
        self._busy = False

    def _turn(self) -> None:
        busy = self._busy
        self._busy = False
        try:
            self._run(busy)
        finally:  # (if it raised, the next outcome asks for a turn again)
            self._scheduled = False
        loop = self._loop
        if self._queue and loop is not None:
            if busy:
                loop.call_later(WAIT, self._turn)
            else:
                loop.call_soon(self._turn)
            self._scheduled = True

    def _run(self, busy: bool) -> None:
        queue = self._queue
        if len(queue) >= LIMIT:
            if not self._over:
                self._over = True
                log.warning(
                    "%d finished requests' accounting queued (LIMIT): run at once", len(queue)
                )
            self.settle()
            return
        now = self.clock()
        while queue and now - queue[0].ended >= MAX_AGE:  # (in the order they ended)
            self._observe(queue.popleft())
        if not busy:
            for _ in range(min(BATCH, len(queue))):
                self._observe(queue.popleft())
        if not queue:
            self._over = False

    def _observe(self, out: T) -> None:
        for observe in self.observers:
            try:
                observe(out)
            except Exception:  # an observer must never break the proxy
                log.exception("observer failed")
