"""Ended's schedule, on a fake loop and a fake clock: no sockets, no sleeping."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from router.forward import ended as ended_module
from router.forward.ended import BATCH, LIMIT, MAX_AGE, WAIT, Ended


@dataclass
class Out:
    n: int
    ended: float


class FakeLoop:
    """Turns the test runs, on a clock the test moves (``now``; ``time`` is the clock)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.ready: list[Callable[[], object]] = []
        self.timers: list[tuple[float, Callable[[], object]]] = []

    def time(self) -> float:
        return self.now

    def call_soon(self, callback: Callable[[], object]) -> None:
        self.ready.append(callback)

    def call_later(self, delay: float, callback: Callable[[], object]) -> None:
        self.timers.append((self.now + delay, callback))

    def turn(self) -> None:
        """One loop iteration: the timers due, then what was ready at its start."""
        due = [cb for at, cb in self.timers if at <= self.now]
        self.timers = [(at, cb) for at, cb in self.timers if at > self.now]
        ready, self.ready = self.ready, []
        for callback in due + ready:
            callback()


def make() -> tuple[Ended[Out], list[int], FakeLoop, FakeLoop]:
    """Ended on a fake loop, what its observer saw, the loop, and the loop as the clock."""
    loop = FakeLoop()
    seen: list[int] = []
    return Ended([lambda out: seen.append(out.n)], loop.time, loop), seen, loop, loop


def test_outcomes_wait_for_a_turn_then_run_in_batches_in_order() -> None:
    ended, seen, loop, clock = make()
    for n in range(BATCH + 3):
        ended.add(Out(n, clock.now))
    assert seen == [] and len(ended) == BATCH + 3 and len(loop.ready) == 1  # one turn asked
    loop.turn()
    assert seen == list(range(BATCH))
    loop.turn()
    assert seen == list(range(BATCH + 3)) and len(ended) == 0
    loop.turn()  # nothing left: the chain ends
    assert loop.ready == [] and loop.timers == []


def test_a_turn_with_a_request_head_waits_for_a_quiet_one() -> None:
    ended, seen, loop, clock = make()
    ended.add(Out(1, clock.now))
    ended.busy()
    loop.turn()
    assert seen == [] and loop.ready == [] and len(loop.timers) == 1  # waits WAIT
    clock.now += WAIT
    loop.turn()  # a quiet turn: it runs
    assert seen == [1]


def test_the_oldest_waits_no_longer_than_max_age() -> None:
    ended, seen, loop, clock = make()
    ended.add(Out(1, clock.now))
    while clock.now - 100.0 < MAX_AGE:
        ended.busy()  # a head in every turn
        loop.turn()
        assert seen == []
        clock.now += WAIT
    ended.busy()
    loop.turn()
    assert seen == [1]


def test_settle_runs_everything_queued_now_and_once() -> None:
    ended, seen, loop, clock = make()
    for n in range(3):
        ended.add(Out(n, clock.now))
    ended.settle()
    assert seen == [0, 1, 2] and len(ended) == 0
    loop.turn()
    assert seen == [0, 1, 2]  # (the pending turn finds nothing)
    ended.add(Out(3, clock.now))  # and the next outcome asks for a turn again
    loop.turn()
    assert seen == [0, 1, 2, 3]


def test_past_the_limit_a_turn_runs_everything_logged_once_per_episode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ended, seen, loop, clock = make()
    with caplog.at_level(logging.WARNING, logger=ended_module.log.name):
        for n in range(LIMIT):
            ended.add(Out(n, clock.now))
        assert seen == []  # never inside a request's finish
        ended.busy()
        loop.turn()
        assert seen == list(range(LIMIT)) and len(ended) == 0
        for n in range(LIMIT, 2 * LIMIT):  # the same episode: not logged again
            ended.add(Out(n, clock.now))
        loop.turn()
        assert seen == list(range(2 * LIMIT))
        assert caplog.text.count("(LIMIT)") == 1
        ended.add(Out(2 * LIMIT, clock.now))
        loop.turn()  # a turn empties the queue the normal way: the episode is over
        for n in range(2 * LIMIT + 1, 3 * LIMIT + 1):
            ended.add(Out(n, clock.now))
        loop.turn()
    assert seen == list(range(3 * LIMIT + 1))
    assert caplog.text.count("(LIMIT)") == 2


