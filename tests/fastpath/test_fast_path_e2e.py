"""The router's fast paths under uvicorn's httptools server, and the plain ASGI path under h11.

Under httptools the router writes a response's start together with the body bytes at hand, and
relays the rest of a chunked body from the upstream's socket callback while the client keeps up
(``router.fastpath.uvicorn.DirectSend``). These tests hold it to what any ASGI path must do: a
client that stops reading gets every byte, once, when it reads again; ``Connection: close`` is
honoured; and the same router under h11 (no fast path) behaves the same.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httptools
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from router.sim.protocol import filler
from tests.conftest import RouterFactory, router_env
from tests.support.bulk_upstream import BulkUpstream
from tests.support.http import metric_value, router_ready, router_status, wait_for
from tests.support.processes import Proc, free_port, spawn

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Tell me about speculative decoding."}
]


class Response:
    """An HTTP/1.1 response read off a raw socket with httptools."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.headers: dict[bytes, bytes] = {}
        self.body = bytearray()
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True

    @property
    def status(self) -> int:
        return int(self.parser.get_status_code())


def read_response(sock: socket.socket) -> Response:
    response = Response()
    while not response.complete:
        data = sock.recv(1 << 16)
        assert data, "the router closed the connection before the response was complete"
        response.parser.feed_data(data)
    return response


def post(path: str, body: bytes, *extra: bytes) -> bytes:
    head = b"POST %s HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n" % (
        path.encode()
    )
    return head + b"".join(extra) + b"content-length: %d\r\n\r\n" % len(body) + body


def abandon_streams(client: openai.OpenAI, n: int) -> None:
    """``n`` long streams, each closed by its client after the first chunk."""
    for _ in range(n):
        with client.chat.completions.create(
            model="sim",
            messages=MESSAGES,
            max_tokens=400,
            stream=True,
        ) as stream:
            next(iter(stream))


def responders(status: dict[str, Any]) -> dict[str, int]:
    """``/router/status``'s responses by responder."""
    fast = status["fast_path"]
    return {key: fast[key] for key in ("direct_responses", "plain_responses")}


def metrics(url: str) -> str:
    return httpx.get(f"{url}/metrics", timeout=5).text


@pytest.fixture
def bulk() -> Iterator[BulkUpstream]:
    """The speculative pool's upstream; the baseline pool gets one too, and no traffic."""
    # open-ended: it streams until the test has seen the router hold back, however much the
    # kernel buffers between the router and a client that stops reading
    with BulkUpstream(size=1024).running() as upstream:
        with BulkUpstream(size=10, events=1).running() as idle:
            upstream.other_url = idle.url
            yield upstream


@pytest.mark.parametrize("http", ["httptools", "h11"])  # relayed from the socket callback, or not
def test_a_client_that_stops_reading_gets_every_byte_once_it_reads_again(
    start_router: RouterFactory, bulk: BulkUpstream, http: str
) -> None:
    """Checklist case 19: write flow control, a slow client gets every byte."""
    router = start_router(
        bulk.url, bulk.other_url, serve_args=("--http", http), scrape_metrics="false"
    )
    host, port = router.url.removeprefix("http://").split(":")
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: tiny window
        sock.connect((host, int(port)))
        sock.sendall(post("/v1/chat/completions", b'{"model": "m", "stream": true}'))
        # Not reading: the router's buffers fill, it says so, and it stops reading upstream.
        wait_for(lambda: metric_value(metrics(router.url), "spec_router_slow_client_requests") == 1)
        assert router_status(router.url)["pools"]["speculative"]["slow_clients"] == 1
        bulk.finish()
        response = read_response(sock)
    assert response.status == 200
    assert response.headers[b"x-spec-router-pool"] == b"speculative"
    assert bytes(response.body) == bulk.body  # every byte, in order, once
    assert bulk.posts == 1
    wait_for(lambda: router_status(router.url)["in_flight"]["total"] == 0, timeout=2)
    text = metrics(router.url)
    assert metric_value(text, "spec_router_slow_client_requests") == 0
    assert metric_value(text, "spec_router_slow_client_responses_total", pool="speculative") == 1


def test_clients_that_keep_up_or_leave_are_not_counted_slow(
    start_router: RouterFactory,
) -> None:
    router = start_router()
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    for _ in range(4):  # read to the end
        stream = client.chat.completions.create(
            model="sim",
            messages=MESSAGES,
            max_tokens=64,
            stream=True,
        )
        assert sum(1 for _ in stream) > 1
    abandon_streams(client, 4)
    wait_for(lambda: router_status(router.url)["in_flight"]["total"] == 0, timeout=2)
    text = metrics(router.url)
    assert metric_value(text, "spec_router_client_disconnects_total") == 4
    assert metric_value(text, "spec_router_slow_client_responses_total") == 0


