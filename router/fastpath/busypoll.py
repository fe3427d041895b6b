"""Busy polling: keep the event loop polling, not sleeping, for a short window after activity.

When the loop has nothing to do it blocks in ``epoll_wait`` and its CPU goes idle; the next
packet then has to wake it (an interrupt, and on a virtual machine a trip through the
hypervisor), and the code that handles it runs on cold caches. On the 2-core VM of
bench/results/overhead.md that costs about 0.1 ms per request at concurrency 1 -- more than all
of the router's own Python code on that path. Spinning for a few tens of microseconds after each
event catches the next one while the core is still awake: the same trade as Linux's
``net.core.busy_poll``, Seastar's polling reactor or Go's spinning scheduler threads.

What it costs is CPU, and only just after activity: at most ``window`` of polling per quiet gap,
so an idle router stays idle and a busy one is awake anyway. It pays on a core of the router's
own; on a core shared with other busy processes, turn it off (``SPEC_ROUTER_BUSY_POLL_US=0``).

``BusyPoll`` only schedules callbacks: each turn of the spin is one ``call_soon``, which makes
the loop poll its sockets without blocking before it runs the next one. ``poke()`` marks
activity; the proxy calls it when a request arrives or ends and when an upstream sends bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Scheduler(Protocol):
    """What busy polling needs of the event loop (an asyncio loop; the unit tests' fake)."""

    def call_soon(self, callback: Callable[[], object], /) -> object: ...


class BusyPoll:
    __slots__ = ("_loop", "_window", "_clock", "_active", "_running", "_since", "_stopped", "spins")

    def __init__(
        self,
        loop: Scheduler,
        window: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._loop = loop
        self._window = window
        self._clock = clock
        self._active = False  # poked since the last turn
        self._running = False  # a turn is scheduled
        self._since = 0.0  # when activity was last seen
        self._stopped = False
        self.spins = 0  # turns taken (for tests and curiosity)

    @property
    def running(self) -> bool:
        return self._running

    def poke(self) -> None:
        """Something happened: poll for another ``window`` before the loop may sleep."""
        if self._stopped:
            return
        if self._running:
            self._active = True  # the next turn restarts the window
        else:
            self._running = True
            self._since = self._clock()
            self._loop.call_soon(self._turn)

    def stop(self) -> None:
        """Let the loop sleep at the next turn, for good (the server is stopping)."""
        self._stopped = True
        self._active = False
        self._since = float("-inf")

    def _turn(self) -> None:
        now = self._clock()
        if self._active:
            self._active = False
            self._since = now
        elif now - self._since >= self._window:
            self._running = False
            return
        self.spins += 1
        self._loop.call_soon(self._turn)
