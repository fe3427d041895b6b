"""The book of requests routed and not yet ended (router/gateway/leases.py)."""

from __future__ import annotations

from router.account.inflight import InflightTracker
from router.account.outcome import Outcome
from router.gateway.leases import Held, LeaseBook
from router.pools import SPECULATIVE


def held(tracker: InflightTracker, since: float) -> Held:
    return Held(tracker.acquire("http://a"), Outcome(path="/v1/x", started=since), since)


def test_one_id_twice_ends_oldest_first_and_expiry_takes_the_old_ones() -> None:
    tracker = InflightTracker([(SPECULATIVE, "http://a")], clock=lambda: 0.0)
    book = LeaseBook()
    first, second, other = held(tracker, 1.0), held(tracker, 2.0), held(tracker, 3.0)
    book.open("same", first)
    book.open("same", second)
    book.open("other", other)
    assert len(book) == 3 and list(book) == [first, second, other]
    assert book.close("same") is first
    assert book.close("missing") is None
    assert len(book) == 2
    assert book.expired(2.5) == [second]
    assert len(book) == 1 and book.close("same") is None
    assert book.expired(2.5) == []
    assert book.close("other") is other and len(book) == 0


def test_taken_out_by_backend_or_by_the_connection_that_asked() -> None:
    tracker = InflightTracker([(SPECULATIVE, "http://a"), (SPECULATIVE, "http://b")])
    book = LeaseBook()
    on_a = Held(tracker.acquire("http://a"), Outcome(path="/v1/x", started=0.0), 0.0, "one")
    on_b = Held(tracker.acquire("http://b"), Outcome(path="/v1/x", started=0.0), 0.0, "one")
    other = Held(tracker.acquire("http://a"), Outcome(path="/v1/x", started=0.0), 0.0, "two")
    book.open("same", on_a)
    book.open("same", on_b)
    book.open("x", other)
    assert book.on_backend("http://b") == [on_b] and len(book) == 2
    assert book.from_source("one") == [on_a] and len(book) == 1
    assert book.from_source("one") == [] and book.close("x") is other and len(book) == 0
