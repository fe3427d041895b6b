"""Finished requests' accounting waits for a quiet turn of the loop (``router.forward.ended``)
and is settled before anything reads it: every count exact when read."""

from __future__ import annotations

import logging
import time

import httpx
import pytest

from router.account.outcome import Outcome
from router.app import RouterApp
from router.settings import Settings
from router.upstream.stream import Usage
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


def test_a_router_configured_with_nothing_defers_its_accounting() -> None:
    # (the default since session 14: bench/results/fast-path.md; no SPEC_ROUTER_ variable set)
    app = RouterApp(
        Settings(speculative_urls="http://127.0.0.1:9", baseline_urls="http://127.0.0.1:10")
    )
    assert app.ended is not None
    assert app.ended.add in app.observers
    assert app.metrics.observe not in app.observers  # (run from the queue, not at each end)


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


LEAVING = "http://127.0.0.1:9"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def finished_on_leaving(app: RouterApp, clock: Clock) -> Outcome:
    """A streamed 200 on LEAVING after one reset attempt, run through the tracker as the
    proxy runs it (its in-flight integral taken as the lease goes, before ``finish``)."""
    out = Outcome(path="/v1/chat/completions", started=clock.now, stream=True)
    out.attempt("speculative", LEAVING, "lead", 0, 0.0, 0, 0.0)
    lease = app.tracker.acquire(LEAVING, None)
    out.attempt_failed("reset")
    clock.now += 0.05
    out.first_bytes(clock.now, app.tracker.area(LEAVING, clock.now), 1)
    app.tracker.prefilled(LEAVING, clock.now, 0.04)
    out.answered(200)
    out.counted(Usage(prompt_tokens=10, completion_tokens=20))
    clock.now += 0.5
    out.lease_ends(clock.now, app.tracker.area(LEAVING, clock.now))
    lease.release()
    out.finish(clock.now)
    return out


@pytest.mark.parametrize("defer", [False, True])
async def test_an_outcome_queued_when_its_backend_leaves_is_settled_first(
    defer: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Review s12 finding 1: the drain's removal runs the queued accounting before the
    backend's in-flight entry and metric series go (no KeyError, no ghost series, the
    learning sample kept), as with deferral off."""
    clock = Clock()
    app = RouterApp(
        Settings(
            speculative_urls=f"{LEAVING},http://127.0.0.1:11",
            baseline_urls="http://127.0.0.1:10",
            defer_accounting=defer,
        ),
        clock=clock,
    )
    assert (app.ended is not None) == defer
    app.membership.leave("speculative", LEAVING)  # draining, nothing in flight yet
    clock.now += 1.0
    out = finished_on_leaving(app, clock)
    for observe in app.observers:
        observe(out)  # Proxy.finish
    clock.now += 0.1  # the next members' tick: drained, removed
    with caplog.at_level(logging.ERROR):
        app.membership.tick()
        assert LEAVING not in app.tracker.pool_of
        assert app.ended is None or len(app.ended) == 0
        text = app.metrics_text().decode()
    assert "observer failed" not in caplog.text
    assert f'backend="{LEAVING}"' not in text  # every series of it gone, none back
    assert app.keeper.status()["samples"]["speculative"] == 1


async def test_the_traffic_averages_routing_reads_are_fed_at_once() -> None:
    """Review s12 finding 3: ``Decider.request`` reads ``keeper.traffic`` per request, so its
    averages are fed when the request ends; the rest of the keeper's work waits."""
    app = RouterApp(settings())
    assert app.ended is not None
    before = app.keeper.traffic.mean_output
    out = outcome(0)
    out.counted(Usage(prompt_tokens=10, completion_tokens=4000))
    for observe in app.observers:
        observe(out)
    assert len(app.ended) == 1  # (the rest still queued)
    after = app.keeper.traffic.mean_output
    assert after > before
    app.settle()  # and settling does not count it twice
    assert app.keeper.traffic.mean_output == after and len(app.ended) == 0
