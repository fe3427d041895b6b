"""The outcome record: each event of a request's life written through one method."""

from __future__ import annotations

from router.account.outcome import Outcome
from router.pools import BASELINE, SPECULATIVE
from router.upstream.stream import Usage


def test_the_first_byte_is_stamped_once_with_its_area() -> None:
    out = Outcome(path="/v1/chat/completions", started=1.0)
    out.first_bytes(2.0, 5.0)
    out.first_bytes(3.0, 9.0)
    assert (out.first_byte, out.area_first) == (2.0, 5.0)


def test_attempts_failures_and_retries_follow_the_current_backend() -> None:
    out = Outcome(path="/v1/completions", started=0.0)
    out.attempt("speculative", "http://a", "below_crossover")
    out.attempt_failed("connect")
    out.retried("connect")
    out.attempt("baseline", "http://b", "failover")
    out.answered(200)
    out.counted(Usage(3, 4))
    out.finish(2.5)
    assert out.attempts == 2
    assert out.failures == [("speculative", "http://a", "connect")]
    assert out.retries == [("speculative", "connect")]
    assert (out.pool, out.backend, out.reason, out.status) == (
        "baseline",
        "http://b",
        "failover",
        200,
    )
    assert out.usage == Usage(3, 4) and out.ended == 2.5


def test_client_and_error_flags() -> None:
    out = Outcome(path="/v1/completions", started=0.0)
    out.read(stream=True)
    out.fell_behind()
    out.client_left()
    out.broke("reset")
    assert out.stream and out.slow_client and out.client_gone and out.error == "reset"


def test_the_requests_that_joined_before_the_first_byte_are_counted() -> None:
    """Requests sent to its backend after it and before its first byte shared its prefill (the
    engine prefills them together), so its time to first token is not its prefill alone."""
    out = Outcome(path="/v1/chat/completions", started=1.0)
    out.attempt(SPECULATIVE, "http://a", "predicted_slo", load=0, sent=5)  # the 5th sent there
    out.first_bytes(2.0, 1.0, sent=8)
    assert out.joined == 3
    out.first_bytes(3.0, 1.0, sent=20)  # (stamped once)
    assert out.joined == 3
    alone = Outcome(path="/v1/chat/completions", started=1.0)
    alone.attempt(BASELINE, "http://b", "predicted_slo", load=0, sent=1)
    alone.first_bytes(2.0, 1.0, sent=1)
    assert alone.joined == 0
