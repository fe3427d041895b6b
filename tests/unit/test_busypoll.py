"""BusyPoll's schedule, on a fake loop and a fake clock: no sockets, no sleeping."""

from __future__ import annotations

from collections.abc import Callable

from router.fastpath.busypoll import BusyPoll


class FakeLoop:
    def __init__(self) -> None:
        self.ready: list[Callable[[], object]] = []

    def call_soon(self, callback: Callable[[], object]) -> None:
        self.ready.append(callback)

    def turn(self) -> None:
        """One loop iteration: run what was ready at its start."""
        ready, self.ready = self.ready, []
        for callback in ready:
            callback()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(window: float = 50e-6) -> tuple[BusyPoll, FakeLoop, Clock]:
    loop, clock = FakeLoop(), Clock()
    return BusyPoll(loop, window, clock), loop, clock


def test_nothing_spins_until_poked() -> None:
    busy, loop, _ = make()
    assert not busy.running and loop.ready == []


def test_a_poke_keeps_the_loop_polling_for_the_window_then_lets_it_sleep() -> None:
    busy, loop, clock = make(50e-6)
    busy.poke()
    assert busy.running and len(loop.ready) == 1
    for _ in range(4):  # 40 µs of turns: still inside the window
        clock.now += 10e-6
        loop.turn()
        assert len(loop.ready) == 1
    clock.now += 11e-6  # 51 µs since the poke
    loop.turn()
    assert loop.ready == [] and not busy.running
    assert busy.spins == 4


def test_pokes_while_spinning_extend_the_window_without_a_second_turn() -> None:
    busy, loop, clock = make(50e-6)
    busy.poke()
    for _ in range(10):  # activity every 30 µs for 300 µs
        clock.now += 30e-6
        busy.poke()
        assert len(loop.ready) == 1  # one turn in flight, never two
        loop.turn()
    clock.now += 49e-6
    loop.turn()
    assert busy.running
    clock.now += 2e-6
    loop.turn()
    assert not busy.running


def test_a_poke_after_sleeping_starts_a_new_spin() -> None:
    busy, loop, clock = make(50e-6)
    busy.poke()
    clock.now += 1.0
    loop.turn()
    assert not busy.running
    busy.poke()
    assert busy.running and len(loop.ready) == 1


def test_stop_lets_the_loop_sleep_at_the_next_turn_and_for_good() -> None:
    busy, loop, _ = make(10.0)
    busy.poke()
    loop.turn()
    busy.stop()
    busy.poke()  # (a request cancelled at shutdown ends)
    loop.turn()
    assert not busy.running and loop.ready == []
    busy.poke()
    assert not busy.running and loop.ready == []
