"""Batching, queueing and aborts as the metrics show them; start-up and shutdown."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time

import httpx
import pytest

from tests.sim.conftest import chat_body, metrics
from tests.support.http import wait_for
from tests.support.processes import Background, Proc, free_port, running, sim_args, sim_on, spawn

CHAT = "/v1/chat/completions"


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
            wait_for(lambda: load(sim.url) == (8, 4), timeout=5.0)  # eight running, four waiting
        finally:
            ready.set()
            thread.join(timeout=20)
        assert result and result[0] > 0

        # every slot released and every request counted as aborted, seen together: as SGLang's,
        # the sim's prefill report shows the running batch without the requests joining it and
        # the queue after they left it, so when the last queued requests join a batch whose
        # other requests were all aborted, the gauges read 0/0 while those still run (until
        # their own aborts, ~40 ms later here: seen as 9 of 12 counted)
        def released() -> bool:
            m = metrics(sim.url)
            gauges = (m["sglang:num_running_reqs"], m["sglang:num_queue_reqs"])
            return gauges == (0, 0) and m["sglang:num_aborted_requests_total"] == 12

        wait_for(released, timeout=2.0)


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
    # Counted by the engine (its verify steps), not read from the stream's chunks: a handler
    # that falls behind on a busy machine merges two iterations' tokens into one chunk.
    def steps(seed: int) -> tuple[int, int]:
        before = httpx.get(eagle3.url + "/sim/config").json()["engine"]
        httpx.post(eagle3.url + CHAT, json=chat_body(60, stream=True, seed=seed))
        after = httpx.get(eagle3.url + "/sim/config").json()["engine"]
        return tuple(after[k] - before[k] for k in ("spec_steps", "spec_tokens"))

    assert steps(11) == steps(11)
    assert steps(11) != steps(12)


class Starting(Background):
    """A sim started on a known port in the background, to look at while it starts."""

    def __init__(self, preset: str, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(sim_on(preset, self.port, *extra))

    def status(self, path: str = "/health") -> int | None:
        """The status of ``path``, or None while the port refuses connections."""
        try:
            return httpx.get(self.url + path, timeout=5).status_code
        except httpx.ConnectError:
            return None

    def announced(self) -> Proc:
        return self.proc()


def test_startup_503_then_ready() -> None:
    # --startup-mode 503: listen while loading and answer 503 (not what the engines do)
    sim = Starting("baseline", "--startup-delay", "0.6", "--startup-mode", "503")
    try:
        wait_for(lambda: sim.status() is not None, timeout=5.0)
        assert sim.status() == 503
        resp = httpx.post(sim.url + CHAT, json=chat_body())
        assert resp.status_code == 503 and resp.json()["code"] == 503  # SGLang's flat body
        assert httpx.get(sim.url + "/sim/config").json()["ready"] is False
        proc = sim.announced()  # announced once it serves
        assert time.monotonic() - sim.began >= 0.6
        assert httpx.get(proc.url + "/health").status_code == 200
        assert httpx.post(proc.url + CHAT, json=chat_body(2)).status_code == 200
    finally:
        sim.stop()


def test_bare_startup_delay_uses_the_preset_scaled() -> None:
    # eagle3 loads in 550 s; at time scale 0.001 that is 0.55 s without listening.
    sim = Starting("eagle3", "--startup-delay", "--time-scale", "0.001")
    try:
        proc = sim.announced()
        assert any("will listen in 0.55 s" in line for line in proc.output)
        assert time.monotonic() - sim.began >= 0.55
    finally:
        sim.stop()


@pytest.mark.parametrize(("engine", "warmup"), [("sglang", True), ("vllm", False)])
def test_startup_refuses_while_loading_then_warms_up(engine: str, warmup: bool) -> None:
    # Both engines bind their port only once the model is loaded (connection refused until
    # then); SGLang then answers /health with 503 until its warm-up request is done (5 model
    # s, 0.5 s here; 2 by default), vLLM serves at once.
    sim = Starting(
        "baseline", "--engine", engine, "--startup-delay", "6", "--time-scale", "0.1",
        *(["--warmup", "5"] if warmup else []),
    )  # fmt: skip
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", sim.port), timeout=1).close()
        wait_for(lambda: sim.status() is not None, timeout=10)
        first = sim.status()
        proc = sim.announced()
        assert time.monotonic() - sim.began >= 0.6
        assert any("will listen in 0.6 s" in line for line in proc.output)
        if warmup:
            assert first == 503
            assert sim.status("/ready") == 200
        else:
            assert first == 200
            assert sim.status("/ready") == 404  # vLLM has no /ready
        assert httpx.get(proc.url + "/health").status_code == 200
    finally:
        sim.stop()


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
            # (stop() waits 5 s for the exit: a sim that waited for the hanging request, as a
            # graceful shutdown would, is still running then and this fails)
            assert sim.stop(timeout=5) is not None
    except httpx.TransportError:
        pass
    finally:
        client.close()
        sim.stop()
