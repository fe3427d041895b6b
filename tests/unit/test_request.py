"""What the proxy reads from requests, and the headers it forwards."""

from __future__ import annotations

import json

import pytest

from router.errors import BadRequest
from router.forward.request import forward_headers, inspect, response_headers, upstream_body


def test_inspect_reads_routing_fields() -> None:
    body = json.dumps(
        {
            "model": "m",
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_completion_tokens": 64,
            "temperature": 0.7,
            "messages": [],
        }
    ).encode()
    info = inspect("/v1/chat/completions", body, b"application/json")
    assert (info.model, info.stream, info.add_usage, info.max_tokens, info.temperature) == (
        "m",
        True,
        False,
        64,
        0.7,
    )


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"", "invalid_json"),
        (b"{not json", "invalid_json"),
        (b"[1, 2]", "invalid_json"),
        (b'{"model": 3}', "invalid_model"),
        (b"\xff\xfe", "invalid_json"),
    ],
)
def test_inspect_rejects_unusable_bodies(body: bytes, code: str) -> None:
    with pytest.raises(BadRequest) as err:
        inspect("/v1/chat/completions", body, b"application/json")
    assert err.value.code == code and err.value.status == 400


def test_model_paths_are_json_whatever_the_content_type() -> None:
    with pytest.raises(BadRequest):
        inspect("/v1/completions", b"{bad", b"application/x-www-form-urlencoded")


def test_other_paths_pass_non_json_bodies_untouched() -> None:
    info = inspect("/v1/audio/transcriptions", b"--boundary...", b"multipart/form-data; boundary=x")
    assert info.parsed is None


def test_upstream_body_unchanged_unless_needed() -> None:
    raw = b'{"model":"m","stream":true}'
    info = inspect("/v1/completions", raw, None)
    assert upstream_body(info, raw, {}, ask_usage=False) is raw
    renamed = json.loads(upstream_body(info, raw, {"m": "m-eagle"}, ask_usage=False))
    assert renamed["model"] == "m-eagle"
    asked = json.loads(upstream_body(info, raw, {}, ask_usage=True))
    assert asked["stream_options"] == {"include_usage": True}
    # a client that asked already: nothing to change
    raw2 = b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}'
    info2 = inspect("/v1/completions", raw2, None)
    assert upstream_body(info2, raw2, {}, ask_usage=True) is raw2


def test_forward_headers_strip_hop_by_hop_and_append_forwarded_for() -> None:
    raw = [
        (b"host", b"router"),
        (b"connection", b"keep-alive"),
        (b"content-length", b"10"),
        (b"transfer-encoding", b"chunked"),
        (b"x-forwarded-for", b"10.0.0.1"),
        (b"authorization", b"Bearer client"),
        (b"x-request-id", b"abc"),
    ]
    out = forward_headers(raw, "127.0.0.1", None, drop_authorization=False)
    assert out == [
        (b"authorization", b"Bearer client"),
        (b"x-request-id", b"abc"),
        (b"x-forwarded-for", b"10.0.0.1, 127.0.0.1"),
    ]
    replaced = forward_headers(raw, None, b"Bearer pool", drop_authorization=True)
    assert (b"authorization", b"Bearer pool") in replaced
    assert (b"authorization", b"Bearer client") not in replaced
    dropped = forward_headers(raw, None, None, drop_authorization=True)
    assert not any(k == b"authorization" for k, _ in dropped)


def test_response_headers() -> None:
    raw = [(b"content-length", b"5"), (b"transfer-encoding", b"chunked"), (b"x-a", b"1")]
    assert response_headers(raw, keep_length=True) == [(b"content-length", b"5"), (b"x-a", b"1")]
    assert response_headers(raw, keep_length=False) == [(b"x-a", b"1")]


def test_usage_request_is_spliced_into_the_bytes_and_stays_valid_json() -> None:
    raw = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi}"}]}  \n'
    info = inspect("/v1/chat/completions", raw, b"application/json")
    out = upstream_body(info, raw, {}, ask_usage=True)
    assert json.loads(out) == {**json.loads(raw), "stream_options": {"include_usage": True}}
    # a client that declined usage: asked for all the same (and stripped again)
    raw2 = b'{"model":"m","stream":true,"stream_options":{"include_usage":false}}'
    out2 = upstream_body(inspect("/v1/completions", raw2, None), raw2, {}, ask_usage=True)
    assert json.loads(out2)["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    "options",
    [
        {},  # vLLM 0.11: include_usage defaults to true; vLLM 0.34 and SGLang: false
        {"continuous_usage_stats": True},
        {"include_usage": True, "continuous_usage_stats": True},
        {"include_usage": True},
        {"x": 1},
    ],
)
def test_stream_options_the_client_set_are_left_alone(options: dict[str, object]) -> None:
    raw = json.dumps({"model": "m", "stream": True, "stream_options": options}).encode()
    info = inspect("/v1/completions", raw, None)
    assert not info.add_usage
    assert upstream_body(info, raw, {}, ask_usage=True) is raw


def test_a_request_without_a_model_gets_the_pools() -> None:
    for raw in (b'{"messages": []}', b'{"model": "", "messages": []}', b'{"model": null}'):
        info = inspect("/v1/chat/completions", raw, None)
        assert info.model is None and info.fill_model
        out = json.loads(upstream_body(info, raw, {}, ask_usage=False, default_model="llama"))
        assert out["model"] == "llama"
        # without a name for the pool, the body goes as it is (both engines serve it)
        assert upstream_body(info, raw, {}, ask_usage=False) is raw
    named = inspect("/v1/chat/completions", b'{"model": "m"}', None)
    assert not named.fill_model
    assert not inspect("/v1/other", b'{"x": 1}', None).fill_model
