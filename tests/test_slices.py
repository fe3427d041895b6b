"""``router.lifecycle.in_slices``: long arithmetic on the event loop gives the loop a turn
between slices, and its result is what running it at once gives."""

from __future__ import annotations

import asyncio

import pytest

from router.decide.capacity import Steps, finish
from router.lifecycle import in_slices

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
