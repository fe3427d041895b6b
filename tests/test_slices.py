"""``router.lifecycle.in_slices``: long arithmetic on the event loop gives the loop a turn
between slices, and its result is what running it at once gives; while requests are in
flight, the rest after each slice keeps it to ``LEARN_SHARE`` of the core
(``learning_pause``), and idle it runs at full speed."""

from __future__ import annotations

import asyncio

import pytest

from router.account.inflight import InflightTracker
from router.decide.capacity import Steps, finish
from router.lifecycle import in_slices, learning_pace, learning_pause, serving
from router.pools import SPECULATIVE

pytestmark = pytest.mark.anyio


def counting(n: int, seen: list[int]) -> Steps[int]:
    total = 0
    for i in range(n):
        yield
        seen.append(i)
        total += i
    return total


async def test_the_loop_runs_between_slices() -> None:
    seen: list[int] = []
    turns: list[int] = []  # how much of the work was done at each turn of the loop
    loop = asyncio.get_running_loop()
    done = False

    def tick() -> None:
        if not done:
            turns.append(len(seen))
            loop.call_soon(tick)

    loop.call_soon(tick)
    # budget 0: one step per slice, so the loop turns between every two
    result = await in_slices(counting(50, seen), budget=0.0)
    done = True
    assert result == sum(range(50))
    assert seen == list(range(50))
    assert len(set(turns)) >= 25 and max(turns) < 50


async def test_the_result_is_the_one_at_once() -> None:
    assert await in_slices(counting(1000, [])) == finish(counting(1000, []))
    assert await in_slices(counting(0, [])) == 0


@pytest.mark.parametrize(
    ("worked", "share", "busy", "pause"),
    [
        (0.0005, 0.1, True, 0.0045),  # a 0.5-ms slice at 10%: 4.5 ms of rest
        (0.002, 0.5, True, 0.002),
        (0.0005, 0.25, True, 0.0015),
        (0.0, 0.1, True, 0.0),
        (0.0005, 0.1, False, 0.0),  # idle: full speed
        (0.0005, 1.0, True, 0.0),  # share 1: never pauses (one loop turn, as before)
    ],
)
def test_the_pause_keeps_the_work_to_its_share_while_busy(
    worked: float, share: float, busy: bool, pause: float
) -> None:
    got = learning_pause(worked, share, busy)
    assert got == pytest.approx(pause)
    if busy and worked:
        assert worked / (worked + got) == pytest.approx(share)


def test_the_pace_asks_whether_requests_are_in_flight_each_time() -> None:
    tracker = InflightTracker([(SPECULATIVE, "http://a")])
    pace = learning_pace(0.1, serving(tracker))
    assert pace(0.001) == 0.0
    lease = tracker.acquire("http://a")
    assert pace(0.001) == pytest.approx(0.009)
    lease.release()
    assert pace(0.001) == 0.0


async def test_each_slice_is_paced_and_the_result_is_the_same() -> None:
    worked: list[float] = []

    def pace(seconds: float) -> float:
        worked.append(seconds)
        return 0.0

    seen: list[int] = []
    # budget 0: one step per slice, so one pace after every step (none after the last)
    assert await in_slices(counting(50, seen), budget=0.0, pace=pace) == sum(range(50))
    assert seen == list(range(50))
    assert len(worked) == 50 and min(worked) >= 0.0
    worked.clear()
    # a budget longer than the whole job: one slice, no pause at all
    assert await in_slices(counting(50, []), budget=60.0, pace=pace) == sum(range(50))
    assert worked == []
