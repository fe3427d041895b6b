"""Watching bodies for usage; dropping the usage event the router asked for."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from router.upstream.stream import BodyTap, SseTap, first_event_refusal


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


@pytest.mark.parametrize(
    "prompt, completion, counted",
    [
        (7, 9, (7, 9)),
        (-3, 9, (0, 9)),  # a negative count is no count
        (10**400, 9, (0, 9)),  # nor one no float holds (it broke the TPOT division)
        (2**53, True, (2**53, 0)),  # a bool is not a count
        ("7", 9.0, (0, 0)),
    ],
)
def test_usage_counts_are_ints_an_engine_could_mean(
    prompt: object, completion: object, counted: tuple[int, int]
) -> None:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    event = b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
    tap = SseTap(strip_usage=False)
    feed_all(tap, [CHUNK, event, DONE])
    assert tap.usage is not None
    assert (tap.usage.prompt_tokens, tap.usage.completion_tokens) == counted


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


# llama.cpp's chat stream (llama-server 0c1e570), abridged: a role-only first event, one token per
# event; asked for usage, the usage event carries the request's timings, else the finish event.
_HEAD = b'"created":1796295233,"id":"chatcmpl-Ys","model":"t.gguf","system_fingerprint":"b1"'
_OBJECT = b',"object":"chat.completion.chunk"'
_TIMINGS = (
    b'"timings":{"cache_n":0,"prompt_n":20,"prompt_ms":37.507,"prompt_per_second'
    b'":26.66168981790066,"predicted_n":3,"draft_n":1,"draft_n_accepted":1}'
)
LLAMA_ROLE = (
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant",'
    b'"content":null}}],' + _HEAD + _OBJECT + b"}\n\n"
)
LLAMA_TOKENS = [
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"'
    + t
    + b'"}}],'
    + _HEAD
    + _OBJECT
    + b"}\n\n"
    for t in (b"V", b"ar", b" U")
]
_FINISH = b'data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],' + _HEAD + _OBJECT
LLAMA_USAGE = (
    b'data: {"choices":[],'
    + _HEAD
    + _OBJECT
    + b',"usage":{"completion_tokens":3,"prompt_tokens":20,"total_tokens":23,'
    b'"prompt_tokens_details":{"cached_tokens":0}},' + _TIMINGS + b"}\n\n"
)
ASKED = LLAMA_ROLE + b"".join(LLAMA_TOKENS) + _FINISH + b"}\n\n" + LLAMA_USAGE + DONE
NOT_ASKED = LLAMA_ROLE + b"".join(LLAMA_TOKENS) + _FINISH + b"," + _TIMINGS + b"}\n\n" + DONE


def test_llamacpp_stripped_stream_is_what_it_sends_unasked_at_any_split() -> None:
    assert json.loads(NOT_ASKED.split(b"\n\n")[-3][6:])["timings"]["predicted_n"] == 3
    for size in (1, 2, 5, 17, 100, 333, len(ASKED)):
        tap = SseTap(strip_usage=True)
        parts = [ASKED[i : i + size] for i in range(0, len(ASKED), size)]
        assert feed_all(tap, parts) == NOT_ASKED, size
        assert tap.usage is not None and tap.usage.completion_tokens == 3


def test_llamacpp_stream_asked_for_usage_passes_unchanged() -> None:
    tap = SseTap(strip_usage=False)
    assert feed_all(tap, [ASKED[i : i + 40] for i in range(0, len(ASKED), 40)]) == ASKED
    assert tap.usage is not None and tap.usage.prompt_tokens == 20


def test_finish_event_is_held_only_until_the_next_event() -> None:
    tap = SseTap(strip_usage=True)
    assert tap.feed(LLAMA_TOKENS[0]) == LLAMA_TOKENS[0]  # tokens are never held
    finish = _FINISH + b"}\n\n"
    assert tap.feed(finish) == b""  # a usage event may follow
    assert tap.feed(DONE) == finish + DONE  # none did: the finish event goes on unchanged
    tap = SseTap(strip_usage=True)
    assert tap.feed(finish) == b""
    assert tap.flush() == finish  # the stream ended after it


def test_a_finish_event_with_usage_is_not_held() -> None:
    # llama.cpp's /v1/completions (and SGLang's, vLLM's with continuous usage) put the usage on
    # the finish event itself: nothing follows to wait for, and nothing is removed.
    finish = event({"choices": [{"text": "", "finish_reason": "length"}], "usage": {"x": 1}})
    tap = SseTap(strip_usage=True)
    assert tap.feed(finish) == finish


def test_usage_and_finish_are_found_in_each_spelling_and_null_is_not_one() -> None:
    """What the tap looks for in every chunk: a usage object and a finish reason, written with
    or without a space after the colon (pydantic's compact JSON, or Python's default), in any
    choice; ``null`` for either is nothing, in every chunk SGLang sends."""
    spaced = json.dumps(
        {"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 1}}
    ).encode()
    assert b'"usage": {' in spaced and b'"finish_reason": "stop"' in spaced
    tap = SseTap(strip_usage=True)
    assert tap.feed(b"data: " + spaced + b"\n\n") == b"data: " + spaced + b"\n\n"
    assert tap.usage is not None and tap.usage.prompt_tokens == 1

    def both(choices: list[object], usage: object) -> bytes:
        return event({"choices": choices, "usage": usage})

    null_everywhere = both([{"delta": {"content": "a"}, "finish_reason": None}], None)
    tap = SseTap(strip_usage=True)
    assert tap.feed(null_everywhere) == null_everywhere  # passed on at once, nothing held
    assert tap.usage is None
    # SGLang's last content event and its usage event in one read: the key's first occurrence
    # is a null, the usage object further on (the fast path starts from the first find)
    usage_event = both([], {"prompt_tokens": 3, "completion_tokens": 2})
    tap = SseTap(strip_usage=True)
    assert tap.feed(null_everywhere + usage_event) == null_everywhere
    assert tap.usage is not None and tap.usage.prompt_tokens == 3
    # the second of two choices finishes: the event is held, as a usage event may follow
    second = both(
        [{"delta": {}, "finish_reason": None}, {"delta": {}, "finish_reason": "length"}], None
    )
    tap = SseTap(strip_usage=True)
    assert tap.feed(second) == b""
    assert tap.feed(DONE) == second + DONE
    # a member named like the key, inside a string, is not a usage object
    quoted = both([{"delta": {"content": 'say "usage": null'}, "finish_reason": None}], None)
    tap = SseTap(strip_usage=True)
    assert tap.feed(quoted) == quoted and tap.usage is None


def test_compact_chunks_take_the_short_way_and_still_see_everything() -> None:
    """Compact JSON (what vLLM and SGLang send): a member that occurs once with a null value is
    passed on at once; one that occurs twice in a read, or opens what the tap looks for, is
    found whichever of the two occurrences it is."""
    plain = b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}],"usage":null}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1}}\n\n'
    finish = plain.replace(b'"finish_reason":null', b'"finish_reason":"stop"')
    tap = SseTap(strip_usage=True)
    assert tap.feed(plain) == plain and tap.usage is None
    assert tap.feed(usage + plain) == plain  # the usage object first, a null after it
    assert tap.usage is not None and tap.usage.prompt_tokens == 4
    tap = SseTap(strip_usage=True)
    assert tap.feed(plain + finish) == plain  # the finish second: held for a usage event
    assert tap.feed(usage) == b"" and tap.usage is not None  # stripped; the finish still held
    assert tap.feed(DONE) == finish + DONE
    tap = SseTap(strip_usage=True)
    assert tap.feed(finish + plain) == finish + plain  # the finish first, a null after it
    spaced = b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}\n\n'
    tap = SseTap(strip_usage=True)
    assert tap.feed(spaced) == b"" and tap.feed(DONE) == spaced + DONE  # a spaced finish, held
    vllm = b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]}\n\n'
    ends_with_key = b'data: {"usage":\n\n'  # (not JSON: the tap looks one byte past the key)
    tap = SseTap(strip_usage=False)
    assert tap.feed(vllm) == vllm and tap.feed(ends_with_key) == ends_with_key


_EVENTS = [
    b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}],"usage":null}\n\n',
    b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]}\n\n',
    b'data: {"choices":[{"delta":{},"finish_reason":"stop"}],"usage":null}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1}}\n\n',
    event({"choices": [{"delta": {"content": "b"}, "finish_reason": None}]}).replace(b":", b": "),
    b'data: {"choices": [{"delta": {}, "finish_reason": "length"}], "usage": {"x": 1}}\n\n',
    b'data: {"choices":[{"delta":{"content":"\\"usage\\":{"},"finish_reason":null}]}\n\n',
    b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}]}\n\n',
    b'data: {"choices":[],"usage": {"prompt_tokens":2,"completion_tokens":3}}\n\n',
    DONE,
]


@example(picks=[7], cuts=[], strip=True)  # a spaced finish alone in its read
@example(picks=[0, 3, 0], cuts=[], strip=True)  # a usage object between two nulls
@given(
    picks=st.lists(st.integers(0, len(_EVENTS) - 1), max_size=8),
    cuts=st.lists(st.integers(0, 2000), max_size=6),
    strip=st.booleans(),
)
def test_the_short_way_answers_as_the_whole_way(
    picks: list[int], cuts: list[int], strip: bool
) -> None:
    """Whatever the events and however the reads split them, the tap's per-chunk short cut
    changes nothing: the same bytes and usage as a tap that takes the whole way every time (a
    rename that changes nothing turns the short cut off)."""
    body = b"".join(_EVENTS[i] for i in picks)
    points = sorted({min(c, len(body)) for c in cuts})
    parts = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    fast, whole = SseTap(strip_usage=strip), SseTap(strip_usage=strip, rename=(b"\0", b"\0"))
    assert feed_all(fast, parts) == feed_all(whole, parts)
    assert fast.usage == whole.usage


@given(
    picks=st.lists(st.integers(0, len(_EVENTS) - 1), max_size=6),
    cuts=st.lists(st.integers(0, 2000), max_size=4),
    strip=st.booleans(),
    pad=st.integers(0, 8),
)
def test_plain_says_yes_only_where_feed_would_pass_the_bytes_unchanged(
    picks: list[int], cuts: list[int], strip: bool, pad: int
) -> None:
    """``SseTap.plain`` (a whole upstream chunk passed on as it came, for
    ``chunk_whole``): wherever it says yes, ``feed`` of the same bytes gives them back
    unchanged and notes nothing; a tap that was told yes and skipped them ends as one that fed
    them. Read by read, over any split of any events, in the middle of other bytes."""
    body = b"".join(_EVENTS[i] for i in picks)
    points = sorted({min(c, len(body)) for c in cuts})
    parts = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    skipping, feeding = SseTap(strip_usage=strip), SseTap(strip_usage=strip)
    out_skipping, out_feeding = [], []
    for part in parts:
        framed = b"x" * pad + part + b"\r\n"  # (the payload inside other bytes)
        if part and skipping.plain(framed, pad, pad + len(part)):
            before = feeding.usage
            got = feeding.feed(part)
            assert got == part and feeding.usage is before
            out_skipping.append(part)
            out_feeding.append(got)
            continue
        out_skipping.append(skipping.feed(part))
        out_feeding.append(feeding.feed(part))
    out_skipping.append(skipping.flush())
    out_feeding.append(feeding.flush())
    assert out_skipping == out_feeding
    assert skipping.usage == feeding.usage
    assert b"".join(out_skipping) == b"".join(out_feeding)


def test_plain_refuses_what_the_tap_must_see() -> None:
    plain = b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]}\n\n'
    finish = plain.replace(b'"finish_reason":null', b'"finish_reason":"stop"')
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1}}\n\n'
    tap = SseTap(strip_usage=True)
    assert tap.plain(plain, 0, len(plain))
    assert not tap.plain(finish, 0, len(finish))  # held for a usage event when stripping
    assert SseTap(strip_usage=False).plain(finish, 0, len(finish))
    assert not tap.plain(usage, 0, len(usage))  # usage: counted
    assert not tap.plain(plain[:-1], 0, len(plain) - 1)  # not whole events
    assert not SseTap(strip_usage=False, rename=(b"a", b"b")).plain(plain, 0, len(plain))
    tap.feed(plain[:10])  # an event begun: the next bytes are not whole events alone
    assert not tap.plain(plain, 0, len(plain))
