"""The health poller against what each engine's health endpoints cost (issue 12 item 1).

SGLang's ``/health`` generates a token and answers after >= 1 s; 0.5.23 has a cheap
``/ready``; vLLM's ``/health`` is a flag check and it has no ``/ready``. The router is run
in-process (its poller in the test's loop) against real sims.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from router.app import RouterApp
from router.health.state import State
from router.settings import Settings
from tests.support.http import await_for
from tests.support.processes import Proc, free_port, running, sim_args

pytestmark = pytest.mark.anyio

ENGINE_ARGS = {
    "sglang": ["--engine", "sglang"],
    "sglang-0.5.3": ["--engine", "sglang", "--engine-version", "0.5.3"],
    "vllm": ["--engine", "vllm"],
}


def hold(url: str, max_tokens: int) -> socket.socket:
    """Start a streamed request and leave it running (the answer is never read)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "stream": True}
    ).encode()
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    return sock


def generations(url: str) -> int:
    return int(httpx.get(f"{url}/sim/config").json()["health_generations"])


async def _true(value: bool) -> bool:
    return value


def router_for(url: str, **settings: object) -> RouterApp:
    # the other pool's backend never answers: only ``url`` is probed successfully
    return RouterApp(
        Settings(
            speculative_urls=[url],
            baseline_urls=[f"http://127.0.0.1:{free_port()}"],
            **settings,  # type: ignore[arg-type]
        )
    )


@pytest.fixture(params=sorted(ENGINE_ARGS))
def slow_engine(request: pytest.FixtureRequest) -> Iterator[tuple[str, Proc]]:
    """A sim whose every forward takes 1.5 s (real time), busy with one long stream."""
    args = sim_args("baseline", "--time-scale", "1", "--a-ms", "1500", "--warmup", "0")
    with running([*args, *ENGINE_ARGS[request.param]]) as sim, hold(sim.url, 1000):
        yield request.param, sim


async def test_a_busy_engine_with_slow_forwards_stays_healthy(
    slow_engine: tuple[str, Proc],
) -> None:
    # HEALTH_TIMEOUT 0.5 s: fine for a flag check, far too short for SGLang's /health, which
    # looks for output every second and sees some only when a 1.5-s forward ends. Two failed
    # probes would make it unhealthy (it would never leave ``starting``).
    kind, sim = slow_engine
    app = router_for(sim.url, health_interval=0.2, health_timeout=0.5, fall=2)
    async with app.running():
        assert app.poller is not None
        await await_for(lambda: _true(app.health.states[sim.url].checks >= 3), timeout=30)
        h = app.health.states[sim.url]
        assert h.state is State.HEALTHY and h.failures == 0, h
        path, timeout = app.poller.probe_of(sim.url)
        if kind == "sglang":
            assert (path, timeout) == (b"/ready", 0.5)
        elif kind == "sglang-0.5.3":  # no /ready: /health, with a timeout above SGLang's 20 s
            assert (path, timeout) == (b"/health", 25.0)
        else:
            assert (path, timeout) == (b"/health", 0.5)  # vLLM: a flag check
    assert generations(sim.url) == 0  # busy: SGLang skips the probe's generation


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
async def test_an_idle_engine_gets_no_generation_from_the_probes(kind: str) -> None:
    args = [*sim_args("baseline", "--time-scale", "0.1"), *ENGINE_ARGS[kind]]
    with running(args) as sim:
        app = router_for(sim.url, health_interval=0.05)
        async with app.running():
            await await_for(lambda: _true(app.health.states[sim.url].checks >= 10))
            assert app.health.states[sim.url].state is State.HEALTHY
        assert generations(sim.url) == 0


async def test_sglang_053_probes_generate_and_say_so() -> None:
    # Without /ready the probe is /health, which generates on an idle SGLang 0.5.3: the price
    # of its health check (README: probe it less often, or run a version with /ready).
    args = [*sim_args("baseline", "--time-scale", "0.1"), *ENGINE_ARGS["sglang-0.5.3"]]
    with running(args) as sim:
        app = router_for(sim.url, health_interval=0.05)
        async with app.running():
            await await_for(lambda: _true(app.health.states[sim.url].checks >= 3))
            assert app.health.states[sim.url].state is State.HEALTHY
            await asyncio.sleep(0)
        assert generations(sim.url) >= 3
