"""A backend removed mid-stream releases everything on every path: its stream's normal end,
the client leaving during the drain, and the drain timeout (the stream is cut and ends with an
error event, as on an upstream failure). Then the backend itself goes: its lease, connections,
poller loop, health state and metric series.

The router runs in process with a scripted ASGI client (as in
tests/forward/test_release_paths_e2e.py); the upstreams are the session's SGLang-mode sims;
the backend leaves through the admin API's path (``RouterApp.remove_backend``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import generate_latest

from router.app import RouterApp
from router.settings import Settings
from tests.forward.test_release_paths_e2e import Client, body, drained
from tests.support.http import await_for
from tests.support.processes import Proc

pytestmark = pytest.mark.anyio


@pytest.fixture(params=[30.0])
async def app(sims: dict[str, Proc], request: pytest.FixtureRequest) -> AsyncIterator[RouterApp]:
    settings = Settings(
        speculative_urls=[sims["speculative"].url],
        baseline_urls=[sims["baseline"].url],
        health_interval=0.2,
        policy="spillover",
        crossover=100,  # streams go to the speculative sim: the backend that leaves
        drain_timeout=request.param,
    )
    router_app = RouterApp(settings)
    async with router_app.running():
        await await_for(lambda: _true(all(router_app.usable_pools().values())))
        yield router_app
    assert router_app.tracker.total == 0


async def _true(value: bool) -> bool:
    return value


async def streaming(
    app: RouterApp, style: str = "2.3", tokens: int = 4000
) -> tuple[Client, asyncio.Task[None]]:
    client = Client(body(stream=True, max_tokens=tokens), style)
    task = asyncio.create_task(app(client.scope(), client.receive, client.send))
    await await_for(lambda: _true(client.body_chunks >= 3))
    return client, task


async def answered_by(app: RouterApp) -> str:
    """The pool a new short request goes to."""
    client = Client(body(stream=False, max_tokens=4), "2.3")
    await app(client.scope(), client.receive, client.send)
    start = client.sent[0]
    assert start["status"] == 200
    pool: bytes = dict(start["headers"])[b"x-spec-router-pool"]
    return pool.decode()


async def assert_gone(app: RouterApp, url: str) -> None:
    """The member is removed, and nothing of it is left."""
    await await_for(lambda: _true(url not in app.roster.members), timeout=5)
    assert url not in app.tracker.pool_of and url not in app.tracker.by_backend
    assert url not in app.clients
    assert url not in app.health.states
    assert url not in app.poller.urls and url not in app.poller.loads
    assert url not in app.decider.pools["speculative"]
    assert f'backend="{url}"'.encode() not in generate_latest(app.registry)
    assert app.tracker.total == 0
    assert app.status()["pools"]["speculative"]["backends"] == []


async def test_the_stream_runs_to_its_end(app: RouterApp, sims: dict[str, Proc]) -> None:
    spec = sims["speculative"].url
    client, task = await streaming(app, tokens=1500)
    member = app.remove_backend("speculative", spec)
    assert member.state == "draining"
    assert app.tracker.by_backend[spec] == 1  # still held by its stream
    assert await answered_by(app) == "baseline"  # no new request goes there
    entry = app.status()["pools"]["speculative"]["backends"][0]
    assert (entry["membership"], entry["usable"], entry["in_flight"]) == ("draining", False, 1)
    await asyncio.wait_for(task, 30)
    assert client.sent[-1]["more_body"] is False
    assert b"[DONE]" in b"".join(m.get("body", b"") for m in client.sent[1:])
    await assert_gone(app, spec)
    await await_for(drained(spec), timeout=2.0)


@pytest.mark.parametrize("style", ["2.3", "2.4"])
async def test_the_client_leaves_during_the_drain(
    app: RouterApp, sims: dict[str, Proc], style: str
) -> None:
    spec = sims["speculative"].url
    client, task = await streaming(app, style)
    app.remove_backend("speculative", spec)
    await await_for(lambda: _true(client.body_chunks >= 6))  # it goes on streaming
    client.gone.set()
    await asyncio.wait_for(task, 5)
    assert client.sent[-1].get("more_body", False) is True  # cut, not finished
    await assert_gone(app, spec)
    await await_for(drained(spec), timeout=3.0)  # the engine stopped too


@pytest.mark.parametrize("app", [0.6], indirect=True)
async def test_the_drain_timeout_cuts_the_stream_visibly(
    app: RouterApp, sims: dict[str, Proc]
) -> None:
    spec = sims["speculative"].url
    client, task = await streaming(app)
    app.remove_backend("speculative", spec)
    await asyncio.wait_for(task, 10)  # the stream would take far longer than the drain
    last = client.sent[-1]
    assert last["more_body"] is False
    # the end the proxy gives any stream whose upstream failed mid-way: an error event
    assert last["body"].startswith(b'data: {"error"')
    assert b"drain timed out" in last["body"] and b"upstream failed mid-stream" in last["body"]
    await assert_gone(app, spec)
    cut = b'spec_router_drain_cuts_total{pool="speculative"} 1.0'
    assert cut in generate_latest(app.registry)
    await await_for(drained(spec), timeout=3.0)
