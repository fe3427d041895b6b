"""The shared in-flight table of ``serve --workers N``: slots written by one worker each, summed by
every reader, reclaimed after a worker dies; and the crossover board over it.

Two ``SharedTracker`` objects on one table stand in for two workers (the e2e test in
tests/process/test_workers_e2e.py forks real ones); clocks are moved by the test.
"""

from __future__ import annotations

import os
from pathlib import Path

from router.account.shared import (
    M_WORDS,
    S_BACKENDS,
    S_SEQ,
    CrossoverBoard,
    SharedTable,
    SharedTracker,
    slot_words,
)
from router.decide import table as tables
from router.learn.keeper import CrossoverKeeper
from router.pools import BASELINE, SPECULATIVE, Pool
from router.settings import Settings
from router.workers import uvicorn_workers
from tests.support.tables import model_table

S1, S2, B1 = "http://s1", "http://s2", "http://b1"
BACKENDS: list[tuple[Pool, str]] = [(SPECULATIVE, S1), (SPECULATIVE, S2), (BASELINE, B1)]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pair(clock: Clock | None = None) -> tuple[SharedTable, SharedTracker, SharedTracker]:
    clock = clock or Clock()
    table = SharedTable.create(2, BACKENDS)
    return table, SharedTracker(BACKENDS, table, 0, clock), SharedTracker(BACKENDS, table, 1, clock)


def test_slots_are_whole_cache_lines() -> None:
    assert slot_words(3) * 8 % 64 == 0
    assert slot_words(3) >= S_BACKENDS + 4 * 3
    table = SharedTable.create(4, BACKENDS)
    # the header, four slots, and one member record (whole cache lines too) per backend place
    assert M_WORDS * 8 % 64 == 0
    assert len(table.buffer) == (8 + 4 * slot_words(3) + 3 * M_WORDS) * 8
    assert SharedTable.create(2, BACKENDS, capacity=64).stride == slot_words(64)


def test_every_reader_sees_the_sum_and_each_worker_its_own() -> None:
    _, a, b = pair()
    one = a.acquire(S1)
    two = b.acquire(S1)
    three = b.acquire(B1)
    for tracker in (a, b):
        assert dict(tracker.by_backend) == {S1: 2, S2: 0, B1: 1}
        assert tracker.snapshot() == {SPECULATIVE: 2, BASELINE: 1, "total": 3}
        assert dict(tracker.started) == {S1: 2, S2: 0, B1: 1}
    assert dict(a.own_by_backend) == {S1: 1, S2: 0, B1: 0}
    assert dict(b.own_by_backend) == {S1: 1, S2: 0, B1: 1}
    two.move(S2)  # a retry elsewhere before any byte
    assert dict(a.by_backend) == {S1: 1, S2: 1, B1: 1}
    assert dict(a.started) == {S1: 2, S2: 1, B1: 1}
    three.mark_slow()
    assert dict(a.slow_clients) == {SPECULATIVE: 0, BASELINE: 1}
    for lease in (one, two, three):
        assert lease.release() is True
        assert lease.release() is False
    assert a.snapshot() == {SPECULATIVE: 0, BASELINE: 0, "total": 0}
    assert dict(b.slow_clients) == {SPECULATIVE: 0, BASELINE: 0}
    assert dict(b.started) == {S1: 2, S2: 1, B1: 1}  # never steps back


def test_the_integral_is_the_machines() -> None:
    clock = Clock()
    _, a, b = pair(clock)
    first = a.acquire(S1)
    clock.now += 1.0
    second = b.acquire(S1)
    start = a.area(S1, clock.now)
    clock.now += 2.0
    first.release()
    clock.now += 2.0
    # the second request saw 2 in flight for 2 s (one per worker), then 1 for 2 s: mean 1.5
    assert (b.area(S1, clock.now) - start) / 4.0 == 1.5
    second.release()


