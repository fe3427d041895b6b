"""router.timers.LazyTimer on a real event loop (asyncio and uvloop): it goes off once the
deadline its owner reports has passed, not at a deadline since moved, and not at all when
nothing is due."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from router.timers import LazyTimer
from tests.support.loops import on_both_loops  # noqa: F401 (the fixture)

pytestmark = pytest.mark.anyio


class Owner:
    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.due: float | None = None
        self.fired: list[float] = []
        self.fire_event = asyncio.Event()
        self.timer = LazyTimer(self.loop, lambda: self.due, self.fire)

    def fire(self) -> None:
        self.fired.append(self.loop.time())
        self.fire_event.set()

    def arm(self, delay: float) -> float:
        self.due = self.loop.time() + delay
        self.timer.arm(self.due)
        return self.due


async def test_it_goes_off_at_the_deadline_moved_later_not_at_the_first() -> None:
    owner = Owner()
    owner.arm(0.1)
    await anyio.sleep(0.05)
    due = owner.arm(0.2)  # later: the pending timer is kept, and waits on when it goes off
    with anyio.fail_after(5):
        await owner.fire_event.wait()
    assert len(owner.fired) == 1 and owner.fired[0] >= due - 0.002


async def test_a_deadline_moved_earlier_is_kept() -> None:
    owner = Owner()
    owner.arm(5.0)
    due = owner.arm(0.05)
    with anyio.fail_after(2):
        await owner.fire_event.wait()
    assert owner.fired[0] >= due - 0.002


async def test_nothing_due_and_cancel_mean_it_never_goes_off() -> None:
    owner = Owner()
    owner.arm(0.05)
    owner.due = None  # disarmed: the pending timer finds nothing due
    other = Owner()
    other.arm(0.05)
    other.timer.cancel()
    await anyio.sleep(0.2)  # (the time passing is the point)
    assert owner.fired == [] and other.fired == []
    due = owner.arm(0.05)  # and it can be armed again
    with anyio.fail_after(2):
        await owner.fire_event.wait()
    assert owner.fired[0] >= due - 0.002
