"""The load generator: pure statistics, and what it records against a sim."""

from __future__ import annotations

import asyncio
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
    run_closed_loop,
    summarize,
    window_stats,
)
from router.upstream.client import ErrorKind
from tests.support.processes import Proc


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


def test_against_a_sim(baseline: Proc) -> None:
    results = asyncio.run(
        run_closed_loop(
            baseline.url + "/v1",
            concurrency=3,
            prompt_tokens=7,
            output_tokens=9,
            requests=9,
            desync=False,
        )
    )
    assert len(results) == 9 and all(r.ok for r in results)
    assert all(r.output_tokens == 9 and r.prompt_tokens == 7 for r in results)
    assert all(
        sum(r.chunk_tokens) == 9 and r.headers["x-sim-preset"] == "baseline" for r in results
    )
    assert all(r.ttft is not None and r.ttft > 0 for r in results)
    failed = asyncio.run(
        run_closed_loop(
            baseline.url + "/v1",
            concurrency=2,
            prompt_tokens=1,
            output_tokens=4,
            requests=2,
            headers={"x-sim-fault": "status=429"},
            endpoint="completions",
        )
    )
    assert [(r.status, r.ok) for r in failed] == [(429, False)] * 2
    assert all(r.error and r.error.startswith("HTTP 429") for r in failed)


def test_duration_cancels_in_flight(baseline: Proc) -> None:
    results = asyncio.run(
        run_closed_loop(
            baseline.url + "/v1",
            concurrency=2,
            prompt_tokens=1,
            output_tokens=100_000,
            duration=0.3,
        )
    )
    assert len(results) == 2 and all(r.error == "cancelled" for r in results)
    assert all(len(r.chunk_times) > 5 for r in results)  # partial streams are kept


def test_output_jitter(baseline: Proc) -> None:
    results = asyncio.run(
        run_closed_loop(
            baseline.url + "/v1",
            concurrency=2,
            prompt_tokens=1,
            output_tokens=10,
            requests=12,
            output_jitter=0.5,
            seed=5,
            desync=False,
        )
    )
    lengths = [r.output_tokens for r in results]
    assert all(r.ok for r in results) and all(n is not None and 5 <= n <= 15 for n in lengths)
    assert len(set(lengths)) > 3
    assert [r.max_tokens for r in results] == lengths
    with pytest.raises(ValueError):
        asyncio.run(
            run_closed_loop(
                "http://x",
                concurrency=1,
                prompt_tokens=1,
                output_tokens=2,
                requests=1,
                output_jitter=1.0,
            )
        )


def test_a_keep_alive_connection_closed_under_a_request_is_retried_once() -> None:
    """As llama-server does: it closes a keep-alive connection after its second streamed
    response, without a ``Connection: close``; a request sent on it never reaches it."""
    stream = (
        b'data: {"choices":[{"delta":{"content":"a b"}}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\n'
        b"data: [DONE]\n\n"
    )
    response = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    response += b"Content-Length: %d\r\n\r\n%s" % (len(stream), stream)
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        served = 0
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:  # the client closed it
                writer.close()
                return
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            if served == 2:  # the third request on this connection: closed unanswered
                writer.close()
                return
            writer.write(response)
            await writer.drain()
            served += 1

    async def go() -> list[RequestResult]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await run_closed_loop(
                f"http://127.0.0.1:{port}/v1",
                concurrency=1,
                prompt_tokens=1,
                output_tokens=2,
                requests=5,
                desync=False,
            )
        finally:
            server.close()
            for writer in writers:
                writer.close()
                await writer.wait_closed()

    results = asyncio.run(go())
    assert [r.ok for r in results] == [True] * 5
    assert [r.stale_retries for r in results] == [0, 0, 1, 0, 1]
    assert len(writers) == 3 and all(r.output_tokens == 2 for r in results)


def test_every_failure_of_the_fast_client_has_httpx_s_name_for_it() -> None:
    # reports and calibrate's refusals name a failure the same whichever client ran; a new
    # kind of UpstreamError without a name would fail the request's record with a KeyError
    assert set(typing.get_args(ErrorKind)) == set(UPSTREAM_ERROR_NAMES)
