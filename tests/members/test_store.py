"""The rules every store keeps (``router.members.store``): one pool per URL, reinstatement
while draining, a comeback after removal starts fresh, the capacity. Both stores: the one of a
process, and the shared table's under ``--workers`` (two stores over one table stand in for
two workers). In process."""

from __future__ import annotations

import pytest

from router.account.shared import SharedStore, SharedTable
from router.members.store import (
    AlreadyMember,
    Full,
    InOtherPool,
    LocalStore,
    NotMember,
    Store,
)
from router.pools import BASELINE, SPECULATIVE

A, B, C = "http://10.0.0.1:30000", "http://10.0.0.2:30000", "http://10.0.0.3:30000"


def stores() -> list[Store]:
    table = SharedTable.create(1, capacity=2)  # (one worker: see the test of two below)
    return [LocalStore(2), SharedStore(table, 0)]


@pytest.fixture(params=["local", "shared"])
def store(request: pytest.FixtureRequest) -> Store:
    return stores()[0 if request.param == "local" else 1]


def test_join_drain_reinstate_remove(store: Store) -> None:
    g0 = store.generation
    a = store.join(SPECULATIVE, A, "dns", "e.svc", 1.0)
    assert (a.pool, a.url, a.source, a.name, a.active) == (SPECULATIVE, A, "dns", "e.svc", True)
    assert store.generation > g0
    with pytest.raises(AlreadyMember):
        store.join(SPECULATIVE, A, "admin", None, 2.0)
    with pytest.raises(InOtherPool, match="is in the speculative pool"):
        store.join(BASELINE, A, "admin", None, 2.0)
    leaving = store.drain(A, 3.0, 33.0)
    assert (leaving.state, leaving.drain_since, leaving.drain_deadline) == ("draining", 3.0, 33.0)
    assert store.drain(A, 4.0, 44.0).drain_deadline == 33.0  # the first deadline holds
    with pytest.raises(InOtherPool, match="draining from the speculative pool"):
        store.join(BASELINE, A, "admin", None, 5.0)
    back = store.join(SPECULATIVE, A, "admin", None, 6.0)  # reinstated, same incarnation
    assert back.active and back.incarnation == a.incarnation and back.source == "admin"
    store.drain(A, 7.0, 37.0)
    store.remove(A)
    assert store.read()[1] == ()
    store.applied(store.generation)
    again = store.join(BASELINE, A, "admin", None, 8.0)  # gone: it may join either pool, fresh
    assert again.incarnation != a.incarnation and again.pool == BASELINE
    with pytest.raises(NotMember):
        store.drain(B, 9.0, 10.0)
    store.remove(B)  # not a member: nothing


def test_capacity_counts_draining_members(store: Store) -> None:
    store.join(SPECULATIVE, A, "static", None, 0.0)
    store.join(BASELINE, B, "static", None, 0.0)
    store.drain(B, 1.0, 2.0)
    with pytest.raises(Full, match="at most 2 backends"):
        store.join(BASELINE, C, "admin", None, 1.0)
    store.remove(B)
    store.applied(store.generation)
    assert store.join(BASELINE, C, "admin", None, 1.0).url == C
    generation, members = store.read()
    assert [m.url for m in members] == [A, C]  # in the order they joined
    assert generation == store.generation


def test_a_shared_place_is_given_again_only_once_every_worker_let_go() -> None:
    table = SharedTable.create(2, capacity=1)
    first, second = SharedStore(table, 0), SharedStore(table, 1)
    first.join(SPECULATIVE, A, "admin", None, 0.0)
    first.drain(A, 0.0, 1.0)
    first.remove(A)
    first.applied(first.generation)
    # the second worker has not applied the removal yet: its counts there may still be A's
    with pytest.raises(Full):
        first.join(SPECULATIVE, B, "admin", None, 1.0)
    second.applied(second.generation)
    assert first.join(SPECULATIVE, B, "admin", None, 1.0).url == B
    assert [m.url for m in second.read()[1]] == [B]
