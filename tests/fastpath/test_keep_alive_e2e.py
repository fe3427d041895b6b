"""The router's client keep-alive setting reaches its protocol, with one worker or several: an
idle client connection is closed once it has been idle for ``SPEC_ROUTER_CLIENT_KEEP_ALIVE``.
The keep-alive timer itself is tested in process (tests/fastpath/test_protocol.py)."""

from __future__ import annotations

import json
import re
import socket
import time
from urllib.parse import urlsplit

import pytest

from tests.conftest import RouterFactory
from tests.support.processes import Proc

KEEP_ALIVE = 0.5


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
