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
