"""Every fault knob, per request (header) and server-wide (POST /sim/config)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from router.sim.protocol import filler
from tests.sim.conftest import chat_body, engine_error, metrics
from tests.support.http import sim_held, wait_for
from tests.support.processes import Proc

CHAT = "/v1/chat/completions"


def raw_request(
    url: str, body: dict[str, object], fault: str, timeout: float = 5.0
) -> tuple[bytes, BaseException | None]:
    """POST over a bare socket; returns what arrived and how the connection ended."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    head = (
        f"POST {CHAT} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\nx-sim-fault: {fault}\r\n\r\n"
    ).encode()
    data = b""
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head + payload)
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except OSError as exc:
            return data, exc
    return data, None


def running(url: str) -> float:
    return metrics(url)["sglang:num_running_reqs"]


@pytest.fixture
def config(eagle3: Proc) -> Iterator[str]:
    """The eagle3 sim's /sim/config URL; every setting is put back afterwards."""
    url = eagle3.url + "/sim/config"
    yield url
    httpx.post(url, json={"fault": None, "tau": None, "tau_sampling": None, "health_status": 200})


@pytest.mark.parametrize("status", [429, 500, 503])
def test_status(eagle3: Proc, status: int) -> None:
    resp = httpx.post(
        eagle3.url + CHAT, json=chat_body(), headers={"x-sim-fault": f"status={status}"}
    )
    assert resp.status_code == status
    error = engine_error(resp.json())  # SGLang's flat shape
    assert error["code"] == status and "status" in str(error["message"])
    assert error["type"] == {500: "InternalServerError"}.get(status, str(status))
    assert ("retry-after" in resp.headers) == (status in (429, 503))


def test_hang_before_headers(eagle3: Proc) -> None:
    with pytest.raises(httpx.ReadTimeout):
        hang = {"x-sim-fault": "hang_before_headers"}
        timeout = httpx.Timeout(5.0, read=0.3)
        httpx.post(eagle3.url + CHAT, json=chat_body(), headers=hang, timeout=timeout)
    assert running(eagle3.url) == 0
    start = time.monotonic()
    resp = httpx.post(
        eagle3.url + CHAT, json=chat_body(3), headers={"x-sim-fault": "hang_before_headers=0.3"}
    )
    assert resp.status_code == 200 and time.monotonic() - start >= 0.3
    assert resp.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("sim_name", ["eagle3", "baseline"])
def test_hang_after_tokens(request: pytest.FixtureRequest, sim_name: str) -> None:
    sim: Proc = request.getfixturevalue(sim_name)
    body = chat_body(200, stream=True)
    text = ""
    timeout = httpx.Timeout(5.0, read=0.5)
    with httpx.stream(
        "POST", sim.url + CHAT, json=body, headers={"x-sim-fault": "hang_after=10"}, timeout=timeout
    ) as resp:
        assert resp.status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            for piece in resp.iter_text():
                text += piece
        # Still open and silent, and no longer in the batch.
        assert running(sim.url) == 0
    contents = [
        json.loads(e[6:])["choices"][0]["delta"]["content"] for e in text.split("\n\n") if e
    ]
    assert "".join(contents[1:]) == filler(0, 10)


def deltas(text: str) -> str:
    """The content an SSE chat stream carried so far."""
    events = [e[6:] for e in text.split("\n\n") if e.startswith("data: {")]
    return "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events)


@pytest.mark.parametrize("sim_name", ["eagle3", "baseline"])
def test_hold_after_tokens_until_released(request: pytest.FixtureRequest, sim_name: str) -> None:
    """A request gains no token past N, running all the while, for as long as no one releases
    it; released, the rest comes and the stream ends whole."""
    sim: Proc = request.getfixturevalue(sim_name)
    config = sim.url + "/sim/config"
    aborted = httpx.get(config).json()["engine"]["aborted"]
    pieces: list[str] = []

    def read() -> int:
        with httpx.stream(
            "POST",
            sim.url + CHAT,
            json=chat_body(200, stream=True),
            headers={"x-sim-fault": "hold_after=10"},
            timeout=30,
        ) as resp:
            for piece in resp.iter_text():
                pieces.append(piece)
            return resp.status_code

    with ThreadPoolExecutor(1) as pool:
        reading = pool.submit(read)
        wait_for(lambda: sim_held(sim.url) == 1)
        assert wait_for(lambda: deltas("".join(pieces))) == filler(0, 10)
        engine = httpx.get(config).json()["engine"]
        assert engine["running"] == 1 and engine["aborted"] == aborted  # in the batch
        assert not reading.done() and sim_held(sim.url) == 1
        assert httpx.post(config, json={"release": True}).json()["held"] == 0
        assert reading.result(timeout=30) == 200
    text = "".join(pieces)
    assert text.endswith("data: [DONE]\n\n")
    assert deltas(text) == filler(0, 200)


