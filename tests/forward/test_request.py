"""What the proxy reads from requests, and the headers it forwards."""

from __future__ import annotations

import json

import pytest

from router.errors import BadRequest, NotFound
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


def test_a_body_after_a_utf8_bom_is_read_and_a_broken_one_reported_as_before() -> None:
    body = json.dumps({"model": "m", "stream": True}).encode()
    info = inspect("/v1/chat/completions", b"\xef\xbb\xbf" + body, b"application/json")
    assert info.model == "m" and info.stream
    # the 400's message counts positions after the BOM, as "utf-8-sig" always did
    with pytest.raises(BadRequest, match="position 11:"):
        inspect("/v1/chat/completions", b'\xef\xbb\xbf{"model": "\xff"}', b"application/json")


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
    out = forward_headers(raw, "127.0.0.1", None, drop_authorization=False, trust_forwarded=True)
    assert out == [
        (b"authorization", b"Bearer client"),
        (b"x-request-id", b"abc"),
        (b"x-forwarded-for", b"10.0.0.1, 127.0.0.1"),
    ]
    # checklist case 12: an untrusted client's X-Forwarded-For is replaced by its address
    untrusted = forward_headers(raw, "127.0.0.1", None, drop_authorization=False)
    assert (b"x-forwarded-for", b"127.0.0.1") == untrusted[-1]
    assert sum(1 for k, _ in untrusted if k == b"x-forwarded-for") == 1
    replaced = forward_headers(raw, None, b"Bearer pool", drop_authorization=True)
    assert (b"authorization", b"Bearer pool") in replaced
    assert (b"authorization", b"Bearer client") not in replaced
    dropped = forward_headers(raw, None, None, drop_authorization=True)
    assert not any(k == b"authorization" for k, _ in dropped)


def test_headers_named_in_connection_are_hop_by_hop_and_te_trailers_is_kept() -> None:
    """Checklist case 11 (Go's TestReverseProxyStripHeadersPresentInConnection)."""
    raw = [
        (b"connection", b"Upgrade, X-Secret"),
        (b"connection", b"x-other"),
        (b"x-secret", b"1"),
        (b"x-other", b"2"),
        (b"upgrade", b"websocket"),
        (b"te", b"trailers, deflate"),
        (b"proxy-authorization", b"Basic abc"),
        (b"keep-alive", b"timeout=5"),
        (b"x-kept", b"3"),
    ]
    out = forward_headers(raw, None, None, drop_authorization=False)
    assert out == [(b"x-kept", b"3"), (b"te", b"trailers")]
    response = [(b"connection", b"x-secret"), (b"x-secret", b"1"), (b"x-kept", b"3")]
    assert response_headers(response, keep_length=True) == [(b"x-kept", b"3")]


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


def test_deeply_nested_json_is_a_bad_request_not_a_crash() -> None:
    """Checklist case 6: 100,000 nested arrays make the C decoder recurse past the limit."""
    for body in (b"[" * 100_000 + b"]" * 100_000, b'{"model":"m","x":' + b"[" * 100_000 + b"}"):
        with pytest.raises(BadRequest) as caught:
            inspect("/v1/chat/completions", body, b"application/json")
        assert caught.value.code == "invalid_json" and "nested" in caught.value.message


def test_a_temperature_too_large_for_a_float_is_infinite() -> None:
    body = b'{"model":"m","temperature":1' + b"0" * 400 + b"}"
    info = inspect("/v1/chat/completions", body, None)
    assert info.temperature == float("inf") and info.sampling


def test_a_lone_surrogate_survives_re_encoding_escaped() -> None:
    # (re-encoded for the pool's model name; a stream without options also gets usage asked)
    body = b'{"model":"m","stream":true,"messages":"\\ud800"}'
    info = inspect("/v1/chat/completions", body, None)
    out = upstream_body(info, body, {"m": "m-pool"}, ask_usage=True)
    assert json.loads(out)["messages"] == "\ud800"
    assert json.loads(out)["model"] == "m-pool"
    assert json.loads(out)["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/v1/../sim/config", 400),
        ("/v1/./chat/completions", 400),
        ("/v1/models/..", 400),
        ("/v1\\..\\pause", 400),
        ("/v1/chat\x00/completions", 400),
        ("/v1/load_lora_adapter", 404),
        ("/v1/unload_lora_adapter", 404),
    ],
)
def test_paths_that_could_reach_elsewhere_are_refused(path: str, status: int) -> None:
    """Checklist case 14 (``path`` as uvicorn gives it: percent-decoded)."""
    from router.forward.request import check_path

    with pytest.raises(BadRequest if status == 400 else NotFound):
        check_path(path)


def test_ordinary_paths_pass() -> None:
    from router.forward.request import check_path

    for path in ("/v1/chat/completions", "/v1/files/file-1.jsonl", "/v1/models/a.b", "/v1/é"):
        check_path(path)