def test_sustained_load_past_batch_with_a_head_every_turn_holds_the_age_bound() -> None:
    """Review s12 finding 2: more than BATCH ends per turn and a request head in every turn
    (no quiet turn at all): each turn runs what is MAX_AGE old, so the oldest never waits
    past MAX_AGE plus a turn, the queue stays at what ends in MAX_AGE, and no turn runs a
    burst."""
    ended, seen, loop, clock = make()
    per_turn = BATCH + 4  # (in MAX_AGE: well under LIMIT)
    step = 2.0**-9  # seconds per loop iteration (exact in binary; > WAIT: the timer is due)
    turns_in_max_age = int(MAX_AGE / step)
    n = 0
    oldest_wait = 0.0
    most_queued = 0
    most_run = 0
    for _ in range(20 * turns_in_max_age):
        before = len(seen)
        for _ in range(per_turn):
            ended.add(Out(n, clock.now))
            n += 1
        assert len(seen) == before  # nothing runs inside a request's finish
        most_queued = max(most_queued, len(ended))
        ended.busy()  # a request head in this iteration
        before = len(seen)
        loop.turn()
        most_run = max(most_run, len(seen) - before)
        if ended._queue:
            oldest_wait = max(oldest_wait, clock.now - ended._queue[0].ended)
        clock.now += step
    assert seen == list(range(len(seen)))  # in order
    assert len(seen) >= n - per_turn * (turns_in_max_age + 1)  # kept up
    assert oldest_wait <= MAX_AGE + WAIT
    assert most_queued <= per_turn * (turns_in_max_age + 1) + BATCH
    assert most_run <= per_turn + BATCH


def test_a_failing_observer_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = FakeLoop()
    seen: list[int] = []

    def broken(out: Out) -> None:
        raise ValueError("observer bug")

    ended = Ended([broken, lambda out: seen.append(out.n)], loop.time, loop)
    ended.add(Out(1, loop.now))
    with caplog.at_level(logging.ERROR, logger=ended_module.log.name):
        ended.settle()
    assert seen == [1] and "observer failed" in caplog.text


def test_without_a_running_loop_outcomes_are_observed_at_once() -> None:
    seen: list[int] = []
    ended: Ended[Out] = Ended([lambda out: seen.append(out.n)], FakeLoop().time)
    ended.add(Out(1, 0.0))
    assert seen == [1]


@pytest.mark.anyio
async def test_on_a_real_loop_they_run_at_its_next_turns() -> None:
    seen: list[int] = []
    loop = asyncio.get_running_loop()
    ended: Ended[Out] = Ended([lambda out: seen.append(out.n)], loop.time)
    for n in range(BATCH * 2):
        ended.add(Out(n, loop.time()))
    assert seen == []
    for _ in range(3):
        await asyncio.sleep(0)
    assert seen == list(range(BATCH * 2))


def test_on_a_closed_loop_outcomes_are_observed_at_once() -> None:
    class Closed(FakeLoop):
        def call_soon(self, callback: Callable[[], object]) -> None:
            raise RuntimeError("Event loop is closed")

    loop = Closed()
    seen: list[int] = []
    ended = Ended([lambda out: seen.append(out.n)], loop.time, loop)
    ended.add(Out(1, loop.now))
    ended.add(Out(2, loop.now))
    assert seen == [1, 2] and len(ended) == 0


def test_a_turn_that_raises_does_not_leave_the_schedule_stuck() -> None:
    """Review s12 finding 5: the exception reaches the loop's handler, and the next outcome
    asks for a turn again."""
    loop = FakeLoop()
    seen: list[int] = []
    fail = [True]

    def clock() -> float:
        if fail.pop() if fail else False:
            raise RuntimeError("clock bug")
        return loop.now

    ended: Ended[Out] = Ended([lambda out: seen.append(out.n)], clock, loop)
    ended.add(Out(1, loop.now))
    with pytest.raises(RuntimeError, match="clock bug"):
        loop.turn()
    assert loop.ready == [] and seen == []
    ended.add(Out(2, loop.now))
    assert len(loop.ready) == 1
    loop.turn()
    assert seen == [1, 2]


def test_detached_it_asks_the_next_loop_for_turns() -> None:
    """Review s12 finding 5: a loop that stopped with a turn pending (a lifecycle over) does
    not keep the schedule: ``detach`` (RouterApp.running's end) lets the next loop's turns run."""
    old = FakeLoop()
    seen: list[int] = []
    ended: Ended[Out] = Ended([lambda out: seen.append(out.n)], old.time, old)
    ended.add(Out(1, old.now))  # its turn never comes: the loop stopped
    ended.settle()
    ended.detach()

    async def later() -> None:
        ended.add(Out(2, 0.0))
        assert seen == [1]
        for _ in range(3):
            await asyncio.sleep(0)
        assert seen == [1, 2]

    asyncio.run(later())
    assert old.ready == [ended._turn]  # (the old loop's turn, never run)
