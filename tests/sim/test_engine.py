"""The batching loop in-process, on the real clock at a small time scale."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from router.sim.engine import Engine, SimRequest
from router.sim.model import BASELINE, EAGLE3, Preset, prefill_time, step_time

T = TypeVar("T")


async def drain(req: SimRequest) -> list[int]:
    chunks = []
    while n := await req.next_tokens():
        chunks.append(n)
    return chunks


async def with_engine(preset: Preset, scale: float, body: Callable[[Engine], Awaitable[T]]) -> T:
    engine = Engine(preset, time_scale=scale, seed=3)
    task = asyncio.create_task(engine.run())
    try:
        return await body(engine)
    finally:
        task.cancel()


def test_tokens_arrive_per_iteration() -> None:
    async def body(engine: Engine) -> tuple[list[int], list[int]]:
        a = engine.submit(10, 50, temperature=0)
        b = engine.submit(10, 50, temperature=0)
        first, second = await asyncio.gather(drain(a), drain(b))
        return first, second

    a, b = asyncio.run(with_engine(EAGLE3, 0.05, body))
    for chunks in (a, b):
        assert sum(chunks) == 50 and chunks[0] == 1 and max(chunks) <= 4
    assert a != b  # independent acceptance draws

    async def plain(engine: Engine) -> list[int]:
        return await drain(engine.submit(5, 20))

    assert asyncio.run(with_engine(BASELINE, 0.05, plain)) == [1] * 20


def test_iterations_keep_to_the_model_clock() -> None:
    # One baseline request: a join iteration with its prefill, then 199 one-token iterations.
    scale, prompt, n = 0.05, 100, 200
    expected = prefill_time(BASELINE, prompt) + sum(
        step_time(BASELINE, 1, prompt + i) for i in range(n)
    )

    async def body(engine: Engine) -> float:
        start = time.monotonic()
        await drain(engine.submit(prompt, n))
        return time.monotonic() - start

    elapsed = asyncio.run(with_engine(BASELINE, scale, body))
    assert elapsed == pytest.approx(expected * scale, rel=0.03)


def test_queue_and_abort() -> None:
    async def body(engine: Engine) -> None:
        reqs = [engine.submit(10, 1000) for _ in range(5)]
        await reqs[0].next_tokens()
        assert (engine.gauges().running, engine.gauges().queued) == (2, 3)
        engine.abort(reqs[0])
        engine.abort(reqs[4])  # still queued
        assert (engine.gauges().running, engine.gauges().queued) == (1, 2)
        assert await reqs[0].next_tokens() == 0  # closed: the handler stops at once
        await reqs[1].next_tokens()
        await reqs[1].next_tokens()
        assert engine.gauges().running == 2  # the freed slot was refilled at a boundary
        for req in reqs:
            engine.abort(req)
        assert engine.gauges() == type(engine.gauges())(0, 0, 0)
        assert engine.stats.aborted == 5

    asyncio.run(with_engine(EAGLE3.replace(max_running=2), 0.05, body))


def test_tau_at_runtime() -> None:
    engine = Engine(EAGLE3)
    engine.set_tau(tau=3.5)
    assert (engine.tau, engine.tau_sampling) == (3.5, 2.4)
    with pytest.raises(ValueError):
        engine.set_tau(tau_sampling=0.5)
    with pytest.raises(ValueError):
        Engine(EAGLE3, time_scale=0)
