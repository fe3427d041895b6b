"""The traffic over an interval from the engines' own counters (router.planning.traffic)."""

from __future__ import annotations

from router.planning.traffic import CounterWatch, Reading, moved, traffic


def test_arrivals_are_what_ended_plus_what_the_backlog_grew_by() -> None:
    w = CounterWatch()
    w.update({"a": Reading(10, 1000, 500, 2), "b": Reading(5, 400, 100, 0)})
    w.update({"a": Reading(14, 1800, 900, 5), "b": Reading(7, 600, 300, 1)})
    t = w.take()
    # a: 4 ended, backlog +3; b: 2 ended, backlog +1
    assert (t.ended, t.arrivals) == (6, 10)
    tr = traffic(t, 60.0, own_arrivals=3)
    assert tr.source == "engines" and tr.arrivals == 10
    assert tr.prompt_mean == (800 + 200) / 6 and tr.output_mean == (400 + 200) / 6
    # the next interval starts from here
    assert w.take().arrivals == 0


def test_a_counter_that_went_back_is_an_engine_that_restarted_from_zero() -> None:
    assert moved(3, 100) == 3 and moved(110, 100) == 10 and moved(None, 1) is None
    w = CounterWatch()
    w.update({"a": Reading(100, 0, 0, 0)})
    w.update({"a": Reading(3, 0, 0, 0)})
    assert w.take().ended == 3


def test_an_engine_first_seen_counts_from_its_first_reading_unless_it_was_seen_loading() -> None:
    w = CounterWatch()
    w.update({"old": Reading(500, 0, 0, 4)})
    assert w.take().arrivals == 0  # (what it did before we looked is not this interval's)
    w.update({"old": Reading(500, 0, 0, 4), "new": Reading(7, 0, 0, 1)}, fresh={"new"})
    assert w.take().arrivals == 8


def test_without_a_request_counter_the_router_counts_its_own() -> None:
    w = CounterWatch()
    w.update({"llama": Reading(None, 10, 10, 0)})
    w.update({"llama": Reading(None, 90, 50, 2)})
    t = w.take()
    assert not t.counted
    tr = traffic(t, 30.0, own_arrivals=12)
    assert (tr.source, tr.arrivals, tr.prompt_mean) == ("router", 12, None)


def test_engines_that_counted_nothing_while_the_router_sent_requests_defer_to_the_router() -> None:
    """(A scrape that has not caught up yet: the router's own count is the better one.)"""
    w = CounterWatch()
    w.update({"a": Reading(5, 0, 0, 0)})
    w.update({"a": Reading(5, 0, 0, 0)})
    tr = traffic(w.take(), 60.0, own_arrivals=4)
    assert (tr.source, tr.arrivals) == ("router", 4)
    assert traffic(w.take(), 60.0, own_arrivals=0) == (60.0, 0, "engines", None, None)
