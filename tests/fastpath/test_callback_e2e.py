"""Streams served from uvicorn's socket callbacks (``router.forward.callback``), end to end.

The README's command, ``uvicorn router.app:app``, with ``SPEC_ROUTER_CALLBACK_STREAMS`` on, in
front of the session's sims (real sockets, real clients). Each test holds the callback path to
what the proxy's coroutine guarantees: the same answer and accounting for a plain stream, the
OpenAI error shape for bad input, and every exit (the end, a client that leaves, an upstream
that dies, answers 5xx or goes silent, the router's shutdown) releasing the in-flight lease and
the upstream connection, with its metrics recorded. ``/router/status``'s
``fast_path.callback_streams`` shows which path served each.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.forward import callback
from tests.conftest import router_env
from tests.fastpath.test_fast_path_e2e import post, read_response
from tests.forward.test_queue_e2e import TIGHT, chat, hold_the_speculative_engine, queue_settings
from tests.support.bulk_upstream import BulkUpstream
from tests.support.http import metric_value, router_ready, router_status, wait_for
from tests.support.processes import Proc, free_port

STREAM = (
    b'{"model": "sim", "max_tokens": 8, "stream": true, '
    b'"messages": [{"role": "user", "content": "hi"}]}'
)


class Router:
    """``uvicorn router.app:app`` as a process, with its output kept."""

    def __init__(
        self, urls: tuple[str, str], *args: str, app: str = "router.app:app", **settings: str
    ) -> None:
        self.port = free_port()
        env = {
            **router_env(*urls, **settings),
            "PYTHONUNBUFFERED": "1",
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", app, "--port", str(self.port), *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self.output = ""
        wait_for(lambda: router_ready(self.url, every_pool=True) or self.proc.poll() is not None)
        assert self.proc.poll() is None, self.stop()

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.output, _ = self.proc.communicate(timeout=30)
        return self.output

    def status(self) -> dict[str, Any]:
        return router_status(self.url)

    def served(self) -> int:
        """Streams answered from callbacks so far."""
        return int(self.status()["fast_path"]["callback_streams"])

    def handed(self) -> int:
        """Streams taken there, then handed to the proxy's coroutine."""
        return int(self.status()["fast_path"]["callback_handed"])

    def metric(self, name: str, **labels: str) -> float:
        return metric_value(httpx.get(f"{self.url}/metrics", timeout=5).text, name, **labels)

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port))

    def settled(self) -> Callable[[], bool]:
        """Nothing in flight, no upstream connection busy."""

        def check() -> bool:
            status = self.status()
            busy = [
                backend["connections"]["busy"]
                for pool in status["pools"].values()
                for backend in pool["backends"]
            ]
            return status["in_flight"]["total"] == 0 and not any(busy)

        return check


@pytest.fixture
def router(sims: dict[str, Proc]) -> Iterator[Router]:
    proc = Router(
        (sims["speculative"].url, sims["baseline"].url),
        "--no-access-log",
        callback_streams="true",
        first_byte_timeout="1",
        idle_timeout="1",
        scrape_metrics="false",
    )
    try:
        yield proc
    finally:
        proc.stop()


def urls_of(sims: dict[str, Proc]) -> tuple[str, str]:
    return sims["speculative"].url, sims["baseline"].url


def on_callbacks(urls: tuple[str, str], app: str = "router.app:app", **settings: str) -> Router:
    """``uvicorn`` with the callback path on, in front of ``urls`` (speculative, baseline)."""
    return Router(
        urls, "--no-access-log", app=app, callback_streams="true", scrape_metrics="false",
        **settings,
    )  # fmt: skip


def stream(router: Router, body: bytes = STREAM, *extra: bytes) -> tuple[Any, bytes]:
    """One request on a connection of its own: the response and its body."""
    with router.connect() as sock:
        sock.sendall(post("/v1/chat/completions", body, *extra))
        response = read_response(sock)
    return response, bytes(response.body)


def warm(router: Router) -> None:
    """One stream, which leaves an upstream connection idle: later ones find it and take the
    callback path. (With ``callback_connect`` off, the stream before any is idle is handed to
    the proxy's coroutine.)"""
    response, body = stream(router)
    assert response.status == 200 and body.endswith(b"data: [DONE]\n\n")


def events(body: bytes) -> list[bytes]:
    return [e for e in body.split(b"\n\n") if e]


