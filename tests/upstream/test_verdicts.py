"""Retry, eject and failover verdicts on plain values (reliability checklist cases 1-5, 15)."""

from __future__ import annotations

import pytest

from router.upstream.client import ErrorKind
from router.upstream.verdicts import (
    after_error,
    after_status,
    mid_response,
    refusal,
    stream_refused,
)


@pytest.mark.parametrize("kind", ["connect", "connect_timeout"])
def test_a_refused_or_unreachable_backend_is_ejected_and_the_request_retried(
    kind: ErrorKind,
) -> None:
    """Checklist cases 1 and 15: a connect failure is safe to retry."""
    # case 1: nothing was sent, so failing over is safe even for a POST
    v = after_error(kind, response_started=False)
    assert (v.kind, v.failed, v.eject, v.retry, v.served) == (kind, True, True, True, False)


def test_a_connection_closed_before_any_response_byte_is_safe_to_retry() -> None:
    v = after_error("reset", response_started=False)
    assert v.eject and v.retry


def test_a_reset_after_the_headers_is_never_retried() -> None:
    # case 2 / 15: the engine took the request
    v = after_error("reset", response_started=True)
    assert v.failed and not v.retry and not v.eject


@pytest.mark.parametrize("kind", ["first_byte_timeout", "protocol", "idle_timeout", "relay"])
def test_failures_after_the_request_was_sent_are_not_retried(kind: ErrorKind) -> None:
    """Checklist case 15: once the request may have started, it is not retried."""
    # case 3: a hang before headers is a timeout, not a reason to send the request twice
    v = after_error(kind, response_started=False)
    assert v.failed and not v.retry and not v.eject


@pytest.mark.parametrize(
    ("status", "failed", "eject", "retry", "served"),
    [
        (200, False, False, False, True),
        (204, False, False, False, True),
        (400, False, False, False, False),
        (404, False, False, False, False),
        (429, False, False, True, False),
        (500, True, False, False, False),  # one request's error: counted, not ejected
        (501, True, False, False, False),
        (502, True, True, False, False),
        (503, True, True, True, False),
        (504, True, True, False, False),
    ],
)
def test_statuses(status: int, failed: bool, eject: bool, retry: bool, served: bool) -> None:
    # case 5: 429 and 503 are refusals, retried while nothing reached the client
    v = after_status(status)
    assert v.kind == f"http_{status}"
    assert (v.failed, v.eject, v.retry, v.served) == (failed, eject, retry, served)


def test_a_broken_body_ejects_unless_the_engine_was_only_slow() -> None:
    assert mid_response("reset").eject and not mid_response("reset").retry
    assert not mid_response("idle_timeout").eject
    assert mid_response("idle_timeout").failed


def test_what_the_client_is_told() -> None:
    assert refusal("first_byte_timeout", retried_out=False) == "timeout"
    assert refusal("connect", retried_out=True) == "no_backend"
    assert refusal("protocol", retried_out=False) == "bad_gateway"
    assert refusal("reset", retried_out=False) == "bad_gateway"


def test_a_stream_refused_before_its_first_event_is_a_refusal() -> None:
    # SGLang 0.5.23: 200, then data: {"error": {..., "code": 503}}; 0.5.3: 200, then closed
    v = stream_refused(503)
    assert (v.kind, v.failed, v.eject, v.retry) == ("http_503", True, True, True)
    v = stream_refused(None)
    assert (v.kind, v.failed, v.eject, v.retry) == ("reset", True, True, True)
