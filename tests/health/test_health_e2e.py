"""Health, failover and safe retries over real sockets, with sims and their fault knobs.

Every test runs against sims copying SGLang and copying vLLM (``engine_pair``/``engine_sims``,
router/sim/behaviour.py). Each ends with the router's in-flight count at 0, no upstream
connection busy and the sims idle.
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
    HOLD,
    metric_value,
    router_ready,
    router_status,
    sim_idle,
    sim_running,
    wait_for,
)
from tests.support.processes import (
    Background,
    HeldPort,
    Proc,
    running,
    sim_args,
    sim_on,
    spawn,
)

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


def test_router_starts_before_its_backends(start_router: RouterFactory, engine: str) -> None:
    # each engine's port is bound here until the engine starts: refused meanwhile, and no other
    # test's server takes it
    with HeldPort() as spec_port, HeldPort() as base_port:
        spec_url = f"http://127.0.0.1:{spec_port.port}"
        base_url = f"http://127.0.0.1:{base_port.port}"
        router = start_router(spec_url, base_url, ready=False, crossover="2")
        assert not router_ready(router.url)
        refused = httpx.post(f"{router.url}/v1/chat/completions", json={**CHAT, "max_tokens": 3})
        assert refused.status_code == 503 and "retry-after" in refused.headers
        assert refused.json()["error"]["code"] == "no_backend_available"

        # 20 model seconds of loading = 2 s here, the port refusing connections meanwhile (both
        # engines); then SGLang answers /health with 503 during its warm-up
        common = ["--time-scale", TIME_SCALE, "--engine", engine, "--model", "sim"]
        spec_port.release()
        spec = Background(sim_on("eagle3", spec_port.port, *common, "--startup-delay", "20"))
        base: Background | None = None
        try:
            wait_for(
                lambda: (
                    router_status(router.url)["pools"]["speculative"]["backends"][0]["checks"] >= 2
                )
            )
            backend = router_status(router.url)["pools"]["speculative"]["backends"][0]
            assert backend["state"] == "starting" and "connect" in backend["last_error"]
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

            base_port.release()
            base = Background(sim_on("baseline", base_port.port, *common, "--startup-delay", "5"))
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
    start_router: RouterFactory, engine_pair: dict[str, Proc], engine: str
) -> None:
    """Checklist cases 1 and 2: an engine killed under load; requests before their first byte fail
    over (connect), streams cut end visibly broken."""
    spec, base = engine_pair["speculative"], engine_pair["baseline"]
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
    # all on the baseline: failed over, or sent there at once while the speculative pool still
    # counted the streams the crash cut (at the crossover) -- which comes first is the
    # machine's timing, not the router's choice
    assert all(r.pool == "baseline" for r in after), after
    assert {r.reason for r in after} <= {"failover", "above_crossover"}, after
    assert any(r.reason == "failover" for r in after), after
    # at most one failed attempt for each request that was still before its first byte
    retries = metric_value(metrics(router.url), "spec_router_retries_total")
    assert 0 < retries <= 6
    # streams cut by the crash ended visibly broken, never with a fake [DONE]
    broken = [r for r in results if r.error == "stream_error"]
    assert all(r.pool == "speculative" for r in broken)

    # the engine comes back on the same port: traffic returns to the crossover rule
    port = int(spec.url.rsplit(":", 1)[1])
    extra = ["--engine", engine, *(["--model", "sim"] if engine == "vllm" else [])]
    revived = spawn(sim_on("eagle3", port, "--time-scale", TIME_SCALE, *extra))
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
    start_router: RouterFactory, engine_pair: dict[str, Proc]
) -> None:
    """Checklist case 17: both pools down, a 503 with Retry-After, fast."""
    spec, base = engine_pair["speculative"], engine_pair["baseline"]
    router = start_router(spec.url, base.url, connect_timeout="2", health_interval="5")
    spec.kill()
    base.kill()
    # the health poller has not noticed yet: the request finds out by trying both pools, each
    # refusing the connection at once (no connect timeout, no wait for the poller)
    r = httpx.post(f"{router.url}/v1/chat/completions", json={**CHAT, "max_tokens": 3})
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"] == {
        "message": r.json()["error"]["message"],
        "type": "server_error",
        "param": None,
        "code": "no_backend_available",
    }

    def errors(kind: str) -> float:
        return metric_value(metrics(router.url), "spec_router_upstream_errors_total", kind=kind)

    # refused, not timed out (a probe may have found one of them refused first)
    tried = errors("connect")
    assert tried >= 1 and errors("connect_timeout") == 0
    # both are ejected now: the next one is refused without any attempt
    again = httpx.post(f"{router.url}/v1/chat/completions", json={**CHAT, "max_tokens": 3})
    assert again.status_code == 503 and errors("connect") == tried
    assert router_status(router.url)["in_flight"]["total"] == 0


@pytest.mark.parametrize("status", [503, 429])  # (no engine sends 429; a proxy in front may)
def test_refusal_before_any_byte_is_retried_on_the_other_pool(
    start_router: RouterFactory, engine_sims: dict[str, Proc], status: int
) -> None:
    """Checklist case 5: a 503/429 refusal before any byte is retried elsewhere."""
    spec, base = engine_sims["speculative"], engine_sims["baseline"]
    router = start_router(spec.url, base.url)
    configure(spec.url, fault=f"status={status}")
    try:
        refused_and_retried(router.url, spec, base, status)
    finally:
        configure(spec.url, fault=None)


def refused_and_retried(router_url: str, spec: Proc, base: Proc, status: int) -> None:
    client = openai.OpenAI(base_url=f"{router_url}/v1", api_key="x", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="sim", messages=MESSAGES, max_tokens=5
    )
    assert raw.status_code == 200
    assert (raw.headers["x-spec-router-pool"], raw.headers["x-spec-router-reason"]) == (
        "baseline",
        "failover",
    )
    text = metrics(router_url)
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
    assert_clean(router_url, spec.url, base.url)


def test_a_500_is_counted_but_does_not_eject(
    start_router: RouterFactory, engine_sims: dict[str, Proc]
) -> None:
    # A 500 is one request's failure (vLLM 0.34: "a request-level error that does not mark the
    # engine as unhealthy"): the client gets it, it is counted, and the engine keeps serving.
    spec, base = engine_sims["speculative"], engine_sims["baseline"]
    router = start_router(spec.url, base.url, policy="crossover", crossover="4")
    url = f"{router.url}/v1/chat/completions"
    failed = httpx.post(url, json={**CHAT, "max_tokens": 3}, headers={"x-sim-fault": "status=500"})
    assert failed.status_code == 500 and failed.headers["x-spec-router-pool"] == "speculative"
    text = metrics(router.url)
    assert metric_value(text, "spec_router_upstream_errors_total", kind="http_500") == 1
    assert metric_value(text, "spec_router_retries_total") == 0
    backend = router_status(router.url)["pools"]["speculative"]["backends"][0]
    assert backend["usable"], backend
    again = httpx.post(url, json={**CHAT, "max_tokens": 3})
    assert (again.status_code, again.headers["x-spec-router-reason"]) == (200, "below_crossover")
    assert_clean(router.url, spec.url, base.url)


def test_a_request_that_timed_out_on_a_reused_connection_is_sent_once(
    start_router: RouterFactory, engine_sims: dict[str, Proc]
) -> None:
    spec, base = engine_sims["speculative"], engine_sims["baseline"]
    router = start_router(
        spec.url, base.url, policy="crossover", crossover="4", first_byte_timeout="0.5"
    )
    url = f"{router.url}/v1/chat/completions"
    assert httpx.post(url, json={**CHAT, "max_tokens": 3}).status_code == 200  # a kept connection

    def received() -> int:
        return sum(
            int(httpx.get(f"{u}/sim/config").json()["received"]) for u in (spec.url, base.url)
        )

    before = received()
    r = httpx.post(
        url,
        json={**CHAT, "max_tokens": 3, "stream": True},
        headers={"x-sim-fault": "hang_before_headers"},
    )
    assert r.status_code == 504
    assert received() == before + 1  # the engine got it once: a timeout is not a stale connection
    assert_clean(router.url, spec.url, base.url)


def test_reset_mid_stream_is_not_retried_and_not_finished(
    start_router: RouterFactory, engine_sims: dict[str, Proc]
) -> None:
    """Checklist case 2: a reset mid-stream is not retried and never ends with [DONE]."""
    sims = engine_sims
    router = start_router(sims["speculative"].url, sims["baseline"].url)
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
    start_router: RouterFactory, engine_sims: dict[str, Proc]
) -> None:
    """Checklist case 3: a hang before the headers ends in a 504 at the first-byte timeout."""
    sims = engine_sims
    router = start_router(sims["speculative"].url, sims["baseline"].url, first_byte_timeout="0.5")
    began = time.monotonic()
    r = httpx.post(
        f"{router.url}/v1/chat/completions",
        json={**CHAT, "max_tokens": 5, "stream": True},  # (a stream: FIRST_BYTE_TIMEOUT's)
        headers={"x-sim-fault": "hang_before_headers"},
    )
    elapsed = time.monotonic() - began
    assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
    assert elapsed >= 0.5  # (not before the timeout; the 504 itself says it came)
    timeouts = metric_value(
        metrics(router.url), "spec_router_upstream_errors_total", kind="first_byte_timeout"
    )
    assert timeouts == 1
    assert_clean(router.url, sims["speculative"].url, sims["baseline"].url)


def test_hang_mid_stream_hits_idle_timeout(
    start_router: RouterFactory, engine_sims: dict[str, Proc]
) -> None:
    """Checklist case 4: a hang mid-body ends at the idle (inter-chunk) timeout, not a total one."""
    sims = engine_sims
    router = start_router(sims["speculative"].url, sims["baseline"].url, idle_timeout="0.5")
    began = time.monotonic()
    r = httpx.post(
        f"{router.url}/v1/chat/completions",
        json={**CHAT, "max_tokens": 100, "stream": True},
        headers={"x-sim-fault": "hang_after=5"},
        timeout=10,
    )
    elapsed = time.monotonic() - began
    assert r.status_code == 200 and elapsed >= 0.5  # (not before the idle timeout)
    events = [e for e in r.content.split(b"\n\n") if e.strip()]
    assert b"[DONE]" not in r.content and b"next chunk" in events[-1]
    assert_clean(router.url, sims["speculative"].url, sims["baseline"].url)


async def test_flapping_backend_does_not_flip_on_every_probe(
    engine_pair: dict[str, Proc],
) -> None:
    """Checklist case 16: rise/fall thresholds hold a flapping backend steady."""
    spec, base = engine_pair["speculative"], engine_pair["baseline"]
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


def settled_on(router_url: str, total: int) -> Callable[[], Settled]:
    """A ``wait_for`` check: the router's load over all backends is ``total``, and each
    backend's load is what its engine reported at the router's last scrape: the engines report
    every stream, and its own recent ones no longer count on top (ENGINE_GAUGE_LAG). (The
    total alone could be right while a stream was still counted as this router's recent one:
    on a loaded machine the sim's gauge, which lags by decode steps, may then still miss it
    once that allowance has run out, and the next decision see one request fewer.)"""

    def check() -> Settled:
        backends = [b for p in router_status(router_url)["pools"].values() for b in p["backends"]]
        reported = all(
            b["engine"] is not None and b["engine"]["running"] + b["engine"]["queued"] == b["load"]
            for b in backends
        )
        loads = {
            b["url"]: (b["load"], b["engine"] and b["engine"]["running"] + b["engine"]["queued"])
            for b in backends
        }
        return Settled(reported and sum(b["load"] for b in backends) == total, total, loads)

    return check


@dataclass
class Settled:
    """``settled_on``'s answer: true once settled; else what a failed wait shows, per backend
    (the router's load, the engine's running + queued)."""

    ok: bool
    total: int
    loads: dict[str, tuple[int, int | None]]

    def __bool__(self) -> bool:
        return self.ok


async def test_engine_load_signal_makes_two_routers_agree(
    start_router: RouterFactory, engine_pair: dict[str, Proc]
) -> None:
    spec, base = engine_pair["speculative"], engine_pair["baseline"]
    # ENGINE_GAUGE_LAG: about 40 of the sims' decode steps at this time scale (0.1-0.2 s)
    settings = {
        "crossover": "4",
        "load_signal": "engine",
        "health_interval": "0.1",
        "engine_gauge_lag": "0.3",
    }
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
            # (held on the engine after a few tokens, running until its client leaves:
            # every stream is still there at the end, however slow the host)
            response = await stack.enter_async_context(
                client.chat.completions.with_streaming_response.create(
                    model="sim",
                    messages=MESSAGES,
                    max_tokens=5000,
                    stream=True,
                    extra_headers=HOLD,
                )
            )
            pools.append(response.headers["x-spec-router-pool"])
            # let the engines report this stream (SGLang: within 40 decode steps) and both
            # replicas' loads settle on it: the gauges' lag plus a scrape interval
            for replica in (router, other):
                wait_for(settled_on(replica.url, i + 1))
        assert pools.count("speculative") == 4, pools
        assert sim_running(spec.url) == 4
    for router in routers:
        assert_clean(router.url, spec.url, base.url)


def test_a_stream_queued_past_the_idle_timeout_is_not_cut(
    start_router: RouterFactory, engine: str
) -> None:
    # One request at a time: a stream waits in the engine's queue behind a 0.8-s one. vLLM
    # (and SGLang 0.5.3) answer its headers at once, so that wait comes after them; it is
    # the first-byte timeout's (10 s) to bound, not the idle timeout's (0.3 s). SGLang 0.5.23
    # sends the headers with the first chunk: the same either way.
    args = ["--time-scale", TIME_SCALE, "--max-running", "1", "--engine", engine]
    args += ["--model", "sim"]
    with running(sim_args("baseline", *args)) as spec, running(sim_args("baseline", *args)) as base:
        router = start_router(
            spec.url, base.url, policy="crossover", crossover="4",
            idle_timeout="0.3", first_byte_timeout="10",
        )  # fmt: skip
        with httpx.stream(
            "POST",
            f"{spec.url}/v1/chat/completions",
            json={**CHAT, "max_tokens": 400, "stream": True},
        ) as first:
            chunks = first.iter_raw()  # (kept: a dropped iterator closes the connection)
            next(chunks)
            r = httpx.post(
                f"{router.url}/v1/chat/completions",
                json={**CHAT, "max_tokens": 3, "stream": True},
                timeout=10,
            )
            assert r.status_code == 200 and r.content.endswith(b"data: [DONE]\n\n"), r.content
            assert r.headers["x-spec-router-pool"] == "speculative"
        assert_clean(router.url, spec.url, base.url)


def test_a_non_stream_has_a_total_timeout_of_its_own(
    start_router: RouterFactory, engine_sims: dict[str, Proc]
) -> None:
    # A non-streamed answer comes whole (headers too) when generation ends: NON_STREAM_TIMEOUT
    # bounds all of it, whatever FIRST_BYTE_TIMEOUT says.
    sims = engine_sims
    router = start_router(
        sims["speculative"].url, sims["baseline"].url, policy="crossover", crossover="4",
        first_byte_timeout="30", non_stream_timeout="0.5",
    )  # fmt: skip
    began = time.monotonic()
    r = httpx.post(f"{router.url}/v1/chat/completions", json={**CHAT, "max_tokens": 5000})
    assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
    assert time.monotonic() - began >= 0.5  # (not before the timeout)
    text = metrics(router.url)
    assert metric_value(text, "spec_router_upstream_errors_total", kind="total_timeout") == 1
    assert metric_value(text, "spec_router_retries_total") == 0
    ok = httpx.post(f"{router.url}/v1/chat/completions", json={**CHAT, "max_tokens": 3})
    assert ok.status_code == 200  # a short one is well within it
    assert_clean(router.url, sims["speculative"].url, sims["baseline"].url)
