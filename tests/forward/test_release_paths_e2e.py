"""Every exit path releases the in-flight lease and the upstream connection.

The router app runs in-process with hand-written ASGI ``receive``/``send`` so each disconnect
can be placed exactly, in both ASGI styles: spec 2.3 (``receive`` returns ``http.disconnect``)
and spec 2.4 (``send`` raises ``OSError`` once the client is gone). Upstreams are real sims,
copying SGLang (which aborts a disconnected request 2 s later, 0.2 s here) and vLLM (at once).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from router.app import RouterApp
from router.asgi import Message
from router.settings import Settings
from tests.support.http import await_for, sim_running
from tests.support.processes import Proc

pytestmark = pytest.mark.anyio


class Client:
    """A scripted ASGI client: one request body, then a disconnect when told."""

    def __init__(self, body: bytes, spec_version: str) -> None:
        self.body = body
        self.spec_version = spec_version
        self.sent: list[Message] = []
        self.gone = asyncio.Event()
        self.started = asyncio.Event()
        self.body_chunks = 0
        self._first = True

    async def receive(self) -> Message:
        if self._first:
            self._first = False
            return {"type": "http.request", "body": self.body, "more_body": False}
        if self.spec_version == "2.4-send-only":
            await asyncio.Event().wait()  # never: only `send` reports the disconnect
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if self.gone.is_set() and self.spec_version.startswith("2.4"):
            raise OSError("client disconnected")
        self.sent.append(message)
        if message["type"] == "http.response.start":
            self.started.set()
        elif message.get("body"):
            self.body_chunks += 1

    def scope(
        self, path: str = "/v1/chat/completions", headers: list[tuple[bytes, bytes]] | None = None
    ) -> dict[str, Any]:
        return {
            "type": "http",
            "asgi": {
                "version": "3.0",
                "spec_version": "2.4" if self.spec_version.startswith("2.4") else "2.3",
            },
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "headers": [(b"content-type", b"application/json"), *(headers or [])],
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8000),
        }


@pytest.fixture
def sims(engine_sims: dict[str, Proc]) -> dict[str, Proc]:
    return engine_sims


@pytest.fixture
async def app(sims: dict[str, Proc]) -> AsyncIterator[RouterApp]:
    settings = Settings(
        speculative_urls=[sims["speculative"].url],
        baseline_urls=[sims["baseline"].url],
        health_interval=0.2,
        idle_timeout=30.0,
        engine_abort_lag=0.5,
    )
    router_app = RouterApp(settings)
    async with router_app.running():
        await await_for(lambda: _true(all(router_app.usable_pools().values())))
        yield router_app
    assert router_app.tracker.total == 0


async def _true(value: bool) -> bool:
    return value


def drained(url: str) -> Callable[[], Awaitable[bool]]:
    """An ``await_for`` check: the sim at ``url`` has nothing running or queued."""

    async def check() -> bool:
        return sim_running(url) == 0

    return check


def busy_connections(app: RouterApp) -> int:
    return sum(c.open_connections - c.idle_connections for c in app.clients.values())


def flights(app: RouterApp) -> int:
    """Requests the slo policy sees in flight (each lease carries its request)."""
    return sum(len(by_lease) for by_lease in app.tracker.flights.values())


async def assert_released(app: RouterApp, sims: dict[str, Proc]) -> None:
    assert app.tracker.total == 0
    assert app.tracker.by_pool == {"speculative": 0, "baseline": 0}
    assert flights(app) == 0
    assert busy_connections(app) == 0
    for sim in sims.values():
        await await_for(drained(sim.url), timeout=2.0)


def body(stream: bool, max_tokens: int = 2000) -> bytes:
    return json.dumps(
        {
            "model": "sim",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
            "stream": stream,
        }
    ).encode()


STYLES = ["2.3", "2.4", "2.4-send-only"]


@pytest.mark.parametrize("style", STYLES)
async def test_normal_end(app: RouterApp, sims: dict[str, Proc], style: str) -> None:
    client = Client(body(stream=True, max_tokens=30), style)
    await app(client.scope(), client.receive, client.send)
    assert client.sent[0]["status"] == 200
    assert client.sent[-1]["more_body"] is False
    assert b"[DONE]" in b"".join(m.get("body", b"") for m in client.sent[1:])
    await assert_released(app, sims)


@pytest.mark.parametrize("style", ["2.3", "2.4"])
async def test_disconnect_while_waiting_for_upstream_headers(
    app: RouterApp, sims: dict[str, Proc], style: str
) -> None:
    client = Client(body(stream=True), style)
    scope = client.scope(headers=[(b"x-sim-fault", b"hang_before_headers")])
    task = asyncio.create_task(app(scope, client.receive, client.send))
    await await_for(lambda: _true(busy_connections(app) == 1 and app.tracker.total == 1))
    assert flights(app) == 1  # (the default policy, slo, sees it in flight)
    client.gone.set()
    await asyncio.wait_for(task, 5)
    assert not client.started.is_set()
    await assert_released(app, sims)


@pytest.mark.parametrize("style", STYLES)
async def test_disconnect_after_headers_before_first_token(
    app: RouterApp, sims: dict[str, Proc], style: str
) -> None:
    client = Client(body(stream=True), style)
    task = asyncio.create_task(app(client.scope(), client.receive, client.send))
    await asyncio.wait_for(client.started.wait(), 5)
    client.gone.set()
    await asyncio.wait_for(task, 5)
    await assert_released(app, sims)


@pytest.mark.parametrize("style", STYLES)
async def test_disconnect_mid_stream(app: RouterApp, sims: dict[str, Proc], style: str) -> None:
    """Checklist case 7: a disconnect mid-stream releases the lease and the connection."""
    client = Client(body(stream=True), style)
    task = asyncio.create_task(app(client.scope(), client.receive, client.send))
    await await_for(lambda: _true(client.body_chunks >= 3))
    client.gone.set()
    await asyncio.wait_for(task, 5)
    assert client.sent[-1].get("more_body", False) is True  # the stream was cut, not finished
    await assert_released(app, sims)


@pytest.mark.parametrize("style", ["2.3", "2.4"])
async def test_disconnect_while_waiting_for_a_non_streamed_answer(
    app: RouterApp, sims: dict[str, Proc], style: str
) -> None:
    client = Client(body(stream=False), style)
    task = asyncio.create_task(app(client.scope(), client.receive, client.send))
    await await_for(lambda: _true(sim_running(sims["speculative"].url) == 1))
    client.gone.set()
    await asyncio.wait_for(task, 5)
    await assert_released(app, sims)


async def test_cancellation_of_the_handler(app: RouterApp, sims: dict[str, Proc]) -> None:
    client = Client(body(stream=True), "2.3")
    task = asyncio.create_task(app(client.scope(), client.receive, client.send))
    await await_for(lambda: _true(client.body_chunks >= 2))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await assert_released(app, sims)


async def test_upstream_reset_mid_stream_ends_with_error_event(
    app: RouterApp, sims: dict[str, Proc]
) -> None:
    """Checklist case 2: an upstream reset mid-stream ends with an error event."""
    client = Client(body(stream=True), "2.3")
    scope = client.scope(headers=[(b"x-sim-fault", b"reset_after=10")])
    await app(scope, client.receive, client.send)
    payload = b"".join(m.get("body", b"") for m in client.sent[1:])
    assert b"[DONE]" not in payload
    last_event = payload.strip().split(b"\n\n")[-1]
    assert last_event.startswith(b"data: ") and b'"error"' in last_event
    assert client.sent[-1]["more_body"] is False
    await assert_released(app, sims)


async def test_shutdown_with_streams_in_flight(sims: dict[str, Proc]) -> None:
    settings = Settings(
        speculative_urls=[sims["speculative"].url],
        baseline_urls=[sims["baseline"].url],
        health_interval=0.2,
    )
    router_app = RouterApp(settings)
    clients = [Client(body(stream=True), "2.3") for _ in range(3)]
    async with router_app.running():
        await await_for(lambda: _true(all(router_app.usable_pools().values())))
        tasks = [asyncio.create_task(router_app(c.scope(), c.receive, c.send)) for c in clients]
        await await_for(lambda: _true(all(c.body_chunks >= 1 for c in clients)))
    # leaving `running()` closed every upstream connection: each handler ends its stream
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert router_app.tracker.total == 0
    for sim in sims.values():
        await await_for(drained(sim.url), timeout=2.0)


async def test_a_disconnected_request_still_counts_while_sglang_runs_it(
    app: RouterApp, sims: dict[str, Proc], engine: str
) -> None:
    # SGLang goes on generating for 2 s (0.2 s here) after its client left; the router counts
    # the request against the backend for ENGINE_ABORT_LAG (0.5 s) so it does not send the
    # engine more than it runs. vLLM stops at once: nothing lingers.
    spec = sims["speculative"].url
    await await_for(lambda: _true(spec in app.poller.loads))  # its flavor is known
    client = Client(body(stream=True), "2.3")
    task = asyncio.create_task(app(client.scope(), client.receive, client.send))
    await await_for(lambda: _true(client.body_chunks >= 2))
    client.gone.set()
    await asyncio.wait_for(task, 5)
    assert app.tracker.total == 0 and app.tracker.by_backend[spec] == 0
    if engine == "sglang":
        assert app.decider.backend_load(spec) == 1
        await await_for(lambda: _true(app.decider.backend_load(spec) == 0), timeout=3)
    else:
        assert app.decider.backend_load(spec) == 0
    await assert_released(app, sims)
