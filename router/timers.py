"""A deadline that moves far more often than it passes, kept with one timer.

Three deadlines of the router move on every request: the client side's request deadline and
keep-alive (``router.fastpath.protocol``) and each upstream exchange's first-byte, idle or total
deadline (``router.upstream.client``). A timer made and cancelled per move showed in the
router's profile under streaming load (``bench/lab/profile_router.py``). A
``LazyTimer`` keeps one timer pending no later than the deadline; moving the deadline later costs
nothing, and the timer, on firing early, asks where the deadline is now and waits on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

CLOCK_SLACK = 0.001  # a timer that fires this close to its deadline has reached it


class LazyTimer:
    """Calls ``fire`` once the deadline ``due()`` returns has passed; ``due()`` is asked when
    the timer goes off, and None there means nothing is due (the timer ends until armed)."""

    __slots__ = ("_loop", "_due", "_fire", "_handle", "_at")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        due: Callable[[], float | None],
        fire: Callable[[], None],
    ) -> None:
        self._loop = loop
        self._due = due
        self._fire = fire
        self._handle: asyncio.Handle | None = None
        self._at = 0.0  # when the pending timer goes off (kept here: see _set)

    def arm(self, when: float) -> None:
        """Make sure the timer goes off by ``when`` (loop time): a pending one that goes off no
        later is kept."""
        if self._handle is None or self._at > when + CLOCK_SLACK:
            self.cancel()
            self._set(when)

    def cancel(self) -> None:
        """Drop the pending timer (a pending one keeps its owner alive)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _set(self, when: float) -> None:
        # at least CLOCK_SLACK ahead, and its time kept here: for a delay that rounds to 0 ms
        # uvloop hands back a plain Handle, with no when()
        at = self._at = max(when, self._loop.time() + CLOCK_SLACK)
        self._handle = self._loop.call_at(at, self._run)

    def _run(self) -> None:
        self._handle = None
        due = self._due()
        if due is None:
            return
        if due - self._loop.time() > CLOCK_SLACK:  # moved since the timer was set
            self._set(due)
            return
        self._fire()
