"""The live page's feed in a running router: snapshots once an interval, every connection
released when its client leaves (under both of uvicorn's HTTP implementations), and an open
page does not hold up a graceful shutdown."""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from router.calibrate.loadgen import run_closed_loop
from tests.conftest import RouterFactory
from tests.support.http import router_status, wait_for

pytestmark = pytest.mark.anyio


def feeds(url: str) -> int:
    n: int = router_status(url)["ui"]["feed_connections"]
    return n


def read_events(lines: Iterator[str], count: int) -> list[dict[str, Any]]:
    """The next ``count`` events. (``lines`` stays open: httpx closes a response whose line
    iterator is closed, which a ``for`` over a fresh ``iter_lines()`` does when it breaks.)"""
    events: list[dict[str, Any]] = []
    for line in lines:
        if line.startswith("data: "):
            events.append(json.loads(line[6:]))
            if len(events) == count:
                break
    return events


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_the_feed_sends_snapshots_and_lets_go_when_the_client_leaves(
    start_router: RouterFactory, http: str
) -> None:
    router = start_router(serve_args=("--http", http), ui_interval="0.2")
    assert feeds(router.url) == 0
    with (
        httpx.Client(timeout=10) as client,
        client.stream("GET", f"{router.url}/router/ui/events") as stream,
    ):
        assert stream.status_code == 200
        assert stream.headers["content-type"] == "text/event-stream; charset=utf-8"
        lines = stream.iter_lines()
        events = read_events(lines, 3)
        seqs = [e["seq"] for e in events]
        assert seqs == sorted(seqs) and len(set(seqs)) == 3
        assert {"policy", "crossover", "pools", "recent", "curves"} <= set(events[0])
        assert feeds(router.url) == 1
    wait_for(lambda: feeds(router.url) == 0)


def test_a_client_that_vanishes_mid_feed_is_released(start_router: RouterFactory) -> None:
    """A raw socket that reads one event and is closed without a word (a tab killed)."""
    router = start_router(ui_interval="0.2")
    host, port = router.url.removeprefix("http://").rsplit(":", 1)
    socks = []
    for _ in range(3):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(b"GET /router/ui/events HTTP/1.1\r\nhost: x\r\n\r\n")
        got = b""
        while b"data: " not in got:
            got += sock.recv(65536)
        socks.append(sock)
    assert feeds(router.url) == 3
    for sock in socks:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # a reset
    wait_for(lambda: feeds(router.url) == 0)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_an_open_page_does_not_hold_up_shutdown(start_router: RouterFactory, workers: str) -> None:
    router = start_router(serve_args=("--workers", workers))
    with (
        httpx.Client(timeout=10) as client,
        client.stream("GET", f"{router.url}/router/ui/events") as stream,
    ):
        lines = stream.iter_lines()
        read_events(lines, 1)
        if workers == "1":  # (under --workers the status comes from any worker: its own feeds)
            assert feeds(router.url) == 1
        # SIGTERM: without the feed ending at once, uvicorn would wait the 30 s of graceful
        # shutdown for it (stop() kills after 10 s: SIGKILL, -9)
        code = router.stop(timeout=10)
        assert code in (0, -signal.SIGTERM)
        assert list(lines)[-1:] in ([], [""])  # the feed ended as a complete response


async def test_the_recent_window_counts_what_the_router_served(
    start_router: RouterFactory,
) -> None:
    router = start_router()
    results = await run_closed_loop(
        f"{router.url}/v1", concurrency=4, prompt_tokens=8, output_tokens=12, requests=40
    )
    assert all(r.ok for r in results)
    served = {pool: sum(r.pool == pool for r in results) for pool in ("speculative", "baseline")}
    # (each request is counted as the router releases it, once its client has the last byte)
    wait_for(lambda: router_status(router.url)["in_flight"]["total"] == 0)
    recent = router_status(router.url)["recent"]
    assert recent["requests"] == {pool: n for pool, n in served.items() if n}
    assert recent["share_speculative"] == round(served["speculative"] / 40, 3)
    streams = sum(recent["latency"][pool]["ttft_n"] for pool in served)
    assert streams == 40
    reasons = sum(sum(by.values()) for by in recent["reasons"].values())
    assert reasons == 40
