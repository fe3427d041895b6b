"""``--engine sglang|vllm``: the sims behave like each engine's source says (docs/engines.md).

Each test names the behaviour and runs its own small sim at a time scale that keeps it short.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.sim.conftest import chat_body, engine_error
from tests.support.http import wait_for
from tests.support.processes import Proc, running, sim_args

CHAT = "/v1/chat/completions"


def config(url: str) -> dict[str, object]:
    body: dict[str, object] = httpx.get(url + "/sim/config").json()
    return body


def live(url: str) -> int:
    """Requests the engine really holds (running + queued), whatever its gauges say."""
    engine = config(url)["engine"]
    assert isinstance(engine, dict)
    return int(engine["running"]) + int(engine["queued"])


def send_and_hold(url: str, body: dict[str, object]) -> socket.socket:
    """POST ``body`` over a bare socket and return it unread (the answer may never come)."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(
        f"POST {CHAT} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


def samples(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    text = httpx.get(url + "/metrics").text
    return [
        (s.labels, s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    ]


def gauge(url: str, name: str) -> float:
    return sum(v for _, v in samples(url, name))


@pytest.fixture(scope="module")
def sglang() -> Iterator[Proc]:
    with running(sim_args("baseline", "--time-scale", "0.1", "--max-running", "1")) as proc:
        yield proc


@pytest.fixture(scope="module")
def vllm() -> Iterator[Proc]:
    args = sim_args("baseline", "--time-scale", "0.1", "--max-running", "1", "--engine", "vllm")
    with running(args) as proc:
        yield proc


# -- health ---------------------------------------------------------------------------------


def test_sglang_health_generates_and_ready_does_not(sglang: Proc) -> None:
    before = config(sglang.url)["health_generations"]
    began = time.monotonic()
    assert httpx.get(sglang.url + "/health").status_code == 200
    assert time.monotonic() - began >= 0.1  # asyncio.sleep(1) before the first look, x 0.1
    assert config(sglang.url)["health_generations"] == before + 1  # type: ignore[operator]
    for _ in range(5):
        r = httpx.get(sglang.url + "/ready")
        assert r.status_code == 200 and r.content == b""
    assert config(sglang.url)["health_generations"] == before + 1  # type: ignore[operator]


def test_sglang_busy_health_runs_no_generation(sglang: Proc) -> None:
    before = config(sglang.url)["health_generations"]
    with httpx.stream("POST", sglang.url + CHAT, json=chat_body(2000, stream=True)) as r:
        chunks = r.iter_raw()  # (kept: a dropped iterator closes the connection)
        next(chunks)
        assert httpx.get(sglang.url + "/health").status_code == 200
    assert config(sglang.url)["health_generations"] == before


def test_sglang_health_switch_and_timeout() -> None:
    env = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0", "SGLANG_HEALTH_CHECK_TIMEOUT": "3"}
    # a forward that takes 100 model s: a busy engine with no output for the check's 3 s
    args = sim_args("baseline", "--time-scale", "0.1", "--a-ms", "100000", "--warmup", "0")
    with running(args, env=env) as sim:
        assert httpx.get(sim.url + "/health").status_code == 200  # switched off: no generation
        assert config(sim.url)["health_generations"] == 0
        with send_and_hold(sim.url, chat_body(5, stream=True)):
            wait_for(lambda: live(sim.url) == 1, timeout=5.0)
            began = time.monotonic()
            assert httpx.get(sim.url + "/health_generate").status_code == 503
            assert time.monotonic() - began >= 0.3
            assert httpx.get(sim.url + "/ready").status_code == 503  # marked UnHealthy
            # with the switch off /health says 200 even now (it checks only start-up)
            assert httpx.get(sim.url + "/health").status_code == 200


def test_vllm_health_is_a_flag(vllm: Proc) -> None:
    for _ in range(3):
        r = httpx.get(vllm.url + "/health")
        assert r.status_code == 200 and r.content == b""
    assert config(vllm.url)["health_generations"] == 0
    assert httpx.get(vllm.url + "/ready").status_code == 404
    assert httpx.get(vllm.url + "/health_generate").status_code == 404


# -- gauges ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("engine", "name"),
    [("sglang", "sglang:num_running_reqs"), ("vllm", "vllm:num_requests_running")],
)
def test_sglang_gauges_lag_vllm_gauges_do_not(engine: str, name: str) -> None:
    # One stream, 10 ms iterations. SGLang's prefill report leaves the joining request out
    # and its decode report comes 40 iterations later; vLLM's gauge counts it at once.
    args = ["--time-scale", "0.1", "--a-ms", "100", "--engine", engine, "--warmup", "0"]
    with running(sim_args("baseline", *args)) as sim:
        with httpx.stream("POST", sim.url + CHAT, json=chat_body(400, stream=True)) as r:
            chunks = r.iter_raw()  # (kept: a dropped iterator closes the connection)
            next(chunks)
            assert live(sim.url) == 1
            if engine == "vllm":
                assert gauge(sim.url, name) == 1
            else:
                assert gauge(sim.url, name) == 0
                wait_for(lambda: gauge(sim.url, name) == 1, timeout=5.0)
        wait_for(lambda: gauge(sim.url, name) == 0, timeout=5.0)


@pytest.mark.parametrize("version", ["0.5.23", "0.5.3"])
def test_sglang_idle_refresh(version: str) -> None:
    # 60 tokens: the 40th iteration reports running 1, then the request ends and the engine
    # idles. 0.5.23 sees its gauge is stale and reports at once; 0.5.3 waits for its 30-s
    # idle report (1.5 s here, counted from its last report, 20 iterations = 0.2 s earlier).
    # The timing itself is tested in process, on a virtual clock (tests/sim/test_engine.py);
    # here, each version's flags over HTTP: 0.5.3's report is not early.
    args = ["--time-scale", "0.05", "--a-ms", "200", "--engine-version", version, "--warmup", "0"]
    with running(sim_args("baseline", *args)) as sim:
        with send_and_hold(sim.url, chat_body(60)):  # 10 ms iterations
            wait_for(lambda: gauge(sim.url, "sglang:num_running_reqs") == 1, timeout=5.0)
            wait_for(lambda: live(sim.url) == 0, timeout=5.0)
        ended = time.monotonic()
        wait_for(lambda: gauge(sim.url, "sglang:num_running_reqs") == 0, timeout=5)
        took = time.monotonic() - ended
        if version == "0.5.3":
            assert took >= 1.0, took
            assert not samples(sim.url, "sglang:spec_verify_calls_total")  # not in 0.5.3
            (labels, _), *_ = samples(sim.url, "sglang:num_running_reqs")
            assert "moe_ep_rank" not in labels and "priority" not in labels


def test_ranks_and_priorities() -> None:
    args = [
        "--time-scale", "0.1", "--dp-size", "2", "--tp-size", "2",
        "--enable-metrics-for-all-schedulers", "--enable-priority", "--warmup", "0",
    ]  # fmt: skip
    with running(sim_args("baseline", *args)) as sim:
        bodies = [chat_body(2000, stream=True, priority=p) for p in (1, 1, None)]
        with httpx.Client(timeout=10) as client:
            streams = [client.stream("POST", sim.url + CHAT, json=b) for b in bodies]
            responses = [s.__enter__() for s in streams]
            iters: dict[int, Iterator[bytes]] = {}
            try:
                for r in responses:
                    next(iters.setdefault(id(r), r.iter_raw()))
                wait_for(lambda: live(sim.url) == 3, timeout=5.0)

                def by_rank() -> dict[tuple[str, str, str], float]:
                    return {
                        (lab["dp_rank"], lab["tp_rank"], lab["priority"]): v
                        for lab, v in samples(sim.url, "sglang:num_running_reqs")
                    }

                # DP ranks take requests in turn: rank 0 has two (priorities 1 and None)
                wait_for(lambda: by_rank().get(("0", "0", "")) == 2, timeout=5.0)
                seen = by_rank()
                assert seen[("0", "0", "")] == seen[("0", "1", "")] == 2  # TP ranks repeat
                assert seen[("1", "0", "")] == 1
                assert seen[("0", "0", "1")] == 1 and seen[("0", "0", "None")] == 1
                assert seen[("1", "0", "1")] == 1 and seen[("1", "0", "None")] == 0
                assert sum(seen.values()) == 12  # what a sum over every series says
            finally:
                for s in streams:
                    s.__exit__(None, None, None)
        accept = samples(sim.url, "sglang:spec_accept_length")
        assert {lab["priority"] for lab, _ in accept} == {""}
        tokens = samples(sim.url, "sglang:generation_tokens_total")
        assert "tp_rank" not in tokens[0][0] and "dp_rank" not in tokens[0][0]


def test_vllm_metric_names(vllm_eagle3: Proc) -> None:
    sim = vllm_eagle3
    # the session's vLLM-mode eagle3 sim
    httpx.post(sim.url + CHAT, json=chat_body(100))
    text = httpx.get(sim.url + "/metrics").text
    assert 'vllm:num_requests_running{engine="0",model_name="default"} 0.0' in text
    assert "vllm:spec_decode_num_drafts_created{" in text
    drafts = gauge(sim.url, "vllm:spec_decode_num_drafts_total")
    accepted = gauge(sim.url, "vllm:spec_decode_num_accepted_tokens_total")
    assert 1.8 < 1 + accepted / drafts < 3.8
    per_pos = samples(sim.url, "vllm:spec_decode_num_accepted_tokens_per_pos_total")
    assert sum(v for _, v in per_pos) == accepted
    assert "sglang:" not in text
    assert httpx.get(sim.url + "/server_info").status_code == 404


# -- errors and overload --------------------------------------------------------------------


def sse_events(body: bytes) -> list[str]:
    return [e.strip()[6:] for e in body.decode().split("\n\n") if e.strip()]


@pytest.mark.parametrize("version", ["0.5.23", "0.5.3", "vllm"])
def test_overload(version: str) -> None:
    engine = ["--engine", "vllm"] if version == "vllm" else ["--engine-version", version]
    args = ["--time-scale", "0.1", "--max-running", "1", "--max-queued", "1", *engine]

    async def scenario(url: str) -> None:
        async with httpx.AsyncClient(timeout=10) as client:
            async with client.stream("POST", url + CHAT, json=chat_body(2000, stream=True)) as r:
                chunks = r.aiter_raw()  # (kept: a dropped iterator closes the connection)
                await chunks.__anext__()
                queued = asyncio.create_task(client.post(url + CHAT, json=chat_body(5)))
                while live(url) != 2:  # one running, one queued: the queue is full
                    await asyncio.sleep(0.01)
                whole = await client.post(url + CHAT, json=chat_body(5))
                assert whole.status_code == 503
                error = engine_error(whole.json())
                assert error["code"] == 503
                if version == "vllm":
                    assert "error" in whole.json() and error["type"] == "Service Unavailable"
                else:
                    assert whole.json()["message"] == "The request queue is full."  # flat
                body = chat_body(5, stream=True, stream_options={"include_usage": True})
                if version == "0.5.3":
                    # 200, then the connection closes: no event, no [DONE]
                    async with client.stream("POST", url + CHAT, json=body) as s:
                        assert s.status_code == 200
                        with pytest.raises(httpx.RemoteProtocolError):
                            await s.aread()
                else:
                    s = await client.post(url + CHAT, json=body)
                    if version == "vllm":
                        assert s.status_code == 503  # checked before the response starts
                    else:
                        assert s.status_code == 200
                        error_event, usage, done = sse_events(s.content)
                        assert json.loads(error_event) == {
                            "error": {
                                "object": "error",
                                "message": "The request queue is full.",
                                "type": "SERVICE_UNAVAILABLE",
                                "param": None,
                                "code": 503,
                            }
                        }
                        assert json.loads(usage)["usage"]["completion_tokens"] == 0
                        assert done == "[DONE]"
                queued.cancel()

    with running(sim_args("baseline", *args)) as sim:
        asyncio.run(scenario(sim.url))
        assert config(sim.url)["engine"]["refused"] == 2  # type: ignore[index]


def test_stream_headers_before_queueing_or_with_the_first_chunk(sglang: Proc, vllm: Proc) -> None:
    # max_running 1: a second stream waits for the first (4 s) to end. vLLM answers it with
    # headers at once; SGLang 0.5.23 only once its first chunk exists.
    for sim, early in ((sglang, False), (vllm, True)):
        with httpx.Client(timeout=10) as client:
            with client.stream("POST", sim.url + CHAT, json=chat_body(2000, stream=True)) as r:
                chunks = r.iter_raw()
                next(chunks)
                second = client.build_request(
                    "POST",
                    sim.url + CHAT,
                    json=chat_body(5, stream=True),
                    timeout=httpx.Timeout(5, read=0.5),
                )
                if early:
                    queued = client.send(second, stream=True)
                    assert queued.status_code == 200 and live(sim.url) == 2  # still queued
                    queued.close()
                else:
                    with pytest.raises(httpx.ReadTimeout):
                        client.send(second)


# -- cancellation ---------------------------------------------------------------------------


def test_abort_after_disconnect(sglang: Proc, vllm: Proc) -> None:
    """SGLang lets a started stream run 2 s (0.2 s here) after its client left; vLLM stops.
    (The sim measures the lag itself: from the disconnect it saw to the abort.)"""
    for sim in (sglang, vllm):
        with httpx.stream("POST", sim.url + CHAT, json=chat_body(5000, stream=True)) as r:
            chunks = r.iter_raw()  # (kept: a dropped iterator closes the connection)
            next(chunks)
        wait_for(lambda s=sim: live(s.url) == 0, timeout=3)  # type: ignore[misc]
        lag = config(sim.url)["engine"]["abort_lag"]  # type: ignore[index]
        if sim is sglang:
            assert lag >= 0.195, lag
        else:
            assert lag == pytest.approx(0, abs=0.01), lag


def test_sglang_notices_a_queued_client_leaving_at_its_4_s_poll(sglang: Proc) -> None:
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", sglang.url + CHAT, json=chat_body(3000, stream=True)) as r:
            chunks = r.iter_raw()  # (kept: a dropped iterator closes the connection)
            next(chunks)
            with pytest.raises(httpx.ReadTimeout):  # queued behind the first: no headers yet
                client.post(
                    sglang.url + CHAT,
                    json=chat_body(5, stream=True),
                    timeout=httpx.Timeout(5, read=0.05),
                )
            wait_for(lambda: live(sglang.url) == 1, timeout=3)
            engine = config(sglang.url)["engine"]
            lag, age = engine["abort_lag"], engine["abort_age"]  # type: ignore[index]
            # noticed at the next look, 4 model s (0.4 s here) after it came, not when the
            # client left (~0.05 s after it came; how long after depends on the host's load,
            # so the lag's lower bound is the look's, not the client's)
            assert 0.4 * 0.99 <= age < 0.8 and 0 < lag < 0.8


# -- usage, models, keep-alive --------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_011() -> Iterator[Proc]:
    args = ["--time-scale", "0.05", "--engine", "vllm", "--engine-version", "0.11"]
    with running(sim_args("baseline", *args)) as proc:
        yield proc


@pytest.mark.parametrize(("version", "usage"), [("0.11", True), ("0.34", False)])
def test_vllm_empty_stream_options(
    version: str, usage: bool, request: pytest.FixtureRequest
) -> None:
    sim: Proc = request.getfixturevalue("vllm_011" if version == "0.11" else "vllm")
    # 0.34 is the module's vLLM sim
    body = chat_body(3, stream=True, stream_options={})
    assert (b'"usage":{' in httpx.post(sim.url + CHAT, json=body).content) is usage
    continuous = chat_body(
        3, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}
    )
    events = sse_events(httpx.post(sim.url + CHAT, json=continuous).content)
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["usage"]["completion_tokens"] for c in chunks] == [0, 1, 2, 3, 3, 3]
    refused = httpx.post(sim.url + CHAT, json=chat_body(3, stream_options={"a": 1}))
    assert refused.status_code == 400  # stream options need stream=True


