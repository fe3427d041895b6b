"""Finished requests' accounting waits for a quiet turn of the loop (``router.forward.ended``)
and is settled before anything reads it: every count exact when read."""

from __future__ import annotations

import time

import httpx
import pytest

from router.account.outcome import Outcome
from router.app import RouterApp
from router.settings import Settings
from tests.support.http import metric_value

pytestmark = pytest.mark.anyio


def settings(defer: bool = True) -> Settings:
    return Settings(
        speculative_urls="http://127.0.0.1:9",
        baseline_urls="http://127.0.0.1:10",
        defer_accounting=defer,
    )


def outcome(n: int, status: int = 200, gone: bool = False) -> Outcome:
    """The ``n``-th request, ended a moment ago (in the recent window)."""
    now = time.monotonic()
    out = Outcome(path="/v1/chat/completions", started=now - 1.0, stream=True)
    out.attempt("speculative", "http://127.0.0.1:9", "lead", 0, 0.0, n, 0.0)
    out.answered(status)
    if gone:
        out.client_left()
    out.finish(now)
    return out


async def test_queued_outcomes_are_counted_by_metrics_and_status_when_read() -> None:
    app = RouterApp(settings())
    assert app.ended is not None  # (on by default)
    for n in range(5):
        for observe in app.observers:
            observe(outcome(n))
    for observe in app.observers:
        observe(outcome(5, gone=True))  # a client that left
        observe(outcome(6, status=502))  # an upstream that failed
    assert len(app.ended) == 7  # nothing ran yet: no turn of the loop since
    text = app.metrics_text().decode()
    assert len(app.ended) == 0
    assert metric_value(text, "spec_router_requests_total") == 7
    assert metric_value(text, "spec_router_requests_total", code="200") == 6
    assert metric_value(text, "spec_router_client_disconnects_total") == 1
    for observe in app.observers:
        observe(outcome(7))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
        status = (await client.get("/router/status")).json()
        text = (await client.get("/metrics")).text
    assert metric_value(text, "spec_router_requests_total") == 8
    assert sum(status["recent"]["requests"].values()) == 8


async def test_the_keeper_settles_before_it_learns() -> None:
    app = RouterApp(settings())
    assert app.ended is not None
    for observe in app.observers:
        observe(outcome(1))
    app.keeper.update()
    assert len(app.ended) == 0


async def test_off_the_observers_run_as_each_request_ends() -> None:
    app = RouterApp(settings(defer=False))
    assert app.ended is None
    for observe in app.observers:
        observe(outcome(1))
    assert metric_value(app.metrics_text().decode(), "spec_router_requests_total") == 1
