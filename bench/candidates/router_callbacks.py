"""Candidate: the router's own per-request work, in ``http_floor``'s shape (callbacks only).

A measurement, not a server to run: would a router whose request path ran from socket
callbacks, as ``http_floor`` does, close the streaming tail against nginx with everything the
router must do per request? (issue 14; bench/results/overhead-harnesses.md.) It is
``http_floor`` with the router's own code for each step, called as the proxy calls it, from a
``RouterApp`` built as ``spec-router serve`` builds it:

- the path check and the body's routing fields (``check_path``, ``inspect``);
- the decision with its lease and the request's ``Outcome`` (``Decider``, ``InflightTracker``);
- the upstream request's headers and body (``forward_headers``, ``upstream_body``: the router
  asks a stream for usage);
- the response's verdict, the backend's health (``verdicts.after_status``), its head
  (``response_headers`` and the router's two headers), held back until the first body bytes
  (the router waits for a stream's first event before it answers);
- the first-byte accounting, the SSE tap on every chunk (usage counted, the usage event the
  router asked for stripped), and at the end every observer (metrics, learner, recent window).

What it leaves out is what runs only off the common path: retries, queueing, timeouts,
client disconnects mid-stream, slow clients, error shapes beyond a plain 400/503. Both pools
are the one upstream (``--upstream``; the baseline under the name ``localhost``), so the
decision has two pools to choose from. The health poller does not run: both are marked
healthy at the start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httptools
from _cli import serve_protocol
from http_floor import Parsing

from router.account.outcome import Outcome
from router.app import RouterApp
from router.errors import BadRequest, NoBackend, RouterError
from router.forward.request import (
    check_path,
    forward_headers,
    inspect,
    response_headers,
    upstream_body,
)
from router.pools import POOLS
from router.settings import Settings
from router.upstream import verdicts
from router.upstream.stream import SseTap

USAGE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


class Router:
    """The router's state and the per-request steps that do not touch a socket."""

    def __init__(self, host: str, port: int) -> None:
        spec, base = f"http://{host}:{port}", f"http://localhost:{port}"
        self.app = app = RouterApp(Settings(speculative_urls=[spec], baseline_urls=[base]))
        now = app.clock()
        for url in (spec, base):
            for _ in range(app.settings.rise + 1):
                app.health.probe(url, True, now)
        self.addr = {spec: (host, port), base: (host, port)}
        self.hostport = {url: url.split("//", 1)[1].encode() for url in (spec, base)}
        self.idle: dict[str, list[Upstream]] = {spec: [], base: []}
        self.pool_auth = {p: app.settings.pool_authorization(p) for p in POOLS}


class Exchange:
    """One proxied request, from its decision to its last byte."""

    __slots__ = ("client", "out", "lease", "decision", "tap", "head", "info", "up")

    def __init__(self, client: Client, out: Outcome, lease: Any, decision: Any, info: Any) -> None:
        self.client, self.out, self.lease, self.decision, self.info = (
            client,
            out,
            lease,
            decision,
            info,
        )
        self.tap: SseTap | None = None
        self.head: bytes | None = None
        self.up: Upstream | None = None


class Upstream(Parsing):
    """One kept-alive connection to a backend, carrying one exchange at a time."""

    def __init__(self, router: Router, url: str) -> None:
        self.router, self.url = router, url
        self.transport: Any = None
        self.parser = httptools.HttpResponseParser(self)
        self.ex: Exchange | None = None
        self.headers: list[tuple[bytes, bytes]] = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        ex = self.ex
        if ex is None:
            return
        router, out, decision = self.router, ex.out, ex.decision
        status = self.parser.get_status_code()
        out.answered(status)
        verdict = verdicts.after_status(status)
        if verdict.served:
            router.app.health.served(decision.backend, router.app.clock())
        raw, self.headers = self.headers, []
        ctype = next((v for k, v in raw if k == b"content-type"), b"")
        sse = ctype.startswith(b"text/event-stream")
        strip = ex.info.stream and out.path in USAGE_PATHS and ex.info.add_usage
        ex.tap = SseTap(strip_usage=strip) if sse else None
        headers = response_headers(raw, False)
        headers.append((b"x-spec-router-pool", decision.pool.encode()))
        headers.append((b"x-spec-router-reason", decision.reason.encode()))
        lines = b"".join(b"%s: %s\r\n" % kv for kv in headers)
        ex.head = b"HTTP/1.1 %d OK\r\n%btransfer-encoding: chunked\r\n\r\n" % (status, lines)

    def on_body(self, body: bytes) -> None:
        ex = self.ex
        if ex is None:
            return
        out = ex.out
        if out.first_byte is None:
            tracker, backend = self.router.app.tracker, ex.lease.backend
            now = self.router.app.clock()
            out.first_bytes(now, tracker.area(backend, now), tracker.started[backend])
        if ex.tap is not None:
            body = ex.tap.feed(body)
        framed = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
        if ex.head is not None:
            framed, ex.head = ex.head + framed, None
        if framed:
            ex.client.transport.write(framed)

    def on_message_complete(self) -> None:
        ex, self.ex = self.ex, None
        self.router.idle[self.url].append(self)
        if ex is None:
            return
        tail = ex.head or b""
        if ex.tap is not None:
            rest = ex.tap.flush()
            if rest:
                tail += b"%x\r\n%b\r\n" % (len(rest), rest)
            ex.out.counted(ex.tap.usage)
        ex.client.transport.write(tail + b"0\r\n\r\n")
        ex.client.finish(ex)

    def connection_lost(self, exc: Exception | None) -> None:
        idle = self.router.idle[self.url]
        if self in idle:
            idle.remove(self)
        ex, self.ex = self.ex, None
        if ex is not None:
            ex.out.broke("reset")
            ex.client.transport.close()
            ex.client.finish(ex)