def test_a_plain_stream_is_served_from_callbacks_as_the_coroutine_serves_it(
    router: Router, sims: dict[str, Proc]
) -> None:
    warm(router)
    before = router.served()
    response, body = stream(router)
    assert router.served() == before + 1
    assert response.status == 200
    assert response.headers[b"x-spec-router-pool"] in (b"speculative", b"baseline")
    assert response.headers[b"content-type"].startswith(b"text/event-stream")
    assert response.headers[b"transfer-encoding"] == b"chunked"
    chunks = events(body)
    assert chunks[-1] == b"data: [DONE]"
    # the usage the router asked for on the client's behalf is counted, and not passed on
    assert not any(b'"usage":{' in c for c in chunks)
    # and passed on when the client asked for it
    asked = STREAM.replace(b'"stream": true', b'"stream": true, "stream_options": '
                           b'{"include_usage": true}')  # fmt: skip
    response, body = stream(router, asked)
    assert any(b'"usage":{' in c for c in events(body))
    assert router.served() == before + 2
    wait_for(router.settled())
    assert router.metric("spec_router_requests_total", code="200") == 3
    assert router.metric("spec_router_output_tokens_total") == 3 * 8
    assert router.status()["recent"]["within_slo"]["all"]["judged"] == 3


def test_keep_alive_and_pipelined_streams_are_answered_in_order(router: Router) -> None:
    warm(router)
    before = router.served()
    with router.connect() as sock:
        for _ in range(2):  # one after another on the connection
            sock.sendall(post("/v1/chat/completions", STREAM))
            assert bytes(read_response(sock).body).endswith(b"data: [DONE]\n\n")
        # two at once: the second waits for the first, as uvicorn queues it
        sock.sendall(post("/v1/chat/completions", STREAM) * 2)
        data = b""
        while data.count(END) < 2:
            chunk = sock.recv(1 << 16)
            assert chunk, "closed before both responses were complete"
            data += chunk
    assert data.count(b"HTTP/1.1 200 OK\r\n") == 2 and data.endswith(END)
    assert router.served() >= before + 3
    wait_for(router.settled())


# the end of a stream's response: its last event and the chunked body's end
END = b"data: [DONE]\n\n\r\n0\r\n\r\n"


def test_connection_close_and_head_take_uvicorns_path(router: Router) -> None:
    warm(router)
    before = router.served()
    with router.connect() as sock:
        sock.sendall(post("/v1/chat/completions", STREAM, b"connection: close\r\n"))
        response = read_response(sock)
        assert sock.recv(1) == b""
    assert response.status == 200 and response.headers[b"connection"] == b"close"
    with router.connect() as sock:  # a HEAD is answered with no body, and kept alive
        sock.sendall(b"HEAD /v1/chat/completions HTTP/1.1\r\nhost: router\r\n\r\n")
        head = sock.recv(1 << 16)
        assert head.startswith(b"HTTP/1.1 ") and head.endswith(b"\r\n\r\n")
        sock.sendall(post("/v1/chat/completions", STREAM))
        assert bytes(read_response(sock).body).endswith(b"data: [DONE]\n\n")
    assert router.served() == before + 1  # (the POST after it)


