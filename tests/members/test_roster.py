"""A process's view of the members: ``sync`` tells its listeners what changed before the new
set is routable, and keeps the routable lists the decider holds (in place). In process."""

from __future__ import annotations

from router.members.member import Changes
from router.members.roster import Roster
from router.members.store import LocalStore
from router.pools import BASELINE, SPECULATIVE

A, B = "http://10.0.0.1:30000", "http://10.0.0.2:30000"


def test_listeners_hear_each_change_before_it_is_routable() -> None:
    store = LocalStore(8)
    roster = Roster(store)
    held = roster.pools[SPECULATIVE]  # what a reader keeps
    heard: list[tuple[Changes, list[str]]] = []
    roster.subscribe(lambda c: heard.append((c, list(held))))
    assert roster.sync() is not None and heard == []  # generation 0: nothing yet
    assert roster.sync() is None  # nothing new: not even a read

    store.join(SPECULATIVE, A, "dns", "e.svc", 0.0)
    store.join(BASELINE, B, "admin", None, 0.0)
    changes = roster.sync()
    assert changes is not None
    ((told, routable_then),) = heard
    assert [m.url for m in told.joined] == [A, B] and routable_then == []
    assert held == [A] and roster.pools[BASELINE] == [B]
    assert roster.generation == store.generation

    store.drain(A, 1.0, 2.0)
    roster.sync()
    told, routable_then = heard[-1]
    assert [m.url for m in told.draining] == [A] and routable_then == [A]
    assert held == [] and [m.url for m in roster.of_pool(SPECULATIVE)] == [A]  # still listed

    store.remove(A)
    roster.sync()
    assert [m.url for m in heard[-1][0].removed] == [A]
    assert roster.get(A) is None and roster.of_pool(SPECULATIVE) == []


def test_a_failing_listener_does_not_hold_the_others_back() -> None:
    store = LocalStore(8)
    roster = Roster(store)
    seen: list[int] = []

    def broken(changes: Changes) -> None:
        raise RuntimeError("boom")

    roster.subscribe(broken)
    roster.subscribe(lambda c: seen.append(c.generation))
    store.join(SPECULATIVE, A, "static", None, 0.0)
    roster.sync()
    assert seen == [store.generation] and roster.pools[SPECULATIVE] == [A]
