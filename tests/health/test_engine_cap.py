"""The cap on running requests an engine shows: a queue that stays while the batch does not grow."""

from __future__ import annotations

from router.health.poller import EngineLoad, cap_after


def load(running: int, queued: int, cap: int | None = None) -> EngineLoad:
    return EngineLoad(running, queued, None, 0.0, 0, "sglang", cap)


def test_a_queue_at_a_steady_batch_is_the_cap() -> None:
    assert cap_after(load(48, 5), 48, 9) == 48


def test_a_moment_of_queueing_is_not() -> None:
    # requests wait for the next iteration boundary at any load: one scrape says nothing
    assert cap_after(load(3, 0), 3, 2) is None
    assert cap_after(None, 3, 5) is None
    # nor does a queue while the batch still grows
    assert cap_after(load(10, 3), 14, 3) is None


def test_the_cap_once_seen_is_kept_and_only_raised() -> None:
    assert cap_after(load(20, 0, cap=48), 20, 0) == 48
    assert cap_after(load(64, 4, cap=48), 64, 6) == 64
    assert cap_after(load(30, 4, cap=48), 30, 6) == 48
