"""Batching, queueing and aborts as the metrics show them; start-up and shutdown."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from tests.sim.conftest import chat_body, metrics
from tests.support.processes import Proc, free_port, running, sim_args, sim_on, spawn

CHAT = "/v1/chat/completions"


def wait_for(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


def load(url: str) -> tuple[float, float]:
    m = metrics(url)
    return m["sglang:num_running_reqs"], m["sglang:num_queue_reqs"]


async def abort_at_random(url: str, n: int, rng: random.Random, ready: threading.Event) -> int:
    """Open ``n`` long streams, wait for ``ready``, then drop each after a random number of
    chunks (some before the first one). Returns how many got any content."""
    limits = httpx.Limits(max_connections=n)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(10.0)) as client:
        got = 0

        async def one(i: int) -> None:
            nonlocal got
            body = chat_body(100_000, stream=True)
            async with client.stream("POST", url + CHAT, json=body) as resp:
                assert resp.status_code == 200
                while not ready.is_set():
                    await asyncio.sleep(0.01)
                stop_after = rng.randrange(0, 20)
                chunks = 0
                async for _ in resp.aiter_raw():
                    chunks += 1
                    if chunks > stop_after:
                        break
                got += chunks > 1

        await asyncio.gather(*(one(i) for i in range(n)))
        return got


def test_queue_and_client_aborts_release_slots() -> None:
    with running(sim_args("eagle3", "--time-scale", "0.05", "--max-running", "8")) as sim:
        ready = threading.Event()
        result: list[int] = []
        thread = threading.Thread(
            target=lambda: result.append(
                asyncio.run(abort_at_random(sim.url, 12, random.Random(4), ready))
            )
        )
        thread.start()
        try:
            wait_for(lambda: load(sim.url) == (8, 4))  # eight running, four waiting
        finally:
            ready.set()
            thread.join(timeout=20)
        assert result and result[0] > 0
        wait_for(lambda: load(sim.url) == (0, 0), timeout=2.0)
        assert metrics(sim.url)["sglang:num_aborted_requests_total"] == 12


def test_many_random_aborts_return_running_to_zero(eagle3: Proc) -> None:
    ready = threading.Event()
    ready.set()
    asyncio.run(abort_at_random(eagle3.url, 64, random.Random(7), ready))
    wait_for(lambda: load(eagle3.url) == (0, 0), timeout=2.0)


def test_abandoned_non_streamed_request_is_aborted(baseline: Proc) -> None:
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(baseline.url + CHAT, json=chat_body(100_000), timeout=httpx.Timeout(5, read=0.3))
    wait_for(lambda: load(baseline.url) == (0, 0), timeout=2.0)


def test_same_seed_same_acceptance(eagle3: Proc) -> None:
    def chunk_sizes(seed: int) -> list[int]:
        text = httpx.post(eagle3.url + CHAT, json=chat_body(60, stream=True, seed=seed)).text
        events = [json.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: {")]
        contents = [e["choices"][0]["delta"]["content"] for e in events if e["choices"]]
        return [len(c.split()) for c in contents if c]

    assert chunk_sizes(11) == chunk_sizes(11)
    assert chunk_sizes(11) != chunk_sizes(12)


def test_startup_503_then_ready() -> None:
    start = time.monotonic()
    with running(sim_args("baseline", "--startup-delay", "0.6")) as sim:
        assert httpx.get(sim.url + "/health").status_code == 503
        resp = httpx.post(sim.url + CHAT, json=chat_body())
        assert resp.status_code == 503 and resp.json()["error"]["code"] == 503
        assert httpx.get(sim.url + "/sim/config").json()["ready"] is False
        wait_for(lambda: httpx.get(sim.url + "/health").status_code == 200)
        assert time.monotonic() - start >= 0.6
        assert httpx.post(sim.url + CHAT, json=chat_body(2)).status_code == 200


def test_bare_startup_delay_uses_the_preset_scaled() -> None:
    # eagle3 starts in 550 s; at time scale 0.001 that is 0.55 s.
    with running(sim_args("eagle3", "--startup-delay", "--time-scale", "0.001")) as sim:
        assert httpx.get(sim.url + "/health").status_code == 503
        wait_for(lambda: httpx.get(sim.url + "/health").status_code == 200)


def test_startup_refuse_does_not_listen() -> None:
    port = free_port()
    box: list[Proc] = []
    thread = threading.Thread(
        target=lambda: box.append(
            spawn(sim_on("baseline", port, "--startup-delay", "0.6", "--startup-mode", "refuse"))
        )
    )
    start = time.monotonic()
    thread.start()
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        thread.join(timeout=10)
        assert time.monotonic() - start >= 0.6
        assert box and httpx.get(box[0].url + "/health").status_code == 200
        assert any("will listen in 0.6 s" in line for line in box[0].output)
    finally:
        thread.join(timeout=10)
        for proc in box:
            proc.stop()


def test_sigterm_with_a_hanging_request_is_quick() -> None:
    sim = spawn(sim_args("baseline", "--time-scale", "0.05"))
    client = httpx.Client(timeout=httpx.Timeout(5, read=10))
    try:
        with client.stream(
            "POST",
            sim.url + CHAT,
            json=chat_body(5, stream=True),
            headers={"x-sim-fault": "hang_after=2"},
        ) as resp:
            next(resp.iter_raw())
            start = time.monotonic()
            assert sim.stop(timeout=5) is not None
            assert time.monotonic() - start < 3
    except httpx.TransportError:
        pass
    finally:
        client.close()
        sim.stop()