@pytest.mark.parametrize("stream", [False, True])
def test_connection_close_is_honoured_after_a_complete_response(
    start_router: RouterFactory, stream: bool
) -> None:
    router = start_router()
    host, port = router.url.removeprefix("http://").split(":")
    body = (
        b'{"model": "sim", "max_tokens": 8, "stream": %s, "messages": [{"role": "user", '
        % (b"true" if stream else b"false")
        + b'"content": "hi"}]}'
    )
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(post("/v1/chat/completions", body, b"connection: close\r\n"))
        response = read_response(sock)
        assert sock.recv(1) == b""  # and then the router closes the connection
    assert response.status == 200
    assert response.headers[b"connection"] == b"close"
    if stream:
        assert bytes(response.body).endswith(b"data: [DONE]\n\n")
    else:
        assert b'"usage"' in response.body


@pytest.fixture
def h11_router(sims: dict[str, Proc]) -> Iterator[Proc]:
    env = router_env(sims["speculative"].url, sims["baseline"].url, crossover="2")
    proc = spawn(["-m", "router", "serve", "--port", "0", "--http", "h11"], env=env)
    try:
        # both pools: /ready is 200 on the baseline's first probe alone, and the test's
        # first stream must go to the speculative pool
        wait_for(lambda: router_ready(proc.url, every_pool=True))
        yield proc
    finally:
        proc.stop()


def test_under_h11_the_plain_asgi_path_streams_and_releases(
    h11_router: Proc, sims: dict[str, Proc]
) -> None:
    client = openai.OpenAI(base_url=f"{h11_router.url}/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="sim",
        messages=MESSAGES,
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert raw.headers["x-spec-router-pool"] == "speculative"
    chunks = list(raw.parse())
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16
    assert any(c.choices and c.choices[0].finish_reason == "length" for c in chunks)
    # streams abandoned after their first chunk are released and stop the engines
    abandon_streams(client, 6)
    wait_for(lambda: router_status(h11_router.url)["in_flight"]["total"] == 0, timeout=2)
    text = metrics(h11_router.url)
    assert metric_value(text, "spec_router_client_disconnects_total") == 6


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_the_fast_path_is_engaged_under_httptools_and_only_there(
    start_router: RouterFactory, http: str
) -> None:
    """Fails when uvicorn's httptools server no longer matches what router.fastpath.uvicorn
    relies on: the router would quietly answer everything through plain ASGI."""
    router = start_router(serve_args=("--http", http))
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    for stream in (True, False, True):
        answer = client.chat.completions.create(
            model="sim",
            messages=MESSAGES,
            max_tokens=64,
            stream=stream,
        )
        if stream:  # whole, in order
            assert isinstance(answer, openai.Stream)
            text = "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
            assert text == filler(0, 64)
    # Expect: 100-continue is uvicorn's cycle's to answer, on the fast path too
    expecting = httpx.post(
        f"{router.url}/v1/chat/completions",
        json={"model": "sim", "messages": MESSAGES, "max_tokens": 4},
        headers={"expect": "100-continue"},
    )
    assert expecting.status_code == 200
    assert expecting.json()["usage"]["completion_tokens"] == 4
    fast = responders(router_status(router.url))
    if http == "httptools":
        assert fast == {"direct_responses": 4, "plain_responses": 0}
    else:
        assert fast == {"direct_responses": 0, "plain_responses": 4}
    router.stop()
    # off the fast path, the log says so once, and why
    said = [line for line in router.output if "not the fast path" in line]
    if http == "httptools":
        assert said == []
    else:
        assert len(said) == 1 and "h11" in said[0], router.output


def test_the_readmes_command_with_an_access_log_stays_on_the_fast_path(
    sims: dict[str, Proc],
) -> None:
    """``uvicorn router.app:app`` (the README's command, uvicorn's own protocol) with the
    settings that once took every request off the fast path (an access log,
    ``--limit-concurrency``): each proxied response still takes it, the log says nothing
    of a plain path, and the lean protocol (router.fastpath.lean) took uvicorn's place."""
    port = free_port()
    env = {
        **router_env(sims["speculative"].url, sims["baseline"].url, log_level="info"),
        "PYTHONUNBUFFERED": "1",
    }
    args = ["--port", str(port), "--access-log", "--limit-concurrency", "64"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "router.app:app", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: router_ready(url) or proc.poll() is not None, timeout=30)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for stream in (True, False):
            answer = client.chat.completions.create(
                model="sim", messages=MESSAGES, max_tokens=16, stream=stream
            )
            if isinstance(answer, openai.Stream):
                assert sum(1 for _ in answer) > 1
        fast = responders(router_status(url))
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=30)
    assert fast == {"direct_responses": 2, "plain_responses": 0}
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in output  # (the access log was on)
    assert "not the fast path" not in output
    assert "one keep-alive timer for all" in output  # (router.fastpath.lean adopted)


