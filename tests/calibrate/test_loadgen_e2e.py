"""The load generator against a sim: what it records, cancelling at the end of a run, and a
keep-alive connection closed under a request."""

from __future__ import annotations

import asyncio

import pytest

from router.calibrate.loadgen import (
    RequestResult,
    run_closed_loop,
)
from tests.support.processes import Proc


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
