"""The keep-alive timer of the router's protocol (router.fastpath.protocol): one timer per
connection, moved lazily, where uvicorn makes and cancels one per request. An idle connection
is closed once it has been idle for the whole keep-alive, never earlier, and never while a
request is being answered; the router's is ``CLIENT_KEEP_ALIVE``."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.conftest import RouterFactory
from tests.support.processes import Proc, spawn

KEEP_ALIVE = 0.5


@pytest.fixture
def server() -> Iterator[Proc]:
    proc = spawn(["-m", "tests.support.keepalive_server", str(KEEP_ALIVE)])
    try:
        yield proc
    finally:
        proc.stop()


def connect(proc: Proc) -> socket.socket:
    url = urlsplit(proc.url)
    sock = socket.create_connection((url.hostname, url.port), timeout=10)
    return sock


def ask(sock: socket.socket, path: str = "/") -> None:
    """One request, its whole answer read."""
    sock.sendall(b"GET %s HTTP/1.1\r\nhost: test\r\n\r\n" % path.encode())
    assert read_answer(sock) == b"ok"


def read_answer(sock: socket.socket) -> bytes:
    """A 200 with a content-length off the socket; its body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += receive(sock, data)
    head, body = data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 "), head
    length = int(re.search(rb"(?im)^content-length: *(\d+)", head)[1])  # type: ignore[index]
    while len(body) < length:
        body += receive(sock, data + body)
    assert len(body) == length, body
    return body


def receive(sock: socket.socket, so_far: bytes) -> bytes:
    chunk = sock.recv(4096)
    assert chunk, f"closed before the answer was whole: {so_far!r}"
    return chunk


def seconds_until_closed(sock: socket.socket) -> float:
    began = time.monotonic()
    assert sock.recv(4096) == b""  # (blocks until the server closes; the timeout fails it)
    return time.monotonic() - began


def test_an_idle_connection_is_closed_after_the_whole_keep_alive_from_its_last_answer(
    server: Proc,
) -> None:
    with connect(server) as sock:
        ask(sock)
        # The first answer's timer is still pending when the next request comes (0.3 s) and
        # fires while the connection is idle again, 0.2 s into its second wait: it must look
        # again, not close. (Waiting is the point: the timer's times are what is tested.)
        time.sleep(0.3)
        ask(sock)
        time.sleep(0.35)  # past the first answer's keep-alive, inside the second's
        ask(sock)
        waited = seconds_until_closed(sock)
    assert KEEP_ALIVE - 0.05 <= waited < KEEP_ALIVE + 1.0, waited


def test_a_request_answered_past_the_keep_alive_keeps_its_connection(server: Proc) -> None:
    with connect(server) as sock:
        ask(sock)
        ask(sock, "/slow")  # answered 1 s later: the timer fires while it is being answered
        ask(sock)
        waited = seconds_until_closed(sock)
    assert KEEP_ALIVE - 0.05 <= waited < KEEP_ALIVE + 1.0, waited


def test_a_connection_is_closed_when_idle_after_bytes_that_began_no_request(
    server: Proc,
) -> None:
    # A stray CRLF after an answer starts no request (no request deadline either): it must
    # not hold the connection open for good (found by review).
    with connect(server) as sock:
        ask(sock)
        sock.sendall(b"\r\n")
        waited = seconds_until_closed(sock)
    assert waited < KEEP_ALIVE + 1.0, waited


def test_a_connection_answered_before_its_body_is_in_is_closed_when_idle(server: Proc) -> None:
    # The proxy answers a 401 (no API key) or a 413 before reading the body, and keeps the
    # connection: answered, with the body never finished, it is idle (found by review).
    with connect(server) as sock:
        sock.sendall(b"POST /early HTTP/1.1\r\nhost: test\r\ncontent-length: 10\r\n\r\n12345")
        assert read_answer(sock) == b"ok"
        sock.sendall(b"67890")  # the rest of the body, after the answer
        waited = seconds_until_closed(sock)
    assert waited < KEEP_ALIVE + 1.0, waited


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_router_keeps_an_idle_client_connection_for_client_keep_alive(
    start_router: RouterFactory, workers: str
) -> None:
    router = start_router(serve_args=("--workers", workers), client_keep_alive=str(KEEP_ALIVE))
    body = json.dumps({"model": "sim", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 2}).encode()  # fmt: skip
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: router\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)
    )
    with connect(router) as sock:
        for _ in range(2):  # (the second on the same connection: it was kept)
            sock.sendall(request)
            assert json.loads(read_answer(sock))["choices"]
        waited = seconds_until_closed(sock)
    assert KEEP_ALIVE - 0.05 <= waited < KEEP_ALIVE + 1.0, waited
