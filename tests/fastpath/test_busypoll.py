"""BusyPoll's schedule, on a fake loop and a fake clock: no sockets, no sleeping."""

from __future__ import annotations

from collections.abc import Callable

from router.fastpath.busypoll import BusyPoll, ShareWatch


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


def test_a_held_poll_does_not_spin_and_a_spin_under_way_ends_at_its_next_turn() -> None:
    busy, loop, clock = make(50e-6)
    busy.poke()
    assert busy.running
    busy.hold(True)
    clock.now += 10e-6
    loop.turn()  # inside the window, but held: the spin ends
    assert not busy.running and loop.ready == []
    busy.poke()
    assert not busy.running and loop.ready == []  # held: pokes start nothing
    busy.hold(False)
    busy.poke()
    assert busy.running and len(loop.ready) == 1


def test_the_core_looks_shared_past_the_limit_and_its_own_after_quiet_periods() -> None:
    watch = ShareWatch(limit=200.0, wait_limit=0.01, quiet=3)
    assert watch.update(0.0, 1_000) is False and watch.rate is None  # one reading: no rate yet
    assert watch.update(1.0, 1_040) is False  # 40/s: a core of its own
    assert watch.rate == 40.0 and watch.wait is None  # (no run-queue figure from this kernel)
    assert watch.update(2.0, 2_040) is True  # 1,000/s: preempted all the time
    assert watch.update(3.0, 2_050) is True  # one quiet period is not enough...
    assert watch.update(4.0, 2_060) is True
    assert watch.update(5.0, 2_500) is True  # ...and a busy one starts the count again
    for t in (6.0, 7.0):
        assert watch.update(t, 2_500) is True
    assert watch.update(8.0, 2_500) is False  # three quiet periods in a row
    assert watch.update(8.0, 9_999) is False  # no time passed: no rate, no change


def test_waiting_for_the_core_alone_makes_it_shared() -> None:
    watch = ShareWatch(limit=200.0, wait_limit=0.01, quiet=1)
    watch.update(0.0, 0, 5.0)
    assert watch.update(1.0, 10, 5.001) is False  # 1 ms of waiting in a second: its own
    assert watch.wait is not None and abs(watch.wait - 0.001) < 1e-9
    assert watch.update(2.0, 20, 5.051) is True  # 50 ms: something else runs there
    assert watch.update(3.0, 30, 5.052) is False  # quiet again (quiet=1)
    assert watch.update(4.0, 40, None) is False and watch.wait is None  # the figure went away
