"""A name's answers and the addresses in force: a failure keeps the last good set, an empty
answer empties it only after the grace period, a name that never resolved stays empty. In
process, values (``router.members.grace``)."""

from __future__ import annotations

from router.members.grace import Empty, Failed, NameState, Resolved, fold, result_of

GRACE = 30.0
TWO = ("10.0.0.1", "10.0.0.2")


def resolved() -> NameState:
    state, events = fold(NameState(), Resolved(TWO, 5), 0.0, GRACE)
    assert events == ("resolved",)
    assert state.addresses == TWO and state.ttl == 5
    return state


def test_a_failure_keeps_the_last_good_set_and_says_so_once() -> None:
    state = resolved()
    state, events = fold(state, Failed("timeout"), 5.0, GRACE)
    assert events == ("failing",)
    assert state.addresses == TWO and state.failing and state.error == "timeout"
    for t in (10.0, 100.0, 10_000.0):  # however long it lasts
        state, events = fold(state, Failed("timeout"), t, GRACE)
        assert events == () and state.addresses == TWO
    assert state.failing_since == 5.0
    state, events = fold(state, Resolved(TWO), 10_001.0, GRACE)
    assert events == ("recovered",)
    assert not state.failing and state.error is None


def test_an_empty_answer_empties_the_set_only_after_the_grace_period() -> None:
    state = resolved()
    state, events = fold(state, Empty("NXDOMAIN"), 10.0, GRACE)
    assert events == ("emptying",)
    assert state.addresses == TWO and state.grace_left(10.0, GRACE) == GRACE
    state, events = fold(state, Empty("NODATA"), 39.0, GRACE)
    assert events == () and state.addresses == TWO
    assert state.grace_left(39.0, GRACE) == 1.0
    state, events = fold(state, Empty("NODATA"), 40.0, GRACE)
    assert events == ("emptied",)
    assert state.addresses == () and state.empty_reason == "NODATA"


def test_an_answer_within_the_grace_period_starts_it_over() -> None:
    state = resolved()
    state, _ = fold(state, Empty("NXDOMAIN"), 10.0, GRACE)
    state, events = fold(state, Resolved(TWO), 20.0, GRACE)
    assert events == () and state.empty_since is None
    state, events = fold(state, Empty("NXDOMAIN"), 45.0, GRACE)  # a new grace period
    assert events == ("emptying",) and state.addresses == TWO
    # failures meanwhile do not stop the clock, and do not empty the set either
    state, _ = fold(state, Failed("SERVFAIL"), 60.0, GRACE)
    state, events = fold(state, Empty("NXDOMAIN"), 75.0, GRACE)
    assert events == ("recovered", "emptied") and state.addresses == ()


def test_a_set_that_shrinks_shrinks_at_once() -> None:
    state, events = fold(resolved(), Resolved(TWO[:1]), 1.0, GRACE)
    assert events == ("changed",) and state.addresses == TWO[:1]


def test_a_name_that_never_resolved_stays_empty_and_says_why_once() -> None:
    state, events = fold(NameState(), Empty("NXDOMAIN"), 0.0, GRACE)
    assert events == ("absent",)
    assert state.addresses == () and state.answered and not state.ever_resolved
    state, events = fold(state, Empty("NXDOMAIN"), 100.0, GRACE)
    assert events == () and state.grace_left(100.0, GRACE) is None
    state, events = fold(state, Resolved(TWO), 200.0, GRACE)
    assert events == ("resolved",) and state.addresses == TWO


def test_a_name_whose_server_never_answers_is_failing_not_empty() -> None:
    state, events = fold(NameState(), Failed("no answer from 127.0.0.9:53"), 0.0, GRACE)
    assert events == ("failing",)
    assert state.addresses == () and not state.answered


def test_results_as_the_metrics_label_them() -> None:
    assert [result_of(a) for a in (Resolved(TWO), Empty("NODATA"), Failed("x"))] == [
        "resolved",
        "empty",
        "failed",
    ]
