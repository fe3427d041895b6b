"""The OpenAI-compatible endpoints of both presets over real HTTP."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from router.sim.protocol import filler
from tests.sim.conftest import chat_body, metrics
from tests.support.processes import Proc


def sse_events(text: str) -> list[str]:
    assert text.endswith("data: [DONE]\n\n")
    parts = text[:-2].split("\n\n")
    assert all(p.startswith("data: ") for p in parts), parts
    return [p[len("data: ") :] for p in parts]


def engine_counts(sim: Proc) -> dict[str, int]:
    engine = httpx.get(sim.url + "/sim/config").json()["engine"]
    return {k: int(engine[k]) for k in ("iterations", "spec_steps", "spec_tokens")}


def test_stream_chat_format_and_usage(sim: Proc) -> None:
    body = chat_body(37, stream=True, stream_options={"include_usage": True})
    before = engine_counts(sim)
    with httpx.stream("POST", sim.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        text = resp.read().decode()
    after = engine_counts(sim)
    ran = {k: after[k] - before[k] for k in after}
    *chunks, done = sse_events(text)
    assert done == "[DONE]"
    parsed = [json.loads(c) for c in chunks]
    role, *content, finish, usage = parsed
    assert role["choices"][0]["delta"] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": None,
        "tool_calls": None,
    }
    assert len({c["id"] for c in parsed}) == 1 and len(role["id"]) == 32
    assert all(c["object"] == "chat.completion.chunk" for c in parsed)
    pieces = [c["choices"][0]["delta"]["content"] for c in content]
    assert all(c["choices"][0]["finish_reason"] is None for c in content)
    assert "".join(pieces) == filler(0, 37)
    # What each iteration yields, counted by the engine: the stream's chunks carry one
    # iteration's tokens each, or several when the handler fell behind (a loaded machine; as
    # SGLang's detokenizer does), never part of one.
    sizes = [len(p.split()) for p in pieces]
    assert 0 < len(sizes) <= ran["iterations"] and all(n > 0 for n in sizes)
    if "eagle3" in resp.headers["x-sim-preset"]:
        # the join iteration yields one token, then verify steps several each (at most
        # spec_k + 1 = 4 accepted, the last cut by max_tokens)
        assert ran["spec_steps"] == ran["iterations"] - 1
        assert ran["iterations"] < 37
        assert ran["spec_steps"] < ran["spec_tokens"] <= 4 * ran["spec_steps"]
    else:
        assert ran == {"iterations": 37, "spec_steps": 0, "spec_tokens": 0}  # one token each
    assert finish["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []
    assert usage["usage"]["prompt_tokens"] == 4
    assert usage["usage"]["completion_tokens"] == 37
    assert usage["usage"]["total_tokens"] == 41


def test_stream_without_usage_and_completions(sim: Proc) -> None:
    text = httpx.post(sim.url + "/v1/chat/completions", json=chat_body(5, stream=True)).text
    assert all('usage":{' not in e for e in sse_events(text))
    body = {
        "prompt": "one two",
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    text = httpx.post(sim.url + "/v1/completions", json=body).text
    *chunks, done = sse_events(text)
    parsed = [json.loads(c) for c in chunks]
    assert all(c["object"] == "text_completion" for c in parsed)
    assert "".join(c["choices"][0]["text"] for c in parsed[:-1]) == filler(0, 6)
    assert parsed[-1]["usage"]["completion_tokens"] == 6
    assert parsed[-1]["usage"]["prompt_tokens"] == 2


def test_non_streaming(sim: Proc) -> None:
    resp = httpx.post(sim.url + "/v1/chat/completions", json=chat_body(12))
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == filler(0, 12)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": 4,
        "total_tokens": 16,
        "completion_tokens": 12,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }
    resp = httpx.post(sim.url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 3})
    assert resp.json()["choices"][0]["text"] == filler(0, 3)
    assert resp.json()["usage"]["prompt_tokens"] == 3


def test_openai_sdk(sim: Proc) -> None:
    with openai.OpenAI(base_url=sim.url + "/v1", api_key="unused") as client:
        stream = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            if chunk.usage:
                usage = chunk.usage
        assert text == filler(0, 20)
        assert usage is not None and usage.completion_tokens == 20 and usage.prompt_tokens == 2
        reply = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=7
        )
        assert reply.choices[0].message.content == filler(0, 7)
        assert reply.usage is not None and reply.usage.completion_tokens == 7
        completion = client.completions.create(model="default", prompt="a b c", max_tokens=4)
        assert completion.choices[0].text == filler(0, 4)
        pieces = client.completions.create(
            model="default", prompt="a b c", max_tokens=9, stream=True
        )
        assert "".join(c.choices[0].text for c in pieces if c.choices) == filler(0, 9)
        assert [m.id for m in client.models.list()] == ["default"]


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/v1/chat/completions", b"{oops"),
        ("/v1/chat/completions", b'"a string"'),
        ("/v1/chat/completions", b'{"max_tokens": 5}'),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "n": 2}'),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -3}',
        ),
        ("/v1/completions", b'{"max_tokens": 5}'),
        ("/v1/completions", b'{"prompt": "x", "temperature": -1}'),
    ],
)
def test_bad_input_is_a_400_in_the_engines_shape(
    eagle3: Proc, vllm_eagle3: Proc, path: str, raw: bytes
) -> None:
    headers = {"content-type": "application/json"}
    flat = httpx.post(eagle3.url + path, content=raw, headers=headers)
    assert flat.status_code == 400
    body = flat.json()  # SGLang: {"object": "error", ...} at the top
    assert set(body) == {"object", "message", "type", "param", "code"}
    assert (body["object"], body["type"], body["code"]) == ("error", "BadRequest", 400)
    assert body["message"]
    nested = httpx.post(vllm_eagle3.url + path, content=raw, headers=headers)
    assert nested.status_code == 400
    error = nested.json()["error"]  # vLLM: the OpenAI shape
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("BadRequestError", 400) and error["message"]


def test_openai_sdk_sees_bad_request(baseline: Proc) -> None:
    with openai.OpenAI(base_url=baseline.url + "/v1", api_key="x", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="default", messages=[], max_tokens=2)
    assert "messages" in str(info.value)


def test_routes(baseline: Proc) -> None:
    assert httpx.get(baseline.url + "/nope").status_code == 404
    assert httpx.get(baseline.url + "/nope").json() == {"detail": "Not Found"}  # FastAPI's
    assert httpx.get(baseline.url + "/v1/chat/completions").status_code == 405
    assert httpx.get(baseline.url + "/health").status_code == 200
    models = httpx.get(baseline.url + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "default"


def test_server_info(eagle3: Proc, baseline: Proc) -> None:
    # a lifetime mean over the 40-iteration windows reported so far (none after 200 tokens
    # would be ~71 iterations: at least one window)
    httpx.post(eagle3.url + "/v1/chat/completions", json=chat_body(200))
    info = httpx.get(eagle3.url + "/server_info").json()
    assert info["speculative_algorithm"] == "EAGLE3"
    assert 1.0 <= info["internal_states"][0]["avg_spec_accept_length"] <= 4.0
    assert "avg_spec_accept_length" not in info  # per DP rank only
    assert info["max_running_requests"] == 48
    plain = httpx.get(baseline.url + "/get_server_info").json()
    assert plain["speculative_algorithm"] is None
    assert "avg_spec_accept_length" not in plain["internal_states"][0]
    # what bench/sim_fidelity.py reads of the engine loop: iterations and how late they ended
    engine = info["sim"]["engine"]
    assert engine["iterations"] >= 1 + 199 // 4 and engine["spec_tokens"] >= 199  # <= 4 a step
    assert 0 <= engine["late_mean_ms"] <= engine["late_max_ms"]


def test_metrics_count_exactly(sim: Proc) -> None:
    before = metrics(sim.url)
    for n in (10, 23):
        httpx.post(sim.url + "/v1/chat/completions", json=chat_body(n, stream=True))
    after = metrics(sim.url)
    assert after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"] == 33
    assert after["sglang:prompt_tokens_total"] - before["sglang:prompt_tokens_total"] == 8
    assert after["sglang:num_requests_total"] - before["sglang:num_requests_total"] == 2
    ttft = "sglang:time_to_first_token_seconds_count"
    assert after[ttft] - before[ttft] == 2
    # Like SGLang, the inter-token histogram counts tokens (not chunks) after the first.
    itl = "sglang:inter_token_latency_seconds_count"
    assert after[itl] - before[itl] == 31
    assert after["sglang:num_running_reqs"] == 0 and after["sglang:num_queue_reqs"] == 0
    text = httpx.get(sim.url + "/metrics").text
    assert 'sglang:num_running_reqs{engine_type="unified",model_name="default",' in text
    assert (
        'sglang:generation_tokens_total{engine_type="unified",is_streaming="true",'
        'model_name="default"}' in text
    )
    assert "sglang:spec_accept_length{" in text and "sglang:gen_throughput{" in text