class Client(Parsing):
    """One client connection: parses its requests and routes each one."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.transport: Any = None
        self.peer: str | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.ex: Exchange | None = None
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if peer else None

    def unparseable(self) -> None:
        self._answer(BadRequest("invalid HTTP request"))
        self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        router = self.router
        app = router.app
        body = b"".join(self.body)
        headers, self.headers, self.body = self.headers, [], []
        url, self.url = self.url, b""
        path = url.split(b"?", 1)[0].decode("latin-1")
        out = Outcome(path=path, started=app.clock())
        try:
            check_path(path)
            ctype = next((v for k, v in headers if k == b"content-type"), None)
            info = inspect(path, body, ctype)
        except RouterError as exc:
            out.answered(exc.status)
            self._answer(exc)
            self._observe(out)
            return
        out.read(info.stream, info.sampling, info.prompt_chars)
        decider = app.decider
        request = decider.request(info) if decider.policy == "slo" else None
        out.request = request
        decision = decider.decide(request)
        if decision is None:
            out.answered(503)
            self._answer(NoBackend("no backend can take requests right now", 1))
            self._observe(out)
            return
        lease = app.tracker.acquire(decision.backend, out if request is not None else None)
        out.attempt(
            decision.pool,
            decision.backend,
            decision.reason,
            decision.load,
            decision.prefill_share,
            app.tracker.started[decision.backend],
            decision.prefill,
        )
        ask_usage = info.stream and path in USAGE_PATHS
        fwd = forward_headers(headers, self.peer, router.pool_auth[decision.pool], False, False)
        payload = upstream_body(
            info, body, app.settings.pool_model_map(decision.pool), ask_usage, None
        )
        lines = b"".join(b"%s: %s\r\n" % kv for kv in fwd)
        backend = decision.backend
        method = self.parser.get_method()
        head = b"%b %b HTTP/1.1\r\nhost: %b\r\n%bcontent-length: %d\r\n\r\n" % (
            method,
            url,
            router.hostport[backend],
            lines,
            len(payload),
        )
        ex = self.ex = Exchange(self, out, lease, decision, info)
        idle = router.idle[backend]
        if idle:
            up = idle.pop()
            up.ex, ex.up = ex, up
            up.transport.write(head + payload)
        else:
            asyncio.get_running_loop().create_task(self._connect(ex, head + payload))

    async def _connect(self, ex: Exchange, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        router, backend = self.router, ex.lease.backend
        try:
            _, up = await loop.create_connection(
                lambda: Upstream(router, backend), *router.addr[backend]
            )
        except OSError:
            ex.out.broke("connect")
            self.transport.close()
            self.finish(ex)
            return
        up.ex, ex.up = ex, up
        up.transport.write(request)

    def finish(self, ex: Exchange) -> None:
        if self.ex is ex:
            self.ex = None
        ex.lease.release()
        self._observe(ex.out)

    def _observe(self, out: Outcome) -> None:
        out.finish(self.router.app.clock())
        for observe in self.router.app.observers:
            observe(out)

    def _answer(self, exc: RouterError) -> None:
        body = exc.body()
        status = exc.status
        self.transport.write(
            b"HTTP/1.1 %d Error\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
            % (status, len(body), body)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        ex, self.ex = self.ex, None
        if ex is None:
            return
        ex.out.client_left()
        if ex.up is not None:  # aborted: its connection_lost ends the exchange
            ex.up.transport.close()

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass


def clients_of(host: str, port: int) -> Callable[[], Client]:
    router = Router(host, port)
    return lambda: Client(router)


if __name__ == "__main__":
    serve_protocol(clients_of, __doc__)
