"""Busy polling: keep the event loop polling, not sleeping, for a short window after activity.

When the loop has nothing to do it blocks in ``epoll_wait`` and its CPU goes idle; the next
packet then has to wake it (an interrupt, and on a virtual machine a trip through the
hypervisor), and the code that handles it runs on cold caches: at low concurrency that is a
visible part of the latency the router adds (``router`` against ``router_no_busy_poll`` in
bench/results/overhead.md). Spinning for a few tens of microseconds after each event catches the
next one while the core is still awake: the same trade as Linux's ``net.core.busy_poll``,
Seastar's polling reactor or Go's spinning scheduler threads.

What it costs is CPU, and only just after activity: at most ``window`` of polling per quiet gap,
so an idle router stays idle and a busy one is awake anyway. It pays on a core of the router's
own; on a core shared with other busy processes the spin takes time they could have run in. So
the router stops spinning by
itself while its core looks shared (``ShareWatch``: the kernel keeps preempting it, or it keeps
waiting for the core when it wakes) and starts again once that stops;
``SPEC_ROUTER_BUSY_POLL_US=0`` turns spinning off for good.

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


# When the router's core counts as shared. Two symptoms, either is enough: the kernel keeps
# preempting the router (involuntary context switches, what a busy router on a shared core
# shows), or the router keeps waiting for the core when it wakes (time runnable but not running,
# what a lightly loaded one shows). The limits separate the clear cases measured with
# `python bench/lab/cpu_split.py --target router_spin --where pinned|unpinned|hog` (a core of its
# own against one shared with a busy loop or with the backends and load generator,
# bench/results/overhead-harnesses.md); the margins are thin.
SHARED_SWITCHES_PER_S = 100.0
SHARED_WAIT = 0.01  # seconds waiting for the core per second
# Quiet periods in a row (each ``SHARE_PERIOD``) before a core that looked shared counts as the
# router's own again: one quiet period says little, as a router that stopped spinning and has
# little to do is rarely preempted.
QUIET_PERIODS = 5
SHARE_PERIOD = 1.0  # seconds between two readings


class ShareWatch:
    """Whether the router's core is shared with other busy processes.

    ``update`` takes the time and two cumulative counts of the event loop's thread: involuntary
    context switches (``getrusage``'s ``ru_nivcsw``) and seconds spent runnable but waiting for
    a core (the second field of ``/proc/<pid>/schedstat``, or None where the kernel does not
    keep it). Shared as soon as one period's rate passes either limit; its own again after
    ``quiet`` periods in a row below both.
    """

    __slots__ = ("limit", "wait_limit", "quiet", "shared", "rate", "wait", "_last", "_calm")

    def __init__(
        self,
        limit: float = SHARED_SWITCHES_PER_S,
        wait_limit: float = SHARED_WAIT,
        quiet: int = QUIET_PERIODS,
    ) -> None:
        self.limit = limit
        self.wait_limit = wait_limit
        self.quiet = quiet
        self.shared = False
        self.rate: float | None = None  # switches per second over the last period
        self.wait: float | None = None  # seconds waiting for the core per second, same period
        self._last: tuple[float, int, float | None] | None = None
        self._calm = 0  # periods in a row below the limits

    def update(self, now: float, switches: int, waited: float | None = None) -> bool:
        last, self._last = self._last, (now, switches, waited)
        if last is None or now <= last[0]:
            return self.shared
        span = now - last[0]
        self.rate = (switches - last[1]) / span
        self.wait = None if waited is None or last[2] is None else (waited - last[2]) / span
        if self.rate > self.limit or (self.wait is not None and self.wait > self.wait_limit):
            self.shared, self._calm = True, 0
        elif self.shared:
            self._calm += 1
            if self._calm >= self.quiet:
                self.shared, self._calm = False, 0
        return self.shared


class BusyPoll:
    __slots__ = (
        "_loop",
        "_window",
        "_clock",
        "_active",
        "_running",
        "_since",
        "_stopped",
        "_held",
        "spins",
    )

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
        self._held = False  # the core looks shared: no spinning until it is the router's again
        self.spins = 0  # turns taken (for tests and curiosity)

    @property
    def running(self) -> bool:
        return self._running

    @property
    def held(self) -> bool:
        return self._held

    def hold(self, held: bool) -> None:
        """Stop spinning (``True``: the core is shared) or allow it again (``False``).

        A spin under way ends at its next turn."""
        self._held = held

    def poke(self) -> None:
        """Something happened: poll for another ``window`` before the loop may sleep."""
        if self._stopped or self._held:
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
        if self._held:
            self._running = self._active = False
            return
        now = self._clock()
        if self._active:
            self._active = False
            self._since = now
        elif now - self._since >= self._window:
            self._running = False
            return
        self.spins += 1
        self._loop.call_soon(self._turn)
