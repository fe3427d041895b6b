"""Health, failover and safe retries over real sockets, with sims and their fault knobs.

Each test ends with the router's in-flight count at 0, no upstream connection busy and the
sims idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from router.app import RouterApp
from router.health.state import State
from router.settings import Settings
from tests.conftest import TIME_SCALE, RouterFactory
from tests.support.http import (
    metric_value,
    router_ready,
    router_status,
    sim_idle,
    sim_running,
    wait_for,
)
from tests.support.processes import Proc, free_port, sim_on, spawn

pytestmark = pytest.mark.anyio

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
CHAT = {"model": "sim", "messages": MESSAGES}


def configure(sim_url: str, **config: object) -> None:
    response = httpx.post(f"{sim_url}/sim/config", json=config)
    assert response.status_code == 200, response.text


def assert_clean(router_url: str, *sim_urls: str) -> None:
    wait_for(lambda: router_status(router_url)["in_flight"]["total"] == 0, timeout=2)
    status = router_status(router_url)
    for pool in status["pools"].values():
        for backend in pool["backends"]:
            assert backend["connections"]["busy"] == 0, backend
    for url in sim_urls:
        wait_for(sim_idle(url), timeout=2)


def metrics(router_url: str) -> str:
    return httpx.get(f"{router_url}/metrics").text


def test_router_starts_before_its_backends(start_router: RouterFactory) -> None:
    spec_port, base_port = free_port(), free_port()
    spec_url, base_url = f"http://127.0.0.1:{spec_port}", f"http://127.0.0.1:{base_port}"
    router = start_router(spec_url, base_url, ready=False, crossover="2")
    assert not router_ready(router.url)
    refused = httpx.post(f"{router.url}/v1/chat/completions", json={**CHAT, "max_tokens": 3})
    assert refused.status_code == 503 and "retry-after" in refused.headers
    assert refused.json()["error"]["code"] == "no_backend_available"

    # 20 model seconds of start-up = 2 s here; the sim answers 503 on /health meanwhile
    spec = spawn(sim_on("eagle3", spec_port, "--time-scale", TIME_SCALE, "--startup-delay", "20"))
    base: Proc | None = None
    try:
        wait_for(
            lambda: router_status(router.url)["pools"]["speculative"]["backends"][0]["checks"] >= 2
        )
        assert (
            router_status(router.url)["pools"]["speculative"]["backends"][0]["state"] == "starting"
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = httpx.post(f"{router.url}/v1/chat/completions", json={**CHAT, "max_tokens": 3})
            if r.status_code == 200:
                break  # the engine finished starting between two requests
            # a 503 from the router itself, never the starting engine's own 503
            assert r.status_code == 503 and r.json()["error"]["code"] == "no_backend_available"
            time.sleep(0.05)
        assert router_ready(router.url)
        ok = httpx.post(f"{router.url}/v1/chat/completions", json={**CHAT, "max_tokens": 3})
        assert ok.status_code == 200 and ok.headers["x-spec-router-pool"] == "speculative"
        text = metrics(router.url)
        assert metric_value(text, "spec_router_upstream_errors_total") == 0
        assert metric_value(text, "spec_router_retries_total") == 0

        base = spawn(
            sim_on("baseline", base_port, "--time-scale", TIME_SCALE, "--startup-delay", "5")
        )
        wait_for(lambda: router_status(router.url)["pools"]["baseline"]["usable"], timeout=10)
        assert_clean(router.url, spec_url, base_url)
    finally:
        spec.stop()
        if base is not None:
            base.stop()


@dataclass
class Done:
    started: float
    status: int
    pool: str | None
    reason: str | None
    error: str | None = None


async def _load(url: str, stop_at: list[float], results: list[Done], stream: bool) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        while not stop_at or time.monotonic() < stop_at[0]:
            started = time.monotonic()
            body = {**CHAT, "max_tokens": 40 if stream else 15, "stream": stream}
            try:
                async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    payload = await r.aread()
                    error = "stream_error" if stream and b"[DONE]" not in payload else None
                    results.append(
                        Done(
                            started,
                            r.status_code,
                            r.headers.get("x-spec-router-pool"),
                            r.headers.get("x-spec-router-reason"),
                            error,
                        )
                    )
            except httpx.HTTPError as exc:
                results.append(Done(started, 0, None, None, type(exc).__name__))


async def test_speculative_engine_killed_under_load(
    start_router: RouterFactory, own_sims: dict[str, Proc]
) -> None:
    """Checklist cases 1 and 2: an engine killed under load; requests before their first byte fail
    over (connect), streams cut end visibly broken."""
    spec, base = own_sims["speculative"], own_sims["baseline"]
    router = start_router(spec.url, base.url, crossover="4", eject_base="0.5")
    results: list[Done] = []
    stop_at: list[float] = []
    workers = [
        asyncio.create_task(_load(router.url, stop_at, results, stream=i % 2 == 0))
        for i in range(6)
    ]
    while sum(1 for r in results if r.pool == "speculative") < 6:
        await asyncio.sleep(0.02)
    spec.kill()
    killed = time.monotonic()
    stop_at.append(killed + 1.5)
    await asyncio.gather(*workers)

    after = [r for r in results if r.started > killed]
    assert len(after) >= 12
    assert all(r.status == 200 and r.error is None for r in after), after
    assert all(r.pool == "baseline" and r.reason == "failover" for r in after)
    # at most one failed attempt for each request that was still before its first byte
    retries = metric_value(metrics(router.url), "spec_router_retries_total")
    assert 0 < retries <= 6
    # streams cut by the crash ended visibly broken, never with a fake [DONE]
    broken = [r for r in results if r.error == "stream_error"]
    assert all(r.pool == "speculative" for r in broken)

    # the engine comes back on the same port: traffic returns to the crossover rule
    revived = spawn(sim_on("eagle3", int(spec.url.rsplit(":", 1)[1]), "--time-scale", TIME_SCALE))
    try:
        wait_for(lambda: router_status(router.url)["pools"]["speculative"]["usable"], timeout=10)
        r = httpx.post(f"{router.url}/v1/chat/completions", json={**CHAT, "max_tokens": 3})
        assert (r.headers["x-spec-router-pool"], r.headers["x-spec-router-reason"]) == (
            "speculative",
            "below_crossover",
        )
        assert_clean(router.url, revived.url, base.url)
    finally:
        revived.stop()


def test_both_pools_down_answers_503_at_once(
    start_router: RouterFactory, own_sims: dict[str, Proc]
) -> None:
    """Checklist case 17: both pools down, a 503 with Retry-After, fast."""
    spec, base = own_sims["speculative"], own_sims["baseline"]
    router = start_router(spec.url, base.url, connect_timeout="2", health_interval="5")
    spec.kill()
    base.kill()
    # the health poller has not noticed yet: the request finds out by trying both pools
    began = time.monotonic()
    r = httpx.post(f"{router.url}/v1/chat/completions", json={**CHAT, "max_tokens": 3})
    assert time.monotonic() - began < 2
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"] == {
        "message": r.json()["error"]["message"],
        "type": "server_error",
        "param": None,
        "code": "no_backend_available",
    }
    # both are ejected now: the next one is refused without any attempt
    began = time.monotonic()
    again = httpx.post(f"{router.url}/v1/chat/completions", json={**CHAT, "max_tokens": 3})
    assert again.status_code == 503 and time.monotonic() - began < 0.5
    assert router_status(router.url)["in_flight"]["total"] == 0


@pytest.mark.parametrize("status", [503, 429])
def test_refusal_before_any_byte_is_retried_on_the_other_pool(
    start_router: RouterFactory, own_sims: dict[str, Proc], status: int
) -> None:
    """Checklist case 5: a 503/429 refusal before any byte is retried elsewhere."""
    spec, base = own_sims["speculative"], own_sims["baseline"]
    router = start_router(spec.url, base.url)
    configure(spec.url, fault=f"status={status}")
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="x", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="sim", messages=MESSAGES, max_tokens=5
    )
    assert raw.status_code == 200
    assert (raw.headers["x-spec-router-pool"], raw.headers["x-spec-router-reason"]) == (
        "baseline",
        "failover",
    )
    text = metrics(router.url)
    # the retry and the error belong to the speculative pool, not the baseline that answered
    retried = metric_value(
        text, "spec_router_retries_total", pool="speculative", kind=f"http_{status}"
    )
    assert retried == 1
    assert metric_value(text, "spec_router_retries_total", pool="baseline") == 0
    errors = metric_value(
        text, "spec_router_upstream_errors_total", pool="speculative", backend=spec.url
    )
    assert errors == (1 if status >= 500 else 0)
    assert metric_value(text, "spec_router_upstream_errors_total", pool="baseline") == 0
    assert_clean(router.url, spec.url, base.url)


def test_reset_mid_stream_is_not_retried_and_not_finished(
    start_router: RouterFactory, sims: dict[str, Proc]
) -> None:
    """Checklist case 2: a reset mid-stream is not retried and never ends with [DONE]."""
    router = start_router()
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="x", max_retries=0)
    stream = client.chat.completions.create(
        model="sim", messages=MESSAGES, max_tokens=200, stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-sim-fault": "reset_after=10"},
    )  # fmt: skip
    text: list[str] = []
    with pytest.raises(openai.APIError, match="mid-stream"):
        for chunk in stream:
            text.extend(c.delta.content or "" for c in chunk.choices)
    assert len("".join(text).split()) == 10
    assert metric_value(metrics(router.url), "spec_router_retries_total") == 0
    raw = httpx.post(
        f"{router.url}/v1/chat/completions",
        json={**CHAT, "max_tokens": 200, "stream": True},
        headers={"x-sim-fault": "reset_after=10"},
    )
    assert b"[DONE]" not in raw.content and b'"error"' in raw.content.strip().split(b"\n\n")[-1]
    assert_clean(router.url, sims["speculative"].url, sims["baseline"].url)


def test_hang_before_headers_hits_first_byte_timeout(
    start_router: RouterFactory, sims: dict[str, Proc]
) -> None:
    """Checklist case 3: a hang before the headers ends in a 504 at the first-byte timeout."""
    router = start_router(first_byte_timeout="0.5")
    began = time.monotonic()
    r = httpx.post(
        f"{router.url}/v1/chat/completions",
        json={**CHAT, "max_tokens": 5},
        headers={"x-sim-fault": "hang_before_headers"},
    )
    elapsed = time.monotonic() - began
    assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
    assert 0.5 <= elapsed < 3
    assert_clean(router.url, sims["speculative"].url, sims["baseline"].url)


def test_hang_mid_stream_hits_idle_timeout(
    start_router: RouterFactory, sims: dict[str, Proc]
) -> None:
    """Checklist case 4: a hang mid-body ends at the idle (inter-chunk) timeout, not a total one."""
    router = start_router(idle_timeout="0.5")
    began = time.monotonic()
    r = httpx.post(
        f"{router.url}/v1/chat/completions",
        json={**CHAT, "max_tokens": 100, "stream": True},
        headers={"x-sim-fault": "hang_after=5"},
        timeout=10,
    )
    elapsed = time.monotonic() - began
    assert r.status_code == 200 and 0.5 <= elapsed < 3
    events = [e for e in r.content.split(b"\n\n") if e.strip()]
    assert b"[DONE]" not in r.content and b"next chunk" in events[-1]
    assert_clean(router.url, sims["speculative"].url, sims["baseline"].url)


async def test_flapping_backend_does_not_flip_on_every_probe(own_sims: dict[str, Proc]) -> None:
    """Checklist case 16: rise/fall thresholds hold a flapping backend steady."""
    spec, base = own_sims["speculative"], own_sims["baseline"]
    app = RouterApp(
        Settings(speculative_urls=[spec.url], baseline_urls=[base.url], health_interval=3600)
    )
    async with app.running():
        assert app.poller is not None
        await app.poller.check(spec.url)
        assert app.health.states[spec.url].state is State.HEALTHY
        for i in range(12):
            configure(spec.url, health_status=503 if i % 2 == 0 else 200)
            await app.poller.check(spec.url)
            assert app.health.states[spec.url].state is State.HEALTHY
        # three failures in a row do take it out; two good probes bring it back
        configure(spec.url, health_status=503)
        for _ in range(3):
            await app.poller.check(spec.url)
        assert app.health.states[spec.url].state is State.UNHEALTHY
        configure(spec.url, health_status=200)
        await app.poller.check(spec.url)
        assert app.health.states[spec.url].state is State.UNHEALTHY
        await app.poller.check(spec.url)
        assert app.health.states[spec.url].state is State.HEALTHY


def engines_seen_running(router_url: str, at_least: float) -> Callable[[], bool]:
    """A ``wait_for`` check: the router's last scrapes report ``at_least`` running requests."""

    def check() -> bool:
        seen = sum(
            (b["engine"] or {}).get("running", 0)
            for p in router_status(router_url)["pools"].values()
            for b in p["backends"]
        )
        return bool(seen >= at_least)

    return check