def test_reclaim_releases_a_dead_workers_counts_and_keeps_its_history() -> None:
    clock = Clock()
    table, a, b = pair(clock)
    kept = a.acquire(S1)
    for url in (S1, S2, B1):
        b.acquire(url)  # held when the worker "dies": never released
    assert a.total == 4
    clock.now += 3.0
    area_s1 = a.area(S1, clock.now)
    assert table.reclaim(1, clock.now) == 3
    assert a.snapshot() == {SPECULATIVE: 1, BASELINE: 0, "total": 1}
    assert dict(a.by_backend) == {S1: 1, S2: 0, B1: 0}
    assert dict(a.started) == {S1: 2, S2: 1, B1: 1}
    assert a.area(S1, clock.now) == area_s1  # what was in flight until now stays counted
    clock.now += 1.0
    assert a.area(S1, clock.now) == area_s1 + 1.0  # and only worker 0's request adds to it
    # a replacement takes the slot over and carries on from there
    again = SharedTracker(BACKENDS, table, 1, clock)
    again.acquire(S2).release()
    assert dict(a.started) == {S1: 2, S2: 2, B1: 1}
    assert table.workers()[1]["pid"] == os.getpid()
    assert table.workers()[1]["started"] == 4
    kept.release()
    assert a.total == 0


def test_a_writer_stopped_mid_write_does_not_hang_readers() -> None:
    clock = Clock()  # starts at 100
    table, a, b = pair(clock)
    a.acquire(S1)
    b.acquire(S1)
    for slot in (0, 1):  # odd: as if stopped between its two writes
        table.ints[table.bases[slot] + S_SEQ] += 1
        # returns after bounded retries, with what it read: one in flight per slot since 100
        assert a.area(S1, 102.0) == 4.0
    table.reclaim(1, 102.0)
    assert table.ints[table.bases[1] + S_SEQ] % 2 == 0


def test_the_board_carries_one_crossover_for_all_workers(tmp_path: Path) -> None:
    clock = Clock()
    table, a, b = pair(clock)
    board = CrossoverBoard(table)
    assert board.read() is None
    path = tmp_path / "table.json"
    settings = Settings(
        speculative_urls=[S1, S2], baseline_urls=[B1], table_path=path, learn_interval=1.0
    )
    leader = CrossoverKeeper(settings, a, {}, model_table(1024, 256, crossover=5), clock, board)
    follower = CrossoverKeeper(settings, b, {}, None, clock, board, leader=False)
    # the first keeper up published its start; the follower (no table) routes with it
    assert (follower.crossover, follower.source, follower.pinned) == (5, "calibrated", False)
    follower.pin(7)  # an operator's PUT landed on the follower
    assert (leader.crossover, leader.source, leader.pinned) == (7, "configured", True)
    follower.persist()
    assert not path.exists()  # only the leader writes the table file
    leader.persist()
    assert tables.load(path).crossover == 7
    raw = tables.to_json(model_table(1024, 256, crossover=3))
    follower.replace(raw)  # lifts the pin for everyone
    assert (leader.crossover, leader.pinned) == (3, False)
    leader.replace(raw, publish=False)  # following the other's table: the board stays
    assert board.read() == (3, "calibrated", False, False)
    assert follower.update() is None  # followers never move the crossover themselves


def test_uvicorn_workers_is_read_from_the_command_line() -> None:
    uv = "/venv/bin/uvicorn"
    assert uvicorn_workers([uv, "router.app:app", "--workers", "4"], {}) == 4
    assert uvicorn_workers([uv, "router.app:app", "--workers=3"], {}) == 3
    assert uvicorn_workers([uv, "router.app:app"], {"WEB_CONCURRENCY": "2"}) == 2
    assert uvicorn_workers([uv, "router.app:app"], {}) == 1
    assert uvicorn_workers([uv, "router.app:app", "--reload", "--workers", "2"], {}) == 1
    main = "/venv/lib/python3.11/site-packages/uvicorn/__main__.py"
    assert uvicorn_workers([main, "router.app:app", "--workers", "2"], {}) == 2
    assert uvicorn_workers(["/venv/bin/gunicorn", "--workers", "2"], {}) == 1