def test_model_names(sglang: Proc, vllm: Proc) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(sglang.url + CHAT, json=body).json()["model"] == "default"
    assert httpx.post(sglang.url + CHAT, json={**body, "model": "any"}).json()["model"] == "any"
    assert httpx.post(vllm.url + CHAT, json=body).json()["model"] == "default"
    unknown = httpx.post(vllm.url + CHAT, json={**body, "model": "other"})
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "NotFoundError"


def test_idle_keep_alive() -> None:
    args = ["--time-scale", "0.05", "--keep-alive", "0.3"]
    with running(sim_args("baseline", *args)) as sim:
        host, port = sim.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(f"GET /v1/models HTTP/1.1\r\nhost: {host}\r\n\r\n".encode())
            data = b""
            while not data.endswith(b"}]}"):  # the whole answer
                data += sock.recv(65536)
            assert data.startswith(b"HTTP/1.1 200")
            began = time.monotonic()
            assert sock.recv(65536) == b""  # the server closed the idle connection
            assert time.monotonic() - began >= 0.25  # (not before its keep-alive)


def test_idle_keep_alive_is_5_s_by_default(sglang: Proc, vllm: Proc) -> None:
    for sim in (sglang, vllm):
        assert config(sim.url)["keep_alive"] == 5.0  # as both engines run uvicorn
