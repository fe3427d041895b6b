"""The set diffing a roster applies: joins, drains, reinstatements, removals, and comebacks
(an address that left and came back is a new member that starts fresh). In process, values."""

from __future__ import annotations

from router.members.member import Changes, Member, diff
from router.members.roster import drained, overdue
from router.pools import BASELINE, SPECULATIVE

A, B, C = "http://10.0.0.1:30000", "http://10.0.0.2:30000", "http://10.0.0.3:30000"


def member(url: str, incarnation: int, pool: str = SPECULATIVE) -> Member:
    return Member(
        SPECULATIVE if pool == SPECULATIVE else BASELINE, url, "dns", "e.svc", incarnation, 0.0
    )


def by_url(*members: Member) -> dict[str, Member]:
    return {m.url: m for m in members}


def test_no_change_is_an_empty_change() -> None:
    a = member(A, 1)
    changes = diff(by_url(a), [a], 3)
    assert not changes
    assert changes == Changes(3)


def test_joins_and_drains_and_removals() -> None:
    a, b, c = member(A, 1), member(B, 2), member(C, 3)
    changes = diff(by_url(a, b), [a.draining(10.0, 20.0), c], 7)
    assert changes.joined == (c,)
    assert [m.url for m in changes.draining] == [A]
    assert changes.draining[0].drain_deadline == 20.0
    assert changes.removed == (b,)  # gone without a word: removed
    assert changes.reinstated == ()
    assert changes.generation == 7


def test_a_draining_member_that_comes_back_is_reinstated_as_it_was() -> None:
    a = member(A, 1)
    leaving = a.draining(10.0, 20.0)
    changes = diff(by_url(leaving), [leaving.reinstated()])
    assert changes.reinstated == (a,)
    assert (changes.joined, changes.removed) == ((), ())


def test_a_comeback_after_removal_is_a_new_member() -> None:
    old = member(A, 1)
    # between two looks it left, was removed, and joined again: a new incarnation
    new = member(A, 4)
    changes = diff(by_url(old), [new])
    assert changes.removed == (old,)
    assert changes.joined == (new,)


def test_a_move_to_the_other_pool_is_a_removal_and_a_join() -> None:
    old = member(A, 1, SPECULATIVE)
    moved = member(A, 1, BASELINE)
    changes = diff(by_url(old), [moved])
    assert (changes.removed, changes.joined) == ((old,), (moved,))


def test_drained_needs_nothing_in_flight_for_a_while() -> None:
    a = member(A, 1).draining(10.0, 100.0)
    b = member(B, 2).draining(10.0, 100.0)
    c = member(C, 3)  # active: never "drained"
    flight = {A: 0, B: 2, C: 0}
    assert drained([a, b, c], flight, now=10.05, settle=0.2) == []
    assert drained([a, b, c], flight, now=10.5, settle=0.2) == [A]
    assert overdue([a, b, c], 99.0) == []
    assert [m.url for m in overdue([a, b, c], 100.0)] == [A, B]
