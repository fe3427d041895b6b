"""The router over real sockets: sims and router as processes, the official openai SDK as client."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import TIME_SCALE, RouterFactory
from tests.support.http import HOLD, metric_value, router_status, sim_running, wait_for
from tests.support.processes import Proc, free_port, running, sim_args

pytestmark = pytest.mark.anyio

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Tell me about speculative decoding."}
]
CHAT_BODY = {"model": "sim", "messages": MESSAGES, "max_tokens": 17, "stream": True}


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def async_sdk(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


async def test_lone_request_goes_speculative_streaming_and_not(start_router: RouterFactory) -> None:
    router = start_router(policy="crossover", crossover="4")
    client = sdk(router.url)
    raw = client.chat.completions.with_raw_response.create(
        model="sim", messages=MESSAGES, max_tokens=12
    )
    assert raw.headers["x-spec-router-pool"] == "speculative"
    assert raw.headers["x-spec-router-reason"] == "below_crossover"
    completion = raw.parse()
    assert completion.usage is not None and completion.usage.completion_tokens == 12

    with client.chat.completions.with_streaming_response.create(
        model="sim", messages=MESSAGES, max_tokens=20, stream=True,
        stream_options={"include_usage": True},
    ) as response:  # fmt: skip
        assert response.headers["x-spec-router-pool"] == "speculative"
        chunks = list(response.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 20
    assert router_status(router.url)["in_flight"]["total"] == 0


async def _open_streams(url: str, n: int, stack: contextlib.AsyncExitStack) -> list[str]:
    """Open ``n`` streams one after another, each held on its sim after a few tokens until its
    client leaves (in flight for as long as the test needs, however slow the host); return
    the pool each went to."""
    client = await stack.enter_async_context(async_sdk(url))
    pools = []
    for _ in range(n):
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
    return pools


async def test_crossover_policy_splits_16_streams_4_to_12(
    start_router: RouterFactory, sims: dict[str, Proc]
) -> None:
    router = start_router(policy="crossover", crossover="4", hysteresis="0")
    async with contextlib.AsyncExitStack() as stack:
        pools = await _open_streams(router.url, 16, stack)
        assert pools == ["speculative"] * 4 + ["baseline"] * 12
        status = router_status(router.url)
        assert status["in_flight"] == {"speculative": 4, "baseline": 12, "total": 16}
    wait_for(lambda: router_status(router.url)["in_flight"]["total"] == 0, timeout=2)
    wait_for(
        lambda: (
            sim_running(sims["speculative"].url) == 0 and sim_running(sims["baseline"].url) == 0
        ),
        timeout=2,
    )


async def test_spillover_counts_only_the_speculative_pool(start_router: RouterFactory) -> None:
    router = start_router(policy="spillover", crossover="4")
    async with contextlib.AsyncExitStack() as outer:
        async with contextlib.AsyncExitStack() as first_two:
            assert await _open_streams(router.url, 2, first_two) == ["speculative"] * 2
            later = await _open_streams(router.url, 14, outer)
            assert later == ["speculative"] * 2 + ["baseline"] * 12

        # two speculative streams ended: the total is still 14, far above 4, but spillover
        # only asks whether the speculative pool is below its crossover (once the engine let
        # go of the two: SGLang aborts them a moment after their clients left)
        def speculative_load() -> int:
            pool = router_status(router.url)["pools"]["speculative"]
            return int(pool["backends"][0]["load"])

        wait_for(lambda: speculative_load() == 2)
        assert await _open_streams(router.url, 3, outer) == [
            "speculative",
            "speculative",
            "baseline",
        ]


async def test_200_streams_aborted_at_random_points_leave_nothing(
    start_router: RouterFactory, engine_sims: dict[str, Proc]
) -> None:
    """Checklist case 7: clients that leave at random points cancel the upstream and release
    everything (SGLang-mode sims abort each 2 s after its client left, 0.2 s here)."""
    sims = engine_sims
    router = start_router(sims["speculative"].url, sims["baseline"].url)
    rng = random.Random(7)
    body = {"model": "sim", "messages": MESSAGES, "max_tokens": 400, "stream": True}
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=0)

    async def one(client: httpx.AsyncClient, i: int) -> str:
        mode = i % 3
        if mode == 0:  # gone before the response headers (during upstream connect / queueing)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(rng.uniform(0.0, 0.02)):
                    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        await r.aread()
            return "early"
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            if mode == 1:  # right after the headers, before the first token
                return "headers"
            wanted = rng.randint(1, 6)  # mid-stream
            seen = 0
            async for _ in r.aiter_raw():
                seen += 1
                if seen >= wanted:
                    break
            return "mid"

    async with httpx.AsyncClient(base_url=router.url, limits=limits, timeout=30) as client:
        kinds = await asyncio.gather(*(one(client, i) for i in range(200)))
    assert {"early", "headers", "mid"} <= set(kinds)
    wait_for(lambda: router_status(router.url)["in_flight"]["total"] == 0, timeout=1.0)
    wait_for(lambda: sim_running(sims["speculative"].url) == 0, timeout=2.0)
    wait_for(lambda: sim_running(sims["baseline"].url) == 0, timeout=2.0)
    text = httpx.get(f"{router.url}/metrics").text
    assert metric_value(text, "spec_router_client_disconnects_total") >= 100


@pytest.mark.parametrize(
    ("content", "headers", "status", "code"),
    [
        (b"{not json", {"content-type": "application/json"}, 400, "invalid_json"),
        (b'{"model": 3}', {"content-type": "application/json"}, 400, "invalid_model"),
        (b"", {}, 400, "invalid_json"),
        (b"x" * 4096, {"content-type": "application/json"}, 413, "body_too_large"),
    ],
)
async def test_bad_input_is_refused_without_touching_a_backend(
    start_router: RouterFactory, content: bytes, headers: dict[str, str], status: int, code: str
) -> None:
    """Checklist cases 6 and 8: malformed JSON is a 400 and a huge body a 413, without a backend."""
    router = start_router(max_body_bytes="1024")
    response = httpx.post(f"{router.url}/v1/chat/completions", content=content, headers=headers)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and error["type"] == "invalid_request_error"
    text = httpx.get(f"{router.url}/metrics").text
    assert metric_value(text, "spec_router_routing_decisions_total") == 0
    assert metric_value(text, "spec_router_requests_total", pool="none", code=str(status)) == 1


async def test_unknown_path_outside_v1_is_404(start_router: RouterFactory) -> None:
    router = start_router()
    response = httpx.get(f"{router.url}/nope")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


async def test_models_and_other_v1_paths(start_router: RouterFactory) -> None:
    router = start_router()
    models = sdk(router.url).models.list()
    assert [m.id for m in models.data]
    # a /v1 path the router does not know is still the engine's to answer
    response = httpx.get(f"{router.url}/v1/does-not-exist")
    assert response.headers["x-spec-router-pool"] in ("speculative", "baseline")
    assert response.status_code == 404


async def test_headers_pass_through_and_forwarded_for(start_router: RouterFactory) -> None:
    router = start_router()
    response = httpx.post(
        f"{router.url}/v1/completions",
        json={"model": "sim", "prompt": "hi", "max_tokens": 3},
        headers={"x-request-id": "abc-123", "connection": "keep-alive"},
    )
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 3
    assert (
        "transfer-encoding" not in response.headers
        or response.headers["transfer-encoding"] == "chunked"
    )
    assert response.headers["x-spec-router-reason"] == "below_crossover"


TEXT = re.compile(rb'"(content|text)":"((?:[^"\\]|\\.)*)"')
COUNTS = re.compile(rb'"(prompt|completion|total)_tokens":\d+')


def _normalise(body: bytes) -> bytes:
    """Blank the per-call fields (`id`, `created`) that differ between any two engine calls,
    and join consecutive text chunks of one shape. An engine whose handler lags sends two
    steps' tokens as one chunk (SGLang's detokenizer does; so do the sims on a loaded machine),
    so two calls of one request may cut the same text at other places: what must match is
    every byte of each event but where the text is cut (the joined chunk is the later one, its
    text the two texts, its running usage, if any, the later count)."""
    body = re.sub(rb'"id":"[^"]*"', b'"id":"-"', body)
    body = re.sub(rb'"created":\d+', b'"created":0', body)
    events: list[bytes] = []
    shape = b""  # the previous event's, when it is a text chunk that may be joined
    for event in body.split(b"\n\n"):
        found = TEXT.search(event)
        joinable = (
            found is not None
            and found.group(2) != b""
            and b'"finish_reason":null' in event
            and b'"role":"assistant"' not in event
        )
        this = COUNTS.sub(b"", TEXT.sub(b"", event)) if joinable else b""
        if joinable and this == shape and events:
            assert found is not None
            text = TEXT.search(events[-1])
            assert text is not None
            joined = text.group(2) + found.group(2)
            events[-1] = event[: found.start(2)] + joined + event[found.end(2) :]
        else:
            events.append(event)
        shape = this
    return b"\n\n".join(events)


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions"])
async def test_stream_without_usage_is_what_the_engine_sends_and_is_counted(
    start_router: RouterFactory, sims: dict[str, Proc], endpoint: str
) -> None:
    # crossover 0: everything to the baseline sim, whose chunking is deterministic
    router = start_router(crossover="0")
    body = {"model": "sim", "max_tokens": 17, "stream": True}
    body |= {"messages": MESSAGES} if endpoint.startswith("chat") else {"prompt": "once upon"}
    direct = httpx.post(f"{sims['baseline'].url}/v1/{endpoint}", json=body)
    routed = httpx.post(f"{router.url}/v1/{endpoint}", json=body)
    assert routed.headers["x-spec-router-pool"] == "baseline"
    assert b'"usage":{' not in routed.content  # the client did not ask for it
    assert _normalise(routed.content) == _normalise(direct.content)
    text = httpx.get(f"{router.url}/metrics").text
    assert metric_value(text, "spec_router_output_tokens_total", pool="baseline") == 17
    assert metric_value(text, "spec_router_prompt_tokens_total", pool="baseline") > 0
    # a client that asks for usage gets it, counted once more
    asked = httpx.post(
        f"{router.url}/v1/{endpoint}", json={**body, "stream_options": {"include_usage": True}}
    )
    assert b'"completion_tokens":17' in asked.content
    text = httpx.get(f"{router.url}/metrics").text
    assert metric_value(text, "spec_router_output_tokens_total", pool="baseline") == 34


USAGE_ENGINES = {
    "sglang": ["--engine", "sglang"],  # 0.5.23: {} means no usage; continuous usage honoured
    "vllm-0.11": ["--engine", "vllm", "--engine-version", "0.11", "--model", "sim"],  # {}: usage
}


@pytest.mark.parametrize("engine", sorted(USAGE_ENGINES))
def test_stream_options_the_client_set_reach_the_engine_untouched(
    start_router: RouterFactory, engine: str
) -> None:
    # Whatever stream_options a client sends, it gets exactly what the engine would send it;
    # the router counts the usage when there is some. crossover 0: all to the baseline sim.
    args = sim_args("baseline", "--time-scale", TIME_SCALE, *USAGE_ENGINES[engine])
    with running(args) as base:
        router = start_router(
            f"http://127.0.0.1:{free_port()}", base.url, crossover="0", one_pool=True
        )
        counted = 0.0
        for options in (
            {},
            {"continuous_usage_stats": True},
            {"include_usage": True, "continuous_usage_stats": True},
            {"include_usage": False},
        ):
            body = {**CHAT_BODY, "stream_options": options}
            direct = httpx.post(f"{base.url}/v1/chat/completions", json=body)
            routed = httpx.post(f"{router.url}/v1/chat/completions", json=body)
            assert routed.status_code == 200, routed.text
            assert _normalise(routed.content) == _normalise(direct.content), options
            if b'"completion_tokens":17' in direct.content:
                counted += 17
            elif options == {"include_usage": False}:
                counted += 17  # asked for on the client's behalf, and stripped again
            text = httpx.get(f"{router.url}/metrics").text
            assert metric_value(text, "spec_router_output_tokens_total", pool="baseline") == counted
        # vLLM 0.11 read {} as a request for usage, SGLang did not
        assert counted == (4 if engine == "vllm-0.11" else 3) * 17


def test_api_keys_are_required_when_configured(start_router: RouterFactory) -> None:
    router = start_router(api_keys="k-one,k-two")
    url = f"{router.url}/v1/chat/completions"
    body = {"model": "sim", "messages": MESSAGES, "max_tokens": 2}
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "k-one"}):
        r = httpx.post(url, json=body, headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["error"]["type"] == "authentication_error"
        assert r.headers["www-authenticate"] == "Bearer"
    assert httpx.post(url, json=body, headers={"authorization": "Bearer k-two"}).status_code == 200
    assert httpx.post(url, json=body, headers={"x-api-key": "k-one"}).status_code == 200
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="k-one", max_retries=0)
    completion = client.completions.create(model="sim", prompt="hi", max_tokens=2)
    assert completion.usage is not None and completion.usage.completion_tokens == 2
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{router.url}/v1", api_key="bad", max_retries=0).models.list()
