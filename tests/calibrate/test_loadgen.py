"""The load generator's pure statistics and its fast client's error names (against a sim:
test_loadgen_e2e.py)."""

from __future__ import annotations

import math
import typing

import pytest

from router.calibrate.loadgen import (
    UPSTREAM_ERROR_NAMES,
    RequestResult,
    Workload,
    bursts,
    decode_tps,
    estimate_tokens,
    percentile,
    summarize,
    window_stats,
)
from router.upstream.client import ErrorKind


def result(
    times: list[float], tokens: list[int], start: float = 0.0, **kw: object
) -> RequestResult:
    r = RequestResult(worker=0, seq=0, start=start, max_tokens=sum(tokens))
    r.status, r.chunk_times, r.chunk_tokens = 200, times, tokens
    r.output_tokens = sum(tokens)
    for key, value in kw.items():
        setattr(r, key, value)
    return r


def test_percentile() -> None:
    assert percentile([3, 1, 2], 50) == 2
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4], 100) == 4 and percentile([1, 2, 3, 4], 0) == 1
    assert percentile([5], 99) == 5
    assert math.isnan(percentile([], 50))


def test_decode_tps_leaves_out_the_first_token() -> None:
    r = result([1.0, 1.5, 2.0, 3.0], [1, 3, 3, 3], start=0.2)
    assert r.ttft == pytest.approx(0.8)
    assert decode_tps(r) == pytest.approx(9 / 2.0)
    assert decode_tps(result([1.0], [1])) is None
    assert decode_tps(result([1.0, 2.0], [1, 1], error="cancelled")) is None


def test_window_stats() -> None:
    a = result([0.5, 1.0, 2.0, 3.0, 4.0], [1, 2, 2, 2, 2])
    b = result([2.5, 3.5, 4.5], [1, 4, 4])
    w = window_stats([a, b], 1.0, 4.0)
    # In [1, 4): a's chunks at 1, 2, 3 (6 tokens), b's at 2.5, 3.5 (5 tokens).
    assert w.tokens == 11 and w.total_tps == pytest.approx(11 / 3)
    # Decode: a gains 4 tokens over 2 s, b 4 over 1 s (its first token is no decode token).
    assert w.per_request_tps == pytest.approx(8 / 3)
    assert w.mean_request_tps == pytest.approx((2 + 4) / 2)
    assert w.requests == 2


def test_a_burst_of_events_is_one_step_not_a_rate() -> None:
    # llama.cpp sends a speculative step's 4 tokens as 4 events at once: 1 token after the
    # prompt, then steps of 4 every 50 ms.
    times = [1.0, 1.05, 1.05, 1.0501, 1.0502, 1.1, 1.1, 1.1, 1.1003]
    tokens = [1] * 9
    assert bursts(times, tokens) == [(1.0, 1), (1.05, 4), (1.1, 4)]
    r = result(times, tokens)
    w = window_stats([r], 1.04, 2.0)
    # 4 tokens in 50 ms between the two bursts in the window, not 7 over the 50.3 ms from the
    # window's first event to its last, nor ~10,000 tok/s inside a burst
    assert w.mean_request_tps == pytest.approx(80.0) and w.per_request_tps == pytest.approx(80)
    assert w.tokens == 8 and w.requests == 1
    # a request whose window holds only one burst gives no rate at all
    only = window_stats([r], 1.09, 2.0)
    assert only.requests == 0 and math.isnan(only.mean_request_tps)
    # nor does a request whose every token came at once
    assert decode_tps(result([1.0, 1.0, 1.0002], [1, 1, 1])) is None


def test_tokens_are_counted_from_usage() -> None:
    # a real tokenizer: "\n" and "," are tokens, and "hello" may be two
    r = result([1.0, 2.0, 3.0, 4.0], [estimate_tokens(t) for t in ("hel", "lo", "\n", ",")])
    r.output_tokens = 8
    assert r.token_counts() == [2.0, 2.0, 2.0, 2.0]
    assert window_stats([r], 0.0, 5.0).tokens == 8
    assert estimate_tokens(" ") == 1 and estimate_tokens("two words") == 2


def test_prompts_differ_across_runs_and_can_ignore_eos() -> None:
    a, b = Workload(4, 8), Workload(4, 8, ignore_eos=True)
    first = a.body(0, 0, 8)["messages"][0]["content"]
    assert first != b.body(0, 0, 8)["messages"][0]["content"]  # another run, another nonce
    assert first.split()[0] != a.body(0, 1, 8)["messages"][0]["content"].split()[0]
    assert first.split()[1:] == ["hello"] * 3
    assert "ignore_eos" not in a.body(0, 0, 8) and b.body(0, 0, 8)["ignore_eos"] is True


def test_summary_counts_pools_and_errors() -> None:
    rs = [
        result([1.0, 2.0], [1, 1], headers={"x-spec-router-pool": "eagle3"}),
        result([1.0, 3.0], [1, 1], headers={"x-spec-router-pool": "baseline"}),
        result([], [], status=503, error="HTTP 503: busy"),
    ]
    s = summarize(rs)
    assert (s.requests, s.ok, s.output_tokens) == (3, 2, 4)
    assert s.pools == {"eagle3": 1, "baseline": 1} and s.errors == {"HTTP 503": 1}
    assert s.decode_tps_p50 == pytest.approx(0.75)


def test_every_failure_of_the_fast_client_has_httpx_s_name_for_it() -> None:
    # reports and calibrate's refusals name a failure the same whichever client ran; a new
    # kind of UpstreamError without a name would fail the request's record with a KeyError
    assert set(typing.get_args(ErrorKind)) == set(UPSTREAM_ERROR_NAMES)
