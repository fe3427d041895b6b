"""Request parsing, answer rendering and the fault spec language, without a server."""

from __future__ import annotations

import json
import math

import pytest

from router.sim.faults import NO_FAULT, FaultSpecError, parse_fault
from router.sim.protocol import (
    BadRequest,
    Job,
    Limits,
    StreamFormat,
    error_body,
    filler,
    full_response,
    parse_job,
)

LIMITS = Limits("sim-model", default_max_tokens=16, context_length=1000)


def chat(**body: object) -> Job:
    body.setdefault("messages", [{"role": "user", "content": "one two three"}])
    return parse_job("chat", json.dumps(body).encode(), LIMITS)


def test_filler_counts_exactly_and_continues() -> None:
    for n in (1, 2, 7, 8, 9, 100, 1001):
        assert len(filler(0, n).split()) == n
    assert filler(0, 5) + filler(5, 12) == filler(0, 17)
    assert filler(3, 0) == ""


def test_prompt_tokens_are_words() -> None:
    assert chat().prompt_tokens == 3
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a b c"}, {"type": "image_url"}]},
        {"role": "assistant", "content": None},
    ]
    assert chat(messages=messages).prompt_tokens == 5
    assert chat(messages=[{"role": "user", "content": ""}]).prompt_tokens == 1
    completion = parse_job("completions", b'{"prompt": "x y"}', LIMITS)
    assert completion.prompt_tokens == 2
    ids = parse_job("completions", b'{"prompt": [1, 2, 3, 4]}', LIMITS)
    assert ids.prompt_tokens == 4
    assert parse_job("completions", b'{"prompt": ["x y z"]}', LIMITS).prompt_tokens == 3


def test_defaults_and_options() -> None:
    job = chat()
    assert (job.max_tokens, job.temperature, job.stream, job.include_usage) == (
        16,
        1.0,
        False,
        False,
    )
    assert job.model == "sim-model"
    options = {"include_usage": True}
    job = chat(
        max_tokens=5,
        max_completion_tokens=7,
        temperature=0,
        stream=True,
        stream_options=options,
        model="m",
        stop=["x"],
        seed=3,
    )
    assert (job.max_tokens, job.temperature, job.stream, job.include_usage) == (7, 0.0, True, True)
    assert (job.model, job.seed) == ("m", 3)


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"max_tokens": 4}', "messages"),
        (b'{"messages": []}', "messages"),
        (b'{"messages": ["hi"]}', "messages"),
        (b'{"messages": [{"role": "user", "content": 5}]}', "messages"),
        (b'{"messages": [{"role": "user", "content": "x"}], "n": 2}', "n"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}', "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": true}', "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "x"}], "temperature": 3}', "temperature"),
        (b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
        (b'{"messages": [{"role": "user", "content": "x"}], "stop": 4}', "stop"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1000}', None),
    ],
)
def test_bad_chat_requests(raw: bytes, param: str | None) -> None:
    with pytest.raises(BadRequest) as info:
        parse_job("chat", raw, LIMITS)
    assert info.value.param == param


@pytest.mark.parametrize(
    "raw", [b"{}", b'{"prompt": []}', b'{"prompt": ["a", "b"]}', b'{"prompt": 3}']
)
def test_bad_completion_requests(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        parse_job("completions", raw, LIMITS)


def test_error_shapes() -> None:
    # vLLM: nested, with its own type names
    body = json.loads(error_body(400, "nope", "n"))
    assert body == {
        "error": {"message": "nope", "type": "BadRequestError", "param": "n", "code": 400}
    }
    assert json.loads(error_body(404, "gone"))["error"]["type"] == "NotFoundError"
    assert json.loads(error_body(503, "busy"))["error"]["type"] == "Service Unavailable"
    # SGLang: flat, `type` the status for HTTP errors (serving_base's str(e.status_code))
    flat = json.loads(error_body(503, "The request queue is full.", flat=True))
    assert flat == {
        "object": "error",
        "message": "The request queue is full.",
        "type": "503",
        "param": None,
        "code": 503,
    }
    assert json.loads(error_body(400, "bad", flat=True))["type"] == "BadRequest"


def events(text: str) -> list[str]:
    assert text.endswith("\n\n")
    parts = text[:-2].split("\n\n")
    assert all(p.startswith("data: ") for p in parts)
    return [p[len("data: ") :] for p in parts]


def test_stream_format_chat() -> None:
    job = chat(max_tokens=3, stream=True, stream_options={"include_usage": True})
    fmt = StreamFormat(job, "abc", 1700000000)
    role, first = (json.loads(e) for e in events(fmt.role() + fmt.tokens(0, 1)))
    assert role["choices"][0]["delta"]["role"] == "assistant"
    assert role["choices"][0]["delta"]["content"] == ""
    assert first["object"] == "chat.completion.chunk" and first["id"] == "abc"
    assert first["created"] == 1700000000 and first["model"] == "sim-model"
    assert first["choices"][0]["delta"]["content"] == filler(0, 1)
    assert json.loads(events(fmt.tokens(1, 2))[0])["choices"][0]["delta"]["content"] == filler(1, 2)
    *tail, done = events(fmt.end(3))
    finish, usage = (json.loads(e) for e in tail)
    assert done == "[DONE]"
    assert finish["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []
    counts = {"prompt_tokens": 3, "total_tokens": 6, "completion_tokens": 3}
    assert usage["usage"] == {**counts, "prompt_tokens_details": None, "reasoning_tokens": 0}


def test_stream_format_completions_without_usage() -> None:
    job = parse_job("completions", b'{"prompt": "a", "max_tokens": 2, "stream": true}', LIMITS)
    fmt = StreamFormat(job, "abc", 1)
    chunk = json.loads(events(fmt.tokens(0, 2))[0])
    assert chunk["object"] == "text_completion"
    assert chunk["choices"][0]["text"] == filler(0, 2)
    *tail, done = events(fmt.end(2))
    assert done == "[DONE]" and len(tail) == 1
    assert json.loads(tail[0])["choices"][0]["finish_reason"] == "length"


def test_full_response() -> None:
    body = json.loads(full_response(chat(max_tokens=9), "id1", 5, 9))
    assert body["object"] == "chat.completion"
    message = {"role": "assistant", "content": filler(0, 9)}
    assert body["choices"][0]["message"] == {
        **message,
        "reasoning_content": None,
        "tool_calls": None,
    }
    assert body["usage"]["completion_tokens"] == 9 and body["usage"]["total_tokens"] == 12


def test_fault_specs() -> None:
    assert parse_fault(None) is NO_FAULT and parse_fault(" none ") is NO_FAULT
    assert parse_fault("status=503").status == 503
    assert parse_fault("hang_before_headers").hang_before_headers == math.inf
    assert parse_fault("hang_before_headers=0.5").hang_before_headers == 0.5
    assert parse_fault("hang_after=10").hang_after == 10
    assert parse_fault("hold_after=0").hold_after == 0
    fault = parse_fault("reset_after=3, p=0.25")
    assert (fault.reset_after, fault.probability) == (3, 0.25)
    assert parse_fault("close").close
    bad_specs = ("status", "status=200", "hang_after=-1", "hang_after", "close=1", "p=2")
    for bad in (*bad_specs, "hold_after", "explode", "status=500,close", "p=0.5"):
        with pytest.raises(FaultSpecError):
            parse_fault(bad)
