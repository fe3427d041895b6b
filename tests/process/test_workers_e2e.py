"""``spec-router serve --workers 2``: two router processes on one socket, one in-flight count.

Real processes throughout: the sims, the supervisor and its workers; streams are opened one
connection each, so the kernel spreads them over both workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.decide import table as tables
from tests.conftest import RouterFactory, router_env
from tests.support.http import await_for, metric_value, router_status, wait_for
from tests.support.processes import Proc
from tests.support.raw_http import exchange
from tests.support.tables import model_table

pytestmark = pytest.mark.anyio

BODY = {
    "model": "sim",
    "messages": [{"role": "user", "content": "Tell me about speculative decoding."}],
    "max_tokens": 50_000,  # minutes at the sims' pace: the test ends them
    "stream": True,
}
WORKERS = ("--workers", "2")


def engine_running(sim: Proc) -> int:
    """What the sim's engine is running now (its /sim/config)."""
    running: int = httpx.get(f"{sim.url}/sim/config", timeout=5).json()["engine"]["running"]
    return running


def slots(url: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = router_status(url)["workers"]["slots"]
    return found


class Stream:
    """One long stream on its own connection, read to its end by a task of its own."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.pool = response.headers["x-spec-router-pool"]
        self.chunks = 0
        self.fate: str | None = None  # "ended" (a clean end) or "broken"
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            async for _ in self.response.aiter_raw():
                self.chunks += 1
            self.fate = "ended"
        except httpx.TransportError:  # RemoteProtocolError: incomplete chunked read
            self.fate = "broken"


async def open_streams(url: str, n: int, stack: contextlib.AsyncExitStack) -> list[Stream]:
    streams = []
    for _ in range(n):
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))
        response = await stack.enter_async_context(
            client.stream("POST", "/v1/chat/completions", json=BODY)
        )
        assert response.status_code == 200
        stream = Stream(response)
        stack.callback(stream.reader.cancel)  # (runs before its response is closed)
        streams.append(stream)
    return streams


async def flowing(streams: list[Stream]) -> bool:
    """Each stream gets new chunks (polled; True once every one has moved on)."""
    seen = [s.chunks for s in streams]

    async def moved() -> bool:
        return all(s.chunks > n and s.fate is None for s, n in zip(streams, seen, strict=True))

    return await await_for(moved)


async def test_two_workers_route_with_one_count_and_release_a_killed_workers_streams(
    start_router: RouterFactory, sims: dict[str, Proc]
) -> None:
    spec, base = sims["speculative"], sims["baseline"]
    router = start_router(policy="spillover", crossover="4", serve_args=WORKERS)
    async with contextlib.AsyncExitStack() as stack:
        # The kernel gives each connection to whichever worker accepts first: open again in
        # the (rare) case one worker took all eight.
        for _ in range(5):
            streams = await open_streams(router.url, 8, stack)
            shares = [s["in_flight"] for s in slots(router.url)]
            if all(shares):
                break
            await stack.aclose()
            wait_for(lambda: router_status(router.url)["in_flight"]["total"] == 0)
        assert sorted(shares) != [0, 8] and sum(shares) == 8
        # exactly the crossover on the speculative engine, though two workers placed them
        assert [s.pool for s in streams].count("speculative") == 4
        assert router_status(router.url)["in_flight"] == {
            "speculative": 4,
            "baseline": 4,
            "total": 8,
        }
        wait_for(lambda: (engine_running(spec), engine_running(base)) == (4, 4))

        victim = next(s for s in slots(router.url) if s["in_flight"])
        killed: int = victim["in_flight"]
        survivor = next(s for s in slots(router.url) if s["worker"] != victim["worker"])
        os.kill(victim["pid"], signal.SIGKILL)

        async def broken() -> bool:
            return sum(s.fate == "broken" for s in streams) == killed

        # the killed worker's streams break (no clean end); the other worker's keep flowing
        await await_for(broken)
        alive = [s for s in streams if s.fate is None]
        assert len(alive) == survivor["in_flight"]
        assert await flowing(alive)
        left = survivor["by_pool"]
        wait_for(
            lambda: (
                router_status(router.url)["in_flight"] == {**left, "total": survivor["in_flight"]}
            )
        )
        wait_for(
            lambda: (
                (engine_running(spec), engine_running(base))
                == (left["speculative"], left["baseline"])
            )
        )
        # the survivor still serves, and the supervisor put a new worker in the victim's slot
        assert await flowing(alive)
        wait_for(lambda: slots(router.url)[victim["worker"]]["pid"] not in (None, victim["pid"]))
        short = httpx.post(
            f"{router.url}/v1/chat/completions", json={**BODY, "stream": False, "max_tokens": 4}
        )
        assert short.status_code == 200
    wait_for(lambda: router_status(router.url)["in_flight"]["total"] == 0)
    wait_for(lambda: (engine_running(spec), engine_running(base)) == (0, 0))
    assert "killed by SIGKILL; released" in "\n".join(router.output)


async def test_metrics_count_every_workers_requests_once(start_router: RouterFactory) -> None:
    router = start_router(
        policy="spillover", crossover="4", request_timeout="1", serve_args=WORKERS
    )
    body = {**BODY, "stream": False, "max_tokens": 3}
    sent = 0
    # each request on a new connection, so both workers serve some (until the table shows it)
    while sent < 20 or not all(s["started"] for s in slots(router.url)):
        assert sent < 400, slots(router.url)
        with httpx.Client(base_url=router.url, timeout=30) as client:
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        sent += 1
    assert sum(s["started"] for s in slots(router.url)) == sent
    # a scrape of either worker (one connection: one worker) counts each request once
    answered_by: set[int] = set()
    for _ in range(200):
        with httpx.Client(base_url=router.url, timeout=30) as client:
            status = client.get("/router/status").json()
            answered_by.add(status["workers"]["this"])
            # each worker runs the router's protocol: proxied requests on their lane
            assert status["fast_path"]["lane_responses"] > 0
            text = client.get("/metrics").text
        assert metric_value(text, "spec_router_requests_total") == sent
        assert metric_value(text, "spec_router_requests_total", code="200") == sent
        assert metric_value(text, "spec_router_request_duration_seconds_count") == sent
        assert metric_value(text, "spec_router_in_flight_requests") == 0
        if answered_by == {0, 1}:
            break
    assert answered_by == {0, 1}
    assert text.count("# TYPE spec_router_requests_total counter") == 1
    # the queue's metrics keep their names (from the merged files here: each worker queues)
    assert 'spec_router_queue_outcomes_total{outcome="admitted"} 0.0' in text
    assert "spec_router_queued_requests 0.0" in text
    # and its request deadline: a head that never completes gets the router's 408
    answer = exchange(router.url, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
    assert answer is not None and answer.status == 408


def test_plain_uvicorn_with_workers_is_refused(sims: dict[str, Proc]) -> None:
    env = router_env(sims["speculative"].url, sims["baseline"].url)
    uvicorn = [sys.executable, "-m", "uvicorn", "router.app:app", "--port", "0"]
    done = subprocess.run(
        [*uvicorn, "--workers", "2"], env=env, capture_output=True, text=True, timeout=60
    )
    assert "refusing to run under `uvicorn --workers 2`" in done.stderr
    assert "spec-router serve --workers N" in done.stderr


def each_worker(url: str, path: str, n: int = 2) -> dict[int, Any]:
    """``GET path`` on new connections until every one of ``n`` workers has answered once."""
    answers: dict[int, Any] = {}
    for _ in range(200):
        with httpx.Client(base_url=url, timeout=30) as client:
            this = client.get("/router/status").json()["workers"]["this"]
            if this not in answers:
                answers[this] = client.get(path).json()
        if len(answers) == n:
            return answers
    raise AssertionError(f"only workers {sorted(answers)} answered")


def test_an_operators_crossover_and_table_reach_every_worker(
    start_router: RouterFactory, tmp_path: Path
) -> None:
    path = tmp_path / "table.json"
    tables.save(model_table(32, 64, crossover=5), path)
    router = start_router(admin_token="s3cret", table_path=str(path), serve_args=WORKERS)
    auth = {"authorization": "Bearer s3cret"}
    assert {s["crossover"] for s in each_worker(router.url, "/router/status").values()} == {5}
    put = httpx.put(f"{router.url}/router/crossover", json={"crossover": 7}, headers=auth)
    assert put.status_code == 200
    # in force everywhere at once (the board), whichever worker took the PUT
    for status in each_worker(router.url, "/router/status").values():
        assert (status["crossover"], status["crossover_source"]) == (7, "configured")
        assert status["learning"]["pinned"] is True
    before = each_worker(router.url, "/router/table")[0]["speculative"]
    good = tables.to_json(model_table(1024, 256, crossover=3))  # other curves
    assert httpx.put(f"{router.url}/router/table", json=good, headers=auth).status_code == 200
    for status in each_worker(router.url, "/router/status").values():
        assert (status["crossover"], status["crossover_source"]) == (3, "calibrated")
        assert status["learning"]["pinned"] is False

    # the other worker takes up the table's curves too, and the leader writes the file
    def curves_taken() -> bool:
        shown = [t["speculative"] for t in each_worker(router.url, "/router/table").values()]
        return bool(shown[0] == shown[1] != before)

    wait_for(curves_taken)
    wait_for(lambda: tables.load(path).crossover == 3)


def gone(pid: int) -> bool:
    """The process has ended (a zombie, not yet reaped by whoever adopted it, counts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_sigterm_stops_every_worker_and_a_killed_supervisor_takes_them_along(
    start_router: RouterFactory,
) -> None:
    router = start_router(serve_args=WORKERS)
    pids = [s["pid"] for s in slots(router.url)]
    assert router.stop() == 0
    assert all(gone(pid) for pid in pids)
    orphaned = start_router(serve_args=WORKERS)
    pids = [s["pid"] for s in slots(orphaned.url)]
    orphaned.kill()  # SIGKILL: no reclaim, no restart; the workers must not serve on alone
    wait_for(lambda: all(gone(pid) for pid in pids))


def test_a_bad_table_is_refused_once_before_any_worker_starts(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text('{"version": 1, "crossover": "seven"}')
    env = router_env("http://127.0.0.1:9", "http://127.0.0.1:10", table_path=str(path))
    done = subprocess.run(
        [sys.executable, "-m", "router", "serve", "--port", "0", *WORKERS],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "SPEC_ROUTER_TABLE_PATH" in lines[0]


async def test_many_concurrent_requests_over_two_workers_all_answer_and_leave_nothing(
    start_router: RouterFactory, sims: dict[str, Proc]
) -> None:
    router = start_router(serve_args=WORKERS)
    short = {**BODY, "max_tokens": 30}
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)

    async def one(client: httpx.AsyncClient, i: int) -> int:
        body = {**short, "stream": i % 2 == 0}
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            await response.aread()
            return response.status_code

    async with httpx.AsyncClient(base_url=router.url, limits=limits, timeout=60) as client:
        codes = await asyncio.gather(*(one(client, i) for i in range(200)))
    assert codes == [200] * 200
    assert all(s["started"] for s in slots(router.url))  # both workers took some
    wait_for(lambda: router_status(router.url)["in_flight"]["total"] == 0)
    spec, base = sims["speculative"], sims["baseline"]
    wait_for(lambda: (engine_running(spec), engine_running(base)) == (0, 0))
    text = httpx.get(f"{router.url}/metrics").text
    assert metric_value(text, "spec_router_requests_total", code="200") == 200


def test_every_worker_serves_the_leaders_plan(start_router: RouterFactory, tmp_path: Path) -> None:
    """Only the leader plans; each worker serves its document and its gauges."""
    path = tmp_path / "table.json"
    tables.save(model_table(32, 64, time_scale=0.1), path)
    router = start_router(table_path=str(path), planner="advisory", plan_time_scale="0.02",
                          serve_args=WORKERS)  # fmt: skip

    def planned() -> dict[int, Any] | None:
        docs = each_worker(router.url, "/router/plan")
        ats = {d.get("at") for d in docs.values()}
        return docs if None not in ats else None

    docs = wait_for(planned, timeout=20)
    assert docs is not None
    for doc in docs.values():
        assert doc["planner"] == "advisory"
        assert doc["running"] == {"speculative": 1, "baseline": 1}
    for _ in range(10):  # (new connections: both workers answer)
        text = httpx.get(f"{router.url}/metrics", timeout=5).text
        assert 'spec_router_plan_running_engines{pool="speculative"} 1.0' in text
