"""The keep-alive timer of the router's protocol (router.fastpath.protocol): one timer per
connection, moved lazily, where uvicorn makes and cancels one per request. An idle connection
is closed once it has been idle for the whole keep-alive, never earlier, and never while a
request is being answered."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

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
    """One request, its whole answer read (the server's answers are 2-byte bodies)."""
    sock.sendall(b"GET %s HTTP/1.1\r\nhost: test\r\n\r\n" % path.encode())
    data = b""
    while not data.endswith(b"\r\n\r\nok"):
        chunk = sock.recv(4096)
        assert chunk, f"closed before the answer was whole: {data!r}"
        data += chunk
    assert data.startswith(b"HTTP/1.1 200 "), data


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
