"""In-flight leases count exactly and release once."""

from __future__ import annotations

from router.account.inflight import InflightTracker


def tracker() -> InflightTracker:
    return InflightTracker([("speculative", "s1"), ("speculative", "s2"), ("baseline", "b1")])


def test_acquire_move_release() -> None:
    t = tracker()
    lease = t.acquire("s1")
    assert t.snapshot() == {"speculative": 1, "baseline": 0, "total": 1}
    lease.move("b1")
    assert t.snapshot() == {"speculative": 0, "baseline": 1, "total": 1}
    assert t.by_backend == {"s1": 0, "s2": 0, "b1": 1}
    assert t.started == {"s1": 1, "s2": 0, "b1": 1}
    assert lease.release() is True
    assert lease.release() is False
    assert t.snapshot() == {"speculative": 0, "baseline": 0, "total": 0}
    lease.move("s2")  # a released lease moves nothing
    assert t.by_backend == {"s1": 0, "s2": 0, "b1": 0}


def test_counts_are_not_clamped() -> None:
    t = tracker()
    leases = [t.acquire("s2") for _ in range(5)]
    for lease in leases:
        lease.release()
    assert t.total == 0 and t.by_pool["speculative"] == 0


def test_area_gives_mean_concurrency() -> None:
    now = [0.0]
    t = InflightTracker([("speculative", "s")], clock=lambda: now[0])
    a = t.acquire("s")
    now[0] = 1.0
    b = t.acquire("s")
    start = t.area("s", 1.0)
    now[0] = 3.0
    a.release()
    now[0] = 5.0
    # b saw 2 in flight for 2 s, then 1 for 2 s: mean 1.5
    assert (t.area("s", 5.0) - start) / (5.0 - 1.0) == 1.5
    b.release()