@pytest.mark.parametrize(
    "body, status",
    [
        (b"{not json", 400),
        (b'{"model": 3, "stream": true, "messages": []}', 400),
        (b"[1, 2]", 400),
        (b"", 400),
    ],
)
def test_bad_input_gets_the_openai_error_shape(router: Router, body: bytes, status: int) -> None:
    warm(router)
    response, answer = stream(router, body)
    assert response.status == status
    error = json.loads(answer)["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    wait_for(router.settled())


def test_a_client_that_leaves_mid_stream_releases_everything(router: Router) -> None:
    warm(router)
    before, handed = router.served(), router.handed()
    long = STREAM.replace(b'"max_tokens": 8', b'"max_tokens": 4000')
    with router.connect() as sock:
        sock.sendall(post("/v1/chat/completions", long))
        assert sock.recv(1 << 16).startswith(b"HTTP/1.1 200")
    wait_for(router.settled())
    assert router.metric("spec_router_client_disconnects_total") == 1
    assert router.served() == before  # (counted as left, not served)
    assert router.handed() == handed  # (it was the callbacks' to the end)
    warm(router)  # and the router goes on serving


def test_an_upstream_that_dies_mid_stream_ends_it_with_an_error_event(router: Router) -> None:
    warm(router)
    before = router.served()
    response, body = stream(router, STREAM, b"x-sim-fault: reset_after=3\r\n")
    assert router.served() == before + 1
    assert response.status == 200
    last = events(body)[-1]
    assert last.startswith(b"data: ") and b"upstream failed mid-stream" in last
    wait_for(router.settled())
    assert router.metric("spec_router_upstream_errors_total", kind="reset") == 1


def test_an_upstream_that_goes_silent_mid_stream_times_out(router: Router) -> None:
    warm(router)
    before = router.served()
    response, body = stream(router, STREAM, b"x-sim-fault: hang_after=2\r\n")
    assert router.served() == before + 1
    assert response.status == 200
    assert b"upstream failed mid-stream" in events(body)[-1]
    wait_for(router.settled())
    assert router.metric("spec_router_upstream_errors_total", kind="idle_timeout") == 1


def test_an_upstream_that_never_answers_gets_a_504(router: Router) -> None:
    warm(router)
    handed = router.handed()
    response, body = stream(router, STREAM, b"x-sim-fault: hang_before_headers\r\n")
    assert router.handed() == handed + 1  # (the attempt's failure: the coroutine's to answer)
    assert response.status == 504
    assert json.loads(body)["error"]["message"]
    wait_for(router.settled())
    assert router.metric("spec_router_upstream_errors_total", kind="first_byte_timeout") == 1


def test_an_upstream_500_is_passed_on_and_a_503_retried_elsewhere(router: Router) -> None:
    warm(router)
    handed = router.handed()
    response, body = stream(router, STREAM, b"x-sim-fault: status=500\r\n")
    assert router.handed() == handed + 1
    assert response.status == 500
    assert json.loads(body)  # (the engine's own error, passed on)
    wait_for(router.settled())
    # a refusal goes to the other pool (the sim refuses every request with the header)
    response, body = stream(router, STREAM, b"x-sim-fault: status=503\r\n")
    assert response.status == 503
    assert json.loads(body)
    wait_for(router.settled())
    assert router.metric("spec_router_retries_total", kind="http_503") == 1
    assert router.metric("spec_router_upstream_errors_total", kind="http_500") == 1


def test_a_stream_under_way_ends_whole_at_the_routers_shutdown(router: Router) -> None:
    warm(router)
    before = router.served()
    long = STREAM.replace(b'"max_tokens": 8', b'"max_tokens": 200')
    with router.connect() as sock:
        sock.sendall(post("/v1/chat/completions", long))
        first = sock.recv(1 << 16)
        assert first.startswith(b"HTTP/1.1 200")
        assert router.served() == before  # (still under way)
        router.proc.send_signal(signal.SIGTERM)
        rest = b""
        while chunk := sock.recv(1 << 16):
            rest += chunk
    assert (first + rest).endswith(END)
    # (uvicorn >= 0.29 re-raises the signal it caught once it has shut down)
    assert router.proc.wait(timeout=30) in (0, -signal.SIGTERM)


def test_with_an_access_log_streams_take_uvicorns_path(sims: dict[str, Proc]) -> None:
    urls = (sims["speculative"].url, sims["baseline"].url)
    router = Router(urls, "--access-log", callback_streams="true", log_level="info")
    try:
        for _ in range(3):
            assert stream(router)[0].status == 200
        assert router.served() == 0
    finally:
        output = router.stop()
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in output
    assert "plain streams served from the protocol's callbacks" in output


def test_a_client_that_stops_reading_gets_every_byte_once_it_reads_again() -> None:
    """Checklist case 19 on the callback path: the sink stops at the client's back-pressure,
    the upstream connection stops reading, and the rest goes out as the client takes it."""
    # (larger than every buffer between the two: the kernel's, up to a few MiB, and the
    # router's own high-water mark)
    with BulkUpstream(size=1024, events=20_000).running() as bulk:
        with BulkUpstream(size=10, events=1).running() as idle:
            router = on_callbacks((bulk.url, idle.url))
            try:
                assert stream(router)[1] == bulk.body  # (leaves an idle upstream connection)
                before = router.served()
                with socket.socket() as sock:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    sock.connect(("127.0.0.1", router.port))
                    sock.sendall(post("/v1/chat/completions", STREAM))
                    wait_for(lambda: router.metric("spec_router_slow_client_requests") == 1)
                    response = read_response(sock)
                assert response.status == 200
                assert bytes(response.body) == bulk.body  # every byte, in order, once
                assert router.served() == before + 1
                wait_for(router.settled())
                assert router.metric("spec_router_slow_client_responses_total") == 1
            finally:
                router.stop()


def test_an_upstream_that_refuses_by_closing_is_retried_then_refused(router: Router) -> None:
    """The kept-alive connection the callbacks sent on is closed before a byte came back:
    sent again on a fresh one (as ``OriginPool.request`` does), then elsewhere, then a 503
    in the OpenAI shape once every backend refused."""
    warm(router)
    handed = router.handed()
    response, body = stream(router, STREAM, b"x-sim-fault: close\r\n")
    assert router.handed() == handed + 1
    assert response.status == 503
    assert json.loads(body)["error"]["message"]
    wait_for(router.settled())
    assert router.metric("spec_router_retries_total", kind="reset") == 1


def test_it_is_on_by_default_and_off_with_the_setting(sims: dict[str, Proc]) -> None:
    urls = (sims["speculative"].url, sims["baseline"].url)
    cases: list[tuple[dict[str, str], int, int]] = [
        ({}, 3, 0),  # (the first finds no idle upstream connection: the callbacks open one)
        ({"callback_connect": "false"}, 2, 1),  # (... and it is handed to the coroutine)
        ({"callback_streams": "false"}, 0, 0),
    ]
    for extra, served, handed in cases:
        router = Router(urls, "--no-access-log", scrape_metrics="false", **extra)
        try:
            for _ in range(3):
                assert stream(router)[0].status == 200
            assert (router.served(), router.handed()) == (served, handed)
        finally:
            router.stop()


class EndingUpstream(BulkUpstream):
    """A bulk upstream that tells the test when a stream's last byte left its buffer."""

    def __init__(self) -> None:
        super().__init__(size=1024)
        self.flushed = threading.Event()

    async def post(self, head: bytes, writer: asyncio.StreamWriter) -> bool:
        self.flushed.clear()
        kept = await super().post(head, writer)
        await writer.drain()
        self.flushed.set()
        return kept


def test_a_slow_client_that_leaves_after_the_upstream_ended_frees_its_connection_once() -> None:
    """Review B1: the slow-client task owns the upstream connection. The client stops reading
    (the task waits in uvicorn's ``send``), the upstream ends, the client goes: the connection
    goes back to the pool only once the task has ended, so the next stream on the same upstream
    is whole, nothing stays in flight, and no task is left for the shutdown to wait on.
    (The race itself is one loop iteration wide; this runs the same sequence over sockets.)"""
    with EndingUpstream().running() as bulk:
        with BulkUpstream(size=10, events=1).running() as idle:
            router = on_callbacks((bulk.url, idle.url))
            try:
                bulk.events = 40
                assert stream(router)[1] == bulk.body  # (leaves an idle upstream connection)
                bulk.events = None  # (open-ended: until finish())
                with socket.socket() as sock:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    sock.connect(("127.0.0.1", router.port))
                    sock.sendall(post("/v1/chat/completions", STREAM))
                    wait_for(lambda: router.metric("spec_router_slow_client_requests") == 1)
                    bulk.finish()
                    sock.setblocking(False)
                    while not bulk.flushed.is_set():  # (read just enough for the end to go out)
                        try:
                            sock.recv(1 << 16)
                        except BlockingIOError:
                            bulk.flushed.wait(0.01)
                    # leave with a reset, the rest unread
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                wait_for(router.settled())
                assert router.metric("spec_router_client_disconnects_total") == 1
                bulk.events = 40
                posts = bulk.posts
                for _ in range(3):  # (on the connection the slow stream had, if it goes there)
                    response, body = stream(router)
                    assert response.status == 200
                    assert body == (bulk.body if bulk.posts > posts else idle.body)
                    posts = bulk.posts
                wait_for(router.settled())
                router.proc.send_signal(signal.SIGTERM)
                assert router.proc.wait(timeout=30) in (0, -signal.SIGTERM)
            finally:
                router.stop()


@pytest.mark.parametrize("fault", ["send", "answer"])
def test_a_bug_before_the_answer_gets_a_500_and_releases_once(
    sims: dict[str, Proc], fault: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review S3/S4: a bug in a callback before anything was written answers a 500 in the
    OpenAI error shape (not a closed socket), releases the lease and the upstream connection,
    and counts the request once (no second release or report when the client then goes)."""
    monkeypatch.setenv("CALLBACK_TEST_FAULT", fault)  # (router_env passes it on)
    router = on_callbacks(
        # (a first stream through the coroutine, which leaves a connection idle: the fault
        # then strikes with one taken; with one the callbacks open: test_callback_connect_e2e)
        urls_of(sims),
        app="tests.support.callback_faults:app",
        callback_connect="false",
    )
    try:
        warm(router)
        wait_for(router.settled())
        before = router.metric("spec_router_requests_total")
        response, body = stream(router)
        assert response.status == 500
        error = json.loads(body)["error"]
        assert error["type"] == "server_error" and error["message"]
        wait_for(router.settled())
        assert router.metric("spec_router_requests_total") == before + 1
        assert router.metric("spec_router_requests_total", code="500") == 1
    finally:
        output = router.stop()
    assert "a planted bug" in output


def test_a_body_over_max_body_bytes_gets_the_413_the_coroutine_answers(
    sims: dict[str, Proc],
) -> None:
    """Review S1: ``max_body_bytes`` holds on the callback path too."""
    router = on_callbacks(urls_of(sims), max_body_bytes="4096")
    try:
        warm(router)
        served = router.served()
        big = STREAM.replace(b'"hi"', b'"' + b"x" * 10_240 + b'"')
        response, body = stream(router, big)
        assert response.status == 413
        error = json.loads(body)["error"]
        assert error["type"] == "invalid_request_error" and error["message"]
        assert router.served() == served
        wait_for(router.settled())
        assert stream(router)[0].status == 200  # (a body under it still streams)
    finally:
        router.stop()


@pytest.mark.anyio
@pytest.mark.parametrize("connect", ["true", "false"])
async def test_an_overflow_sent_on_is_counted_once(
    own_sims: dict[str, Proc], tmp_path: Path, connect: str
) -> None:
    """Review S2: an overflowing stream the queue does not hold, with no idle upstream
    connection for it (the callbacks open one, or it is handed to the coroutine), counts one
    ``sent_fine``, not two. (The queue tests' overflow, as a stream, on
    ``uvicorn router.app:app``.)"""
    router = on_callbacks(
        urls_of(own_sims),
        **queue_settings(tmp_path),
        max_idle_per_backend="0",  # (no idle upstream connection, ever)
        callback_connect=connect,
    )
    try:
        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                httpx.AsyncClient(base_url=router.url, timeout=30)
            )
            held = await hold_the_speculative_engine(stack, client)
            handed = router.handed()
            # (a raw socket: head and body in one write, as the callback path takes them)
            tight = b"x-slo-tpot-ms: %s\r\n" % TIGHT["x-slo-tpot-ms"].encode()
            body = json.dumps(chat(8, True)).encode()
            response, answer = await asyncio.to_thread(stream, router, body, tight)
            assert response.status == 200 and answer.endswith(b"data: [DONE]\n\n")
            assert response.headers[b"x-spec-router-reason"] == b"overflow"
            # (no idle connection there: opened from the callbacks, or handed on)
            assert router.handed() == handed + (connect == "false")
            queue = router.status()["queue"]
            assert queue["sent_fine"] == 1 and queue["sent_changing"] == 0
            assert router.metric("spec_router_queue_sent_on_total", why="measured_fine") == 1
            del held
    finally:
        router.stop()


def test_a_backend_removed_while_a_stream_waits_for_its_head_answers(
    sims: dict[str, Proc],
) -> None:
    """Review S5: the stream keeps the pool it was sent on. A backend removed through the
    admin API while a callback stream waits for its first byte is cut at the drain timeout:
    the stream goes to the proxy's coroutine (a retry elsewhere, or its error in the OpenAI
    shape), never a closed socket, and nothing stays in flight."""
    router = on_callbacks(
        urls_of(sims), first_byte_timeout="3", drain_timeout="0.3", admin_token="secret"
    )
    try:
        warm(router)
        wait_for(router.settled())
        handed = router.handed()
        with router.connect() as sock:
            sock.sendall(
                post("/v1/chat/completions", STREAM, b"x-sim-fault: hang_before_headers\r\n")
            )

            def busy() -> tuple[str, str] | None:
                for name, pool in router.status()["pools"].items():
                    for backend in pool["backends"]:
                        if backend["connections"]["busy"]:
                            return name, backend["url"]
                return None

            found = wait_for(busy)
            assert found is not None
            pool, url = found
            r = httpx.delete(
                f"{router.url}/router/pools/{pool}/backends",
                params={"url": url},
                headers={"authorization": "Bearer secret"},
                timeout=5,
            )
            assert r.status_code == 202
            response = read_response(sock)  # (not EOF)
        assert router.handed() == handed + 1  # (the cut attempt: the coroutine's to go on with)
        if response.status != 200:
            assert response.status >= 500
            assert json.loads(bytes(response.body))["error"]["message"]
        wait_for(router.settled())
    finally:
        router.stop()


def test_the_path_is_off_where_uvicorns_cycle_takes_other_parameters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review N2: a uvicorn whose cycle no longer takes what the path passes it gets no
    callback streams (said in the log), not a 400 for every POST to /v1/."""
    assert callback.callback_ready()

    class Drifted:
        def __init__(self, scope: Any, transport: Any, flow: Any) -> None: ...

    monkeypatch.setattr(callback, "_CYCLE", Drifted)
    assert not callback.callback_ready()
    assert callback.callback_protocol(callback.CallbackStreams()) is None