def test_hold_after_holds_a_non_stream_and_a_leaving_client(eagle3: Proc, config: str) -> None:
    """A non-stream holds its answer; a client that leaves a held stream is aborted as any
    (SGLang: a moment later), and a release with nothing held does nothing."""
    hold = {"x-sim-fault": "hold_after=5"}
    host, port = eagle3.url.removeprefix("http://").split(":")
    payload = json.dumps(chat_body(200, stream=True)).encode()
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(
            f"POST {CHAT} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload)}\r\nx-sim-fault: hold_after=5\r\n\r\n".encode()
            + payload
        )
        wait_for(lambda: sim_held(eagle3.url) == 1)
    wait_for(lambda: sim_held(eagle3.url) == 0)  # the client left: no longer held
    wait_for(lambda: httpx.get(config).json()["engine"]["running"] == 0)
    assert httpx.post(config, json={"release": "yes"}).status_code == 400
    httpx.post(config, json={"release": True})  # nothing held: nothing happens
    with httpx.Client(base_url=eagle3.url, timeout=30) as client:
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(client.post, CHAT, json=chat_body(20), headers=hold)
            wait_for(lambda: sim_held(eagle3.url) == 1)
            assert not answer.done()
            httpx.post(config, json={"release": True})
            resp = answer.result(timeout=30)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 20


def test_reset_after_tokens_sends_rst(eagle3: Proc) -> None:
    data, exc = raw_request(eagle3.url, chat_body(200, stream=True), "reset_after=10")
    assert data.startswith(b"HTTP/1.1 200")
    assert isinstance(exc, ConnectionResetError)
    assert data.count(b"chat.completion.chunk") >= 2 and b"[DONE]" not in data
    assert running(eagle3.url) == 0
    # An HTTP client sees a broken body.
    with pytest.raises(httpx.TransportError):
        with httpx.stream(
            "POST",
            eagle3.url + CHAT,
            json=chat_body(100, stream=True),
            headers={"x-sim-fault": "reset_after=5"},
        ) as resp:
            resp.read()


def test_reset_non_streamed_and_close(eagle3: Proc) -> None:
    data, exc = raw_request(eagle3.url, chat_body(50), "reset_after=10")
    assert data == b"" and isinstance(exc, ConnectionResetError)
    data, exc = raw_request(eagle3.url, chat_body(50), "close")
    assert data == b"" and isinstance(exc, ConnectionResetError)


def test_probability(eagle3: Proc) -> None:
    never = httpx.post(
        eagle3.url + CHAT, json=chat_body(2), headers={"x-sim-fault": "status=500,p=0"}
    )
    assert never.status_code == 200
    codes = {
        httpx.post(
            eagle3.url + CHAT, json=chat_body(1), headers={"x-sim-fault": "status=500,p=0.5"}
        ).status_code
        for _ in range(40)
    }
    assert codes == {200, 500}


def test_bad_fault_header(eagle3: Proc) -> None:
    resp = httpx.post(eagle3.url + CHAT, json=chat_body(), headers={"x-sim-fault": "explode"})
    assert resp.status_code == 400 and "x-sim-fault" in str(engine_error(resp.json())["message"])


def test_server_wide_fault_and_header_override(eagle3: Proc, config: str) -> None:
    assert httpx.get(config).json()["fault"] is None
    resp = httpx.post(config, json={"fault": "status=503"})
    assert resp.status_code == 200 and resp.json()["fault"] == "status=503"
    assert httpx.post(eagle3.url + CHAT, json=chat_body()).status_code == 503  # refuses work
    ok = httpx.post(eagle3.url + CHAT, json=chat_body(), headers={"x-sim-fault": "none"})
    assert ok.status_code == 200
    assert httpx.post(config, json={"fault": "nonsense"}).status_code == 400
    assert httpx.post(config, json={"bogus": 1}).status_code == 400
    assert httpx.post(config, json={"fault": None}).json()["fault"] is None
    assert httpx.post(eagle3.url + CHAT, json=chat_body()).status_code == 200


def test_health_knob(eagle3: Proc, config: str) -> None:
    httpx.post(config, json={"health_status": 503})
    assert httpx.get(eagle3.url + "/health").status_code == 503
    httpx.post(config, json={"health_status": 200})
    assert httpx.get(eagle3.url + "/health").status_code == 200


def test_tau_knob(eagle3: Proc, config: str) -> None:
    def accept_length(tau: float | None) -> float:
        httpx.post(config, json={"tau": tau})
        before = httpx.get(config).json()["engine"]
        httpx.post(eagle3.url + CHAT, json=chat_body(800))
        after = httpx.get(config).json()["engine"]
        tokens = after["spec_tokens"] - before["spec_tokens"]
        return float(tokens / (after["spec_steps"] - before["spec_steps"]))

    assert accept_length(3.6) == pytest.approx(3.6, abs=0.15)
    assert accept_length(1.5) == pytest.approx(1.5, abs=0.15)
    assert httpx.post(config, json={"tau": 9}).status_code == 400
    assert httpx.post(config, json={"tau": None}).json()["tau"] == 2.8
    # temperature > 0 uses tau_sampling
    httpx.post(config, json={"tau_sampling": 1.0})
    before = httpx.get(config).json()["engine"]
    httpx.post(eagle3.url + CHAT, json=chat_body(100, temperature=0.7))
    after = httpx.get(config).json()["engine"]
    assert (
        after["spec_tokens"] - before["spec_tokens"] == after["spec_steps"] - before["spec_steps"]
    )
