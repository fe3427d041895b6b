"""Per-pool model names and upstream API keys, with sims that check both (like vLLM/SGLang
started with --served-model-name and --api-key)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import TIME_SCALE, RouterFactory
from tests.support.http import router_status, wait_for
from tests.support.processes import Proc, free_port, running, sim_args, spawn

pytestmark = pytest.mark.anyio

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


@pytest.fixture
def named_sims() -> Iterator[dict[str, Proc]]:
    strict = ["--time-scale", TIME_SCALE, "--engine", "vllm"]  # 404s unknown model names
    procs = {
        "speculative": spawn(sim_args("eagle3", *strict, "--model", "m-eagle", "--api-key", "sk")),
    }
    try:
        procs["baseline"] = spawn(
            sim_args("baseline", *strict, "--model", "m-base", "--api-key", "bk")
        )
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


def settings(**extra: str) -> dict[str, str]:
    return {
        "speculative_model_map": "m=m-eagle",
        "baseline_model_map": '{"m": "m-base"}',
        "speculative_api_key": "sk",
        "baseline_api_key": "bk",
        "api_keys": "client-key",
        "crossover": "1",
        **extra,
    }


async def test_public_name_and_client_key_in_pool_names_and_keys_out(
    start_router: RouterFactory, named_sims: dict[str, Proc]
) -> None:
    """Checklist case 13: Authorization is end to end unless a pool has its own key."""
    spec, base = named_sims["speculative"], named_sims["baseline"]
    router = start_router(spec.url, base.url, **settings())
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(
            openai.AsyncOpenAI(base_url=f"{router.url}/v1", api_key="client-key", max_retries=0)
        )
        assert [m.id for m in (await client.models.list()).data] == ["m"]
        # first stream: speculative (below crossover 1); it stays open
        first = await stack.enter_async_context(
            client.chat.completions.with_streaming_response.create(
                model="m",
                messages=MESSAGES,
                max_tokens=3000,
                stream=True,
            )
        )
        assert first.headers["x-spec-router-pool"] == "speculative"
        # second: baseline, under its own name and key, answered under the public name
        raw = await client.chat.completions.with_raw_response.create(
            model="m",
            messages=MESSAGES,
            max_tokens=4,
        )
        assert raw.headers["x-spec-router-pool"] == "baseline"
        completion = raw.parse()
        assert completion.model == "m" and completion.usage is not None
        stream = await client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            max_tokens=5,
            stream=True,
        )
        models = {chunk.model async for chunk in stream}
        assert models == {"m"}
        async for line in first.iter_lines():
            if line.startswith("data: {"):
                assert '"model":"m"' in line and "m-eagle" not in line
                break
    assert router_status(router.url)["in_flight"]["total"] == 0


def test_without_the_pool_key_the_engine_refuses(
    start_router: RouterFactory, named_sims: dict[str, Proc]
) -> None:
    spec, base = named_sims["speculative"], named_sims["baseline"]
    router = start_router(spec.url, base.url, **settings(speculative_api_key="wrong"))
    r = httpx.post(
        f"{router.url}/v1/chat/completions",
        json={"model": "m", "messages": MESSAGES, "max_tokens": 2},
        headers={"authorization": "Bearer client-key"},
    )
    # the engine's own 401 passes through; the client's key never reached it either
    assert r.status_code == 401 and r.headers["x-spec-router-pool"] == "speculative"
    unmapped = start_router(spec.url, base.url, **settings(speculative_model_map=""))
    r = httpx.post(
        f"{unmapped.url}/v1/chat/completions",
        json={"model": "m", "messages": MESSAGES, "max_tokens": 2},
        headers={"authorization": "Bearer client-key"},
    )
    assert r.status_code == 404 and "does not exist" in r.json()["error"]["message"]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_request_without_a_model_goes_as_the_pools_model(
    start_router: RouterFactory, engine: str
) -> None:
    # Both engines serve a request that names no model (SGLang as "default", vLLM as its
    # first served name). The router sends it as the model the backend lists at /v1/models,
    # read once with the pool's key (both guard /v1/*), so the answer names the served model.
    args = ["--time-scale", TIME_SCALE, "--engine", engine, "--model", "m-served"]
    with running(sim_args("eagle3", *args, "--api-key", "sk")) as spec:
        router = start_router(
            spec.url, f"http://127.0.0.1:{free_port()}", policy="crossover", crossover="4",
            speculative_api_key="sk", one_pool=True,
        )  # fmt: skip

        def served() -> object:
            return router_status(router.url)["pools"]["speculative"]["backends"][0]["served_model"]

        wait_for(lambda: served() == "m-served")
        body = {"messages": MESSAGES, "max_tokens": 3}
        r = httpx.post(f"{router.url}/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "m-served"  # SGLang would have said "default"
        stream = httpx.post(f"{router.url}/v1/completions", json={"prompt": "a", "stream": True})
        assert stream.status_code == 200 and '"model":"m-served"' in stream.text
