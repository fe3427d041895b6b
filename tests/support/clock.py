"""An asyncio event loop on virtual time, for timing behaviour tested in process.

``loop.time()`` is a number this loop owns. When no callback is ready and the loop would block
for a timer (``asyncio.sleep``, ``wait_for``, ``call_later``), time jumps to that timer at once
instead of passing, so a test of what happens at which time runs in microseconds and gives the
same answer on a busy machine as on a quiet one. ``late`` adds that much to every jump: a loop
that always wakes late, to test code that must not drift when it does. Code under test must
read the time from the loop (or from a clock it is given, ``loop.time``), not from
``time.monotonic``. No sockets: a loop that would wait for I/O with no timer raises.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class _Jumping(selectors.DefaultSelector):
    """A selector that never waits: it polls, and moves the loop's time by the timeout."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise RuntimeError("the loop would wait for I/O with no timer: nothing to jump to")
        assert self.loop is not None
        self.loop.now += timeout + self.loop.late
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float = 1000.0, late: float = 0.0) -> None:
        selector = _Jumping()
        super().__init__(selector)
        selector.loop = self
        self.now = start
        self.late = late

    def time(self) -> float:
        return self.now


def run_virtual(main: Callable[[VirtualTimeLoop], Awaitable[T]], late: float = 0.0) -> T:
    """Run ``main(loop)`` to its end on a fresh virtual-time loop."""
    loop = VirtualTimeLoop(late=late)

    async def call() -> T:
        return await main(loop)

    try:
        return loop.run_until_complete(call())
    finally:
        loop.close()
