"""The engine-facing helpers against canned answers (``httpx.MockTransport``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx
import pytest

from router.calibrate.sweep import acceptance, discover_model, scrape, wait_idle
from router.health import engines as engine_metrics

Handler = Callable[[httpx.Request], httpx.Response]
T = TypeVar("T")

SGLANG = """# HELP sglang:num_running_reqs x
sglang:num_running_reqs{{model_name="m"}} {running}
sglang:num_queue_reqs{{model_name="m"}} {queued}
sglang:spec_accept_length{{model_name="m"}} {accept}
"""
VLLM = """vllm:num_requests_running{{model_name="m"}} 0
vllm:spec_decode_num_accepted_tokens_total{{model_name="m"}} {accepted}
vllm:spec_decode_num_drafts_total{{model_name="m"}} {drafts}
"""


def run(handler: Handler, coro: Callable[[httpx.AsyncClient], Awaitable[T]]) -> T:
    async def go() -> T:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await coro(client)

    return asyncio.run(go())


def test_wait_idle_returns_when_the_engine_drains() -> None:
    loads = iter([3, 1, 0, 5])

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=SGLANG.format(running=next(loads), queued=0, accept=0))

    run(handler, lambda c: wait_idle(c, "http://e"))
    assert next(loads) == 5  # stopped at the 0


def test_wait_idle_gives_up_on_a_gauge_that_does_not_move() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(200, text=SGLANG.format(running=4, queued=0, accept=0))

    run(handler, lambda c: wait_idle(c, "http://e", timeout=5.0, stale=0.2))
    assert 3 <= calls < 20


def test_wait_idle_and_scrape_without_metrics() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404)

    run(handler, lambda c: wait_idle(c, "http://e"))
    assert run(handler, lambda c: scrape(c, "http://e")) is None


def test_acceptance_from_server_info_with_the_key_per_dp_rank() -> None:
    # SGLang 0.5.3 (no spec_verify_calls_total): its lifetime mean, one per DP rank, behind
    # the API key
    def handler(request: httpx.Request) -> httpx.Response:
        if request.headers.get("authorization") != "Bearer k":
            return httpx.Response(401, json={"error": "Unauthorized"})
        if request.url.path == "/get_server_info":
            states = [{"avg_spec_accept_length": 2.6}, {"avg_spec_accept_length": 2.8}, {}]
            return httpx.Response(200, json={"internal_states": states})
        return httpx.Response(404)

    key = {"authorization": "Bearer k"}
    tau, source = run(handler, lambda c: acceptance(c, "http://e", None, None, key))
    assert tau == pytest.approx(2.7) and source == "avg_spec_accept_length from /get_server_info"
    assert run(handler, lambda c: acceptance(c, "http://e", None, None))[0] == 1.0  # no key


def test_acceptance_from_sglang_counters_over_the_sweep() -> None:
    # 0.5.23: generated tokens / verify calls, counted as requests end, over the sweep -- not
    # /server_info's lifetime mean (warm-up included), which it does not even ask for
    text = (
        'sglang:num_running_reqs{{model_name="m"}} 0\n'
        'sglang:spec_accept_length{{model_name="m"}} 2.0\n'
        'sglang:generation_tokens_total{{model_name="m",is_streaming="true"}} {gen}\n'
        'sglang:spec_verify_calls_total{{model_name="m"}} {ver}\n'
    )
    before = engine_metrics.parse(text.format(gen=500, ver=400))
    after = engine_metrics.parse(text.format(gen=3300, ver=1400))

    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"asked {request.url}")

    tau, source = run(handler, lambda c: acceptance(c, "http://e", before, after))
    assert tau == pytest.approx(2.8) and "spec_verify_calls" in source


def test_acceptance_from_vllm_counters_over_the_sweep() -> None:
    before = engine_metrics.parse(VLLM.format(accepted=100, drafts=100))
    after = engine_metrics.parse(VLLM.format(accepted=280, drafts=200))

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404)

    tau, source = run(handler, lambda c: acceptance(c, "http://e", before, after))
    assert tau == 1.0 + 180 / 100 and "vllm" in source


def test_acceptance_from_llamacpp_counters_over_the_sweep() -> None:
    text = "llamacpp:requests_processing 0\nllamacpp:spec_decode_num_drafts_total {drafts}\n"
    text += "llamacpp:spec_decode_num_accepted_tokens_total {accepted}\n"
    before = engine_metrics.parse(text.format(accepted=0, drafts=0))
    after = engine_metrics.parse(text.format(accepted=2700, drafts=1000))

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404)

    tau, source = run(handler, lambda c: acceptance(c, "http://e", before, after))
    assert tau == 3.7 and source == "llamacpp spec_decode counters over the sweep"


def test_acceptance_falls_back_to_the_gauge_then_to_one() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=SGLANG.format(running=0, queued=0, accept=2.4))
        return httpx.Response(500)

    async def go(client: httpx.AsyncClient) -> tuple[float, str]:
        after = await scrape(client, "http://e")
        return await acceptance(client, "http://e", None, after)

    assert run(handler, go) == (2.4, "sglang:spec_accept_length from /metrics")

    def nothing(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=SGLANG.format(running=0, queued=0, accept=0))

    tau, source = run(nothing, lambda c: acceptance(c, "http://e", None, None))
    assert tau == 1.0 and "no acceptance length" in source


def test_discover_model() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer k"
        return httpx.Response(200, content=json.dumps({"data": [{"id": "llama"}]}))

    assert run(handler, lambda c: discover_model(c, "http://e", {"authorization": "Bearer k"})) == (
        "llama"
    )
    assert run(lambda r: httpx.Response(404), lambda c: discover_model(c, "http://e", {})) == (
        "default"
    )
