"""Watching bodies for usage; dropping the usage event the router asked for."""

from __future__ import annotations

import json

from router.forward.stream import BodyTap, SseTap, first_event_refusal


def event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


CHUNK = event({"choices": [{"delta": {"content": "hi"}}], "usage": None})
USAGE = event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9}})
DONE = b"data: [DONE]\n\n"


def feed_all(tap: SseTap, parts: list[bytes]) -> bytes:
    return b"".join(tap.feed(p) for p in parts) + tap.flush()


def test_passthrough_is_identical_and_reads_usage() -> None:
    tap = SseTap(strip_usage=False)
    body = CHUNK * 3 + USAGE + DONE
    assert feed_all(tap, [CHUNK, CHUNK, CHUNK, USAGE, DONE]) == body
    assert tap.usage is not None and (tap.usage.prompt_tokens, tap.usage.completion_tokens) == (
        5,
        9,
    )


def test_strip_removes_only_the_usage_event_at_any_split() -> None:
    body = CHUNK * 2 + USAGE + DONE
    expected = CHUNK * 2 + DONE
    for size in (1, 3, 7, 50, len(body)):
        tap = SseTap(strip_usage=True)
        parts = [body[i : i + size] for i in range(0, len(body), size)]
        assert feed_all(tap, parts) == expected, size
        assert tap.usage is not None and tap.usage.completion_tokens == 9


def test_rename_maps_the_model_back() -> None:
    tap = SseTap(strip_usage=False, rename=(b'"model":"m-eagle"', b'"model":"m"'))
    chunk = event({"model": "m-eagle", "choices": []})
    out = feed_all(tap, [chunk[:10], chunk[10:]])
    assert out == event({"model": "m", "choices": []})


def test_not_sse_at_all_is_given_up_on_not_held() -> None:
    tap = SseTap(strip_usage=True)
    blob = b"x" * (2 << 20)
    assert tap.feed(blob) == blob
    assert tap.feed(b"more") == b"more"


def test_body_tap_reads_usage_of_a_json_body() -> None:
    tap = BodyTap()
    body = json.dumps(
        {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}}
    ).encode()
    tap.feed(body[:5])
    tap.feed(body[5:])
    assert tap.usage is not None and tap.usage.completion_tokens == 3
    limited = BodyTap(limit=3)
    limited.feed(body)
    assert limited.usage is None


def test_first_event_refusal() -> None:
    sglang = (
        b'data: {"error": {"object": "error", "message": "The request queue is full.", '
        b'"type": "SERVICE_UNAVAILABLE", "param": null, "code": 503}}\n\ndata: [DONE]\n\n'
    )
    assert first_event_refusal(sglang) == (503, "The request queue is full.")
    assert first_event_refusal(b'data: {"error":{"message":"x","code":429}}\n\n') == (429, "x")
    # one request's error, or an ordinary first chunk: not a refusal
    assert first_event_refusal(b'data: {"error": {"message": "bad", "code": 400}}\n\n') is None
    assert first_event_refusal(b'data: {"id":"1","choices":[]}\n\n') is None
    assert first_event_refusal(b'data: {"error": not json}\n\n') is None
