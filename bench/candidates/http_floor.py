"""Candidate: the floor of an HTTP-aware Python proxy -- what the router must do at least.

Where ``tcp_pipe`` moves bytes and knows nothing of HTTP, this one does the least a router that
counts requests can do, all of it from socket callbacks on uvloop with httptools (no task, no
coroutine, no ASGI):

- parses each request (httptools), reads its body and decodes it as JSON (the router reads its
  routing fields from the body);
- counts it in flight on its backend while it runs (one backend here: the decision is nil);
- forwards it on a kept-alive upstream connection from a per-backend pool, the request head
  rebuilt (hop-by-hop headers dropped);
- parses the response (httptools), sends its head on to the client, and re-frames each body
  chunk as it arrives (``len\\r\\n...\\r\\n``), as the router does.

No health, metrics, timeouts, retries, SSE tap, error shapes or limits: every one of those is
per-request or per-chunk work the router adds on top. So the distance between this candidate and
``tcp_pipe`` is what HTTP itself costs in Python, and between the router and this candidate what
the router's own features and layers cost (bench/results/overhead-harnesses.md).

``HTTP_FLOOR_WORK_US=N``: N microseconds of busy CPU per request, half when the request is
complete (where the router reads it and decides) and half when the response is (where it
accounts for it): the router's own per-request work as a plain cost, to find how much of it
this shape carries before the streaming tail against nginx opens (``http_floor_w*`` in
bench/overhead.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from typing import Any

import httptools
from _cli import serve_protocol

# half of HTTP_FLOOR_WORK_US, in seconds
HALF_WORK = float(os.environ.get("HTTP_FLOOR_WORK_US", "0")) / 2e6


def work() -> None:
    """Busy CPU for ``HALF_WORK`` seconds (nothing when it is 0)."""
    if HALF_WORK:
        end = time.perf_counter() + HALF_WORK
        while time.perf_counter() < end:
            pass


HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"host", b"te"}


class Backend:
    def __init__(self, host: str, port: int) -> None:
        self.addr = (host, port)
        self.hostport = f"{host}:{port}".encode()
        self.idle: list[Upstream] = []
        self.inflight = 0


class Parsing(asyncio.Protocol):
    """A connection whose bytes go to an httptools parser; unparseable bytes end it
    (``unparseable``). Both ends of both callback candidates are one."""

    transport: Any
    parser: Any

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.unparseable()

    def unparseable(self) -> None:
        self.transport.close()


class Upstream(Parsing):
    """One kept-alive connection to the backend; relays one response at a time to ``client``."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.transport: Any = None
        self.parser = httptools.HttpResponseParser(self)
        self.client: Client | None = None
        self.headers: list[bytes] = []
        self.chunked = False

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"transfer-encoding":
            self.chunked = True
        if lower not in HOP:
            self.headers.append(b"%s: %s\r\n" % (name, value))

    def on_headers_complete(self) -> None:
        client = self.client
        if client is None:
            return
        status = self.parser.get_status_code()
        framing = b"transfer-encoding: chunked\r\n"
        head = b"HTTP/1.1 %d OK\r\n%b%b\r\n" % (status, b"".join(self.headers), framing)
        self.headers = []
        client.transport.write(head)

    def on_body(self, body: bytes) -> None:
        client = self.client
        if client is not None:
            client.transport.write(b"%x\r\n%b\r\n" % (len(body), body))

    def on_message_complete(self) -> None:
        client, self.client = self.client, None
        self.chunked = False
        backend = self.backend
        backend.inflight -= 1
        backend.idle.append(self)
        if client is not None:
            client.transport.write(b"0\r\n\r\n")
            client.upstream = None
            work()

    def connection_lost(self, exc: Exception | None) -> None:
        backend = self.backend
        if self in backend.idle:
            backend.idle.remove(self)
        client, self.client = self.client, None
        if client is not None:
            backend.inflight -= 1
            client.transport.close()


class Client(Parsing):
    """One client connection: parses requests and hands each to an upstream connection."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.transport: Any = None
        self.parser = httptools.HttpRequestParser(self)
        self.upstream: Upstream | None = None
        self.url = b""
        self.headers: list[bytes] = []
        self.body: list[bytes] = []

    def unparseable(self) -> None:
        self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
        self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() not in HOP:
            self.headers.append(b"%s: %s\r\n" % (name, value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        work()
        body = b"".join(self.body)
        try:
            info = json.loads(body) if body else {}
        except ValueError:
            info = None
        if not isinstance(info, dict):
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            self._reset()
            return
        backend = self.backend
        method = self.parser.get_method()
        head = b"%b %b HTTP/1.1\r\nhost: %b\r\n%bcontent-length: %d\r\n\r\n" % (
            method,
            self.url,
            backend.hostport,
            b"".join(self.headers),
            len(body),
        )
        self._reset()
        backend.inflight += 1
        if backend.idle:
            up = backend.idle.pop()
            up.client = self
            self.upstream = up
            up.transport.write(head + body)
        else:
            asyncio.get_running_loop().create_task(self._connect(head + body))

    async def _connect(self, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        backend = self.backend
        try:
            _, up = await loop.create_connection(lambda: Upstream(backend), *backend.addr)
        except OSError:
            backend.inflight -= 1
            self.transport.close()
            return
        up.client = self
        self.upstream = up
        up.transport.write(request)

    def _reset(self) -> None:
        self.url = b""
        self.headers = []
        self.body = []

    def connection_lost(self, exc: Exception | None) -> None:
        up, self.upstream = self.upstream, None
        if up is not None and up.client is self:
            up.client = None
            up.transport.close()

    def pause_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.transport.resume_reading()


def clients_of(host: str, port: int) -> Callable[[], Client]:
    backend = Backend(host, port)
    return lambda: Client(backend)


if __name__ == "__main__":
    serve_protocol(clients_of, __doc__)