class Responses:
    """Every response on one connection, in order (one parser: pipelined answers may share a
    read)."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.done: list[tuple[int, dict[bytes, bytes], bytes]] = []
        self._headers: dict[bytes, bytes] = {}
        self._body = bytearray()

    def on_message_begin(self) -> None:
        self._headers, self._body = {}, bytearray()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        self.done.append((self.parser.get_status_code(), self._headers, bytes(self._body)))


def test_pipelined_requests_are_answered_in_order(start_router: RouterFactory) -> None:
    """Proxied requests on the fast path and the router's own endpoints, pipelined on one
    connection, still get their answers one after the other, whole and in order, and nothing
    stays in flight."""
    router = start_router()
    host, port = router.url.removeprefix("http://").split(":")

    def chat(stream: bool, tokens: int) -> bytes:
        body = b'{"model": "sim", "max_tokens": %d, "stream": %s, "messages": [%s]}' % (
            tokens,
            b"true" if stream else b"false",
            b'{"role": "user", "content": "hi"}',
        )
        return post("/v1/chat/completions", body)

    requests = [
        chat(True, 12),
        b"GET /health HTTP/1.1\r\nhost: router\r\n\r\n",
        chat(False, 5),
        chat(True, 3),
    ]
    responses = Responses()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"".join(requests))
        while len(responses.done) < len(requests):
            data = sock.recv(1 << 16)
            assert data, f"closed after {len(responses.done)} answers"
            responses.parser.feed_data(data)
    (s1, h1, b1), (s2, _, b2), (s3, h3, b3), (s4, h4, b4) = responses.done
    assert (s1, s2, s3, s4) == (200, 200, 200, 200)
    assert h1[b"transfer-encoding"] == b"chunked" and b1.endswith(b"data: [DONE]\n\n")
    assert b'"finish_reason":"length"' in b1
    assert b"x-spec-router-pool" not in b2 and b2.strip()
    assert json.loads(b3)["usage"]["completion_tokens"] == 5
    assert int(h3[b"content-length"]) == len(b3)
    assert b'"finish_reason":"length"' in b4 and b4.endswith(b"data: [DONE]\n\n")
    assert h4[b"x-spec-router-pool"] in (b"speculative", b"baseline")
    wait_for(lambda: router_status(router.url)["in_flight"]["total"] == 0, timeout=2)
    assert router_status(router.url)["fast_path"]["direct_responses"] == 3


def test_a_client_that_leaves_with_a_request_pipelined_behind_a_stream_is_seen_leaving(
    start_router: RouterFactory,
) -> None:
    """uvicorn tells only the connection's newest request of a lost connection: the stream
    still under way in front of it must learn too (its lease released, counted as a client that
    left, no write to a closed transport in the log)."""
    router = start_router()
    host, port = router.url.removeprefix("http://").split(":")
    body = b'{"model": "sim", "max_tokens": 4000, "stream": true, "messages": [%s]}' % (
        b'{"role": "user", "content": "hi"}'
    )
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            post("/v1/chat/completions", body) + b"GET /health HTTP/1.1\r\nhost: router\r\n\r\n"
        )
        assert b"data: " in read_until_data(sock)
    wait_for(lambda: router_status(router.url)["in_flight"]["total"] == 0, timeout=5)
    wait_for(
        lambda: metric_value(metrics(router.url), "spec_router_client_disconnects_total") == 1,
        timeout=5,
    )
    assert router_status(router.url)["fast_path"]["direct_responses"] == 1
    router.stop()
    assert not [line for line in router.output if "Error" in line or "xception" in line]


def read_until_data(sock: socket.socket) -> bytes:
    seen = b""
    while b"data: " not in seen:
        data = sock.recv(1 << 16)
        assert data, "closed before the stream's first event"
        seen += data
    return seen


def test_a_body_still_on_its_way_holds_no_other_stream_back(
    start_router: RouterFactory,
) -> None:
    """A request whose body is still uploading is the client's time, not the router's work:
    a stream started meanwhile runs to its end; once the body is in, it is answered."""
    router = start_router()
    host, port = router.url.removeprefix("http://").split(":")
    body = b'{"model": "sim", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}'
    request = post("/v1/chat/completions", body)
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    with socket.create_connection((host, int(port))) as slow:
        slow.sendall(request[:-10])  # the head and all of the body but its last bytes
        stream = client.chat.completions.create(
            model="sim", messages=MESSAGES, max_tokens=64, stream=True
        )
        assert sum(1 for _ in stream) > 1
        slow.sendall(request[-10:])
        response = read_response(slow)
    assert response.status == 200
    assert json.loads(bytes(response.body))["usage"]["completion_tokens"] == 4
    wait_for(lambda: router_status(router.url)["in_flight"]["total"] == 0, timeout=2)