async def test_engine_load_signal_makes_two_routers_agree(
    start_router: RouterFactory, own_sims: dict[str, Proc]
) -> None:
    spec, base = own_sims["speculative"], own_sims["baseline"]
    settings = {"crossover": "4", "load_signal": "engine", "health_interval": "0.1"}
    routers = [start_router(spec.url, base.url, **settings) for _ in range(2)]
    clients = [
        openai.AsyncOpenAI(base_url=f"{r.url}/v1", api_key="x", max_retries=0) for r in routers
    ]
    pools = []
    async with contextlib.AsyncExitStack() as stack:
        for client in clients:
            await stack.enter_async_context(client)
        for i in range(8):
            router, client = routers[i % 2], clients[i % 2]
            other = routers[(i + 1) % 2]
            response = await stack.enter_async_context(
                client.chat.completions.with_streaming_response.create(
                    model="sim", messages=MESSAGES, max_tokens=5000, stream=True
                )
            )
            pools.append(response.headers["x-spec-router-pool"])
            # let the other replica's next scrape see this stream (one scrape interval of lag)
            running = sim_running(spec.url) + sim_running(base.url)
            wait_for(engines_seen_running(other.url, running))
        assert pools.count("speculative") == 4, pools
        assert sim_running(spec.url) == 4
    for router in routers:
        assert_clean(router.url, spec.url, base.url)
