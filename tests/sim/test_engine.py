"""The batching loop in process: its timing on a virtual clock (tests/support/clock.py), the
rest on the real clock at a small time scale."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from router.sim.engine import Engine, SimRequest
from router.sim.model import BASELINE, EAGLE3, Preset, prefill_time, step_time
from tests.support.clock import VirtualTimeLoop, run_virtual

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


def test_a_held_request_runs_without_gaining_until_released() -> None:
    async def body(engine: Engine) -> tuple[list[int], int, int, int, int, list[int]]:
        held = engine.submit(10, 50, temperature=0, hold_after=7)
        other = engine.submit(10, 30, temperature=0)
        got: list[int] = []
        while sum(got) < 7:
            got.append(await held.next_tokens())
        others = await drain(other)  # the batch runs on beside it
        before = engine.stats.iterations
        while engine.stats.iterations < before + 20:  # twenty more, and nothing for it
            await asyncio.sleep(0)
        gauges = engine.gauges()
        state = (sum(got), held.pending, engine.held, gauges.running)
        engine.release()
        rest = await drain(held)
        return got, *state, others + rest

    got, taken, pending, held, running, rest = asyncio.run(with_engine(EAGLE3, 0.05, body))
    assert (taken, pending, held, running) == (7, 0, 1, 1)  # in the batch, at its hold
    assert sum(rest) == 30 + 43  # released: the rest, to its end


def model_seconds(preset: Preset, prompt: int, n: int) -> float:
    """One request alone: a join iteration with its prefill, then ``n - 1`` more."""
    return prefill_time(preset, prompt) + sum(step_time(preset, 1, prompt + i) for i in range(n))


@pytest.mark.parametrize("scale", [0.05, 1.0])
def test_iterations_keep_to_the_model_clock(scale: float) -> None:
    prompt, n = 100, 200

    async def main(loop: VirtualTimeLoop) -> float:
        engine = Engine(BASELINE, time_scale=scale, seed=3, clock=loop.time)
        task = asyncio.create_task(engine.run())
        start = loop.time()
        await drain(engine.submit(prompt, n))
        task.cancel()
        return loop.time() - start

    assert run_virtual(main) == pytest.approx(model_seconds(BASELINE, prompt, n) * scale)


def test_late_wake_ups_do_not_add_up() -> None:
    """Deadlines accumulate (``deadline += duration``): an engine woken 1 ms late at every
    iteration of 200 still ends about 1 ms late, not 200 ms."""
    prompt, n, late = 100, 200, 0.001

    async def main(loop: VirtualTimeLoop) -> float:
        engine = Engine(BASELINE, time_scale=1.0, seed=3, clock=loop.time)
        task = asyncio.create_task(engine.run())
        start = loop.time()
        await drain(engine.submit(prompt, n))
        task.cancel()
        return loop.time() - start

    expected = model_seconds(BASELINE, prompt, n)
    assert min(step_time(BASELINE, 1, prompt + i) for i in range(n)) > 2 * late  # (can catch up)
    assert expected <= run_virtual(main, late=late) <= expected + 2 * late


@pytest.mark.parametrize("when_stale", [True, False])
def test_an_idle_sglang_reports_at_once_when_stale_else_after_its_idle_refresh(
    when_stale: bool,
) -> None:
    """SGLang's load gauges move on a prefill batch and every ``log_interval`` decode steps;
    idle, 0.5.23 reports at once when its last report showed requests running
    (``when_stale``), 0.5.3 only ``idle_refresh`` after its last report."""

    async def main(loop: VirtualTimeLoop) -> None:
        engine = Engine(
            BASELINE, seed=3, clock=loop.time, every_step=False, log_interval=40,
            idle_refresh=30.0, refresh_when_stale=when_stale,
        )  # fmt: skip
        task = asyncio.create_task(engine.run())
        await drain(engine.submit(10, 60))  # reported at its 40th step, then ended
        ended = loop.time()
        for _ in range(3):
            await asyncio.sleep(0)  # (the engine's loop turns to idle)
        assert engine.published is not None
        if when_stale:
            assert engine.published.running == 0 and engine.published_at == ended
        else:
            last = engine.published_at
            assert engine.published.running == 1 and last < ended  # (stale, and kept)
            await asyncio.sleep(last + 30.0 - loop.time() - 0.001)
            assert engine.published.running == 1  # (1 ms before its idle report)
            await asyncio.sleep(0.002)
            assert engine.published.running == 0
            assert engine.published_at == pytest.approx(last + 30.0)
        task.cancel()

    run_virtual(main)


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
