"""Streams served from uvicorn's socket callbacks: no ASGI task, no coroutine per request.

Under ``uvicorn router.app:app`` every request is an ASGI cycle with its task, and a stream's
proxy handler is a coroutine woken for its head, its first event and its end. Under tail.py's
waves of streams that per-request Python is most of the router's distance to nginx
(``bench/results/fast-path.md``, sessions 8-10). Here the router's protocol (``lean``) serves a
plain streamed completion from the parser's and the upstream connection's callbacks:

- at the request's head it makes uvicorn's own cycle for it (the scope as uvicorn makes it)
  without starting its task; a request that is not plain (not a POST to ``/v1/``, a body
  not in the same read as its head, forwarded headers, ``expect``, a pipelined one, access
  logging on, ...) is started as uvicorn starts it, before anything of it was looked at;
- once its body is in: the proxy's own checks and body fields, its decision, its lease and
  ``Outcome``; the request goes out on a kept-alive upstream connection whose wake-ups call
  this exchange (``Connection.listen``) instead of a coroutine; where none is idle, on one it
  opens (``SPEC_ROUTER_CALLBACK_CONNECT``: a task for the connect alone, then callbacks again);
- the stream's head and first event are judged as the proxy judges them; a plain 200 stream
  is answered (the start and first bytes in one write, as ``DirectSend`` writes them), and its
  body goes straight from the upstream's socket callback to the client (``chunk_sink``);
- its end, a failure mid-stream (an SSE error event), a client that leaves (uvicorn marks the
  cycle, ``DirectSend.watch``) end it: upstream connection released or aborted, lease
  released, the ``Outcome`` to the observers (``Proxy.finish``).

Anything off that path goes to the proxy's coroutine, from where the callbacks left it
(``Proxy.resume``) and on uvicorn's cycle, so it is served exactly as every other request:
a request that is not a stream or fails its checks (from scratch), no backend, a queue, a
per-pool model name, no idle upstream connection with ``SPEC_ROUTER_CALLBACK_CONNECT`` off or
the pool at its ``MAX_CONNECTIONS_PER_BACKEND`` (before the lease), a connect that failed,
any answer but a plain 200 stream whose first event is not a refusal, a failure before it
(after the attempt: its verdict, retries, the client's error), a slow client (the rest of the
body, read and sent).

On by default (``SPEC_ROUTER_CALLBACK_STREAMS``): bench/results/fast-path.md, session 10.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from inspect import signature
from typing import TYPE_CHECKING, Any

import httptools

from router.account.outcome import Outcome
from router.errors import NoBackend, RouterError, sse_error_event
from router.fastpath.responder import chunk_sink, chunk_whole
from router.fastpath.uvicorn import DirectSend, plain_head, plain_head_ready
from router.forward.proxy import (
    USAGE_PATHS,
    Attempt,
    Proxy,
    _deciding_as_header,
    _predicted,
    _send_error,
    slo_headers,
)
from router.forward.request import (
    check_path,
    forward_headers,
    inspect,
    response_headers,
    upstream_body,
)
from router.upstream import verdicts
from router.upstream.client import Connection, OriginPool, UpstreamError
from router.upstream.stream import MAX_PEEK, SseTap, first_event_refusal

if TYPE_CHECKING:
    from router.account.inflight import Lease
    from router.decide.policy import Decision
    from router.decide.predict import Request
    from router.forward.request import RequestInfo

log = logging.getLogger("spec_router.fastpath")

# The largest body taken with its head: uvicorn pauses reading past its high-water mark
# (64 KiB) for a ``receive()`` that would resume it, and here there is none.
MAX_BODY = 60 * 1024
# Request headers that send a request the ASGI way: uvicorn's proxy-headers middleware reads
# the forwarded ones, ``expect`` asks uvicorn for a 100, a chunked body may trickle.
_NOT_PLAIN = frozenset(
    {b"x-forwarded-for", b"x-forwarded-proto", b"forwarded", b"expect", b"transfer-encoding"}
)

App = Callable[[Any, Any, Any], Awaitable[None]]


class CallbackStreams:
    """What the callback path needs of the router: its proxy (once it runs), and counts."""

    __slots__ = ("proxy", "served", "handed", "connected", "busy")

    def __init__(self) -> None:
        self.proxy: Proxy | None = None
        self.served = 0  # streams answered from callbacks
        self.handed = 0  # taken, then handed to the proxy's coroutine
        self.connected = 0  # upstream connections this path opened (none was idle, or stale)
        # told of each request taken in (the deferred accounting's turn is then not a quiet
        # one; only this path tells it)
        self.busy: Callable[[], None] | None = None

    def status(self) -> dict[str, int]:
        return {
            "callback_streams": self.served,
            "callback_handed": self.handed,
            "callback_connected": self.connected,
        }


class _CallbackRequests:
    """Mixed into the router's uvicorn protocol (``router.fastpath.lean``)."""

    streams: CallbackStreams  # (set on the class lean_protocol makes)
    # (attributes of uvicorn's protocol this relies on)
    loop: asyncio.AbstractEventLoop
    transport: Any
    flow: Any
    parser: Any
    cycle: Any
    scope: Any
    url: bytes
    headers: list[tuple[bytes, bytes]]
    pipeline: Any
    app: Any
    tasks: set[asyncio.Task[None]]
    root_path: str
    limit_concurrency: int | None
    access_log: bool
    access_logger: Any
    logger: Any
    server_state: Any
    expect_100_continue: bool
    on_response_complete: Callable[[], None]

    _taken: Any = None  # the cycle of a request this path took, until its body is in

    def on_headers_complete(self) -> None:
        if not self._plain_head():
            super().on_headers_complete()  # type: ignore[misc]
            return
        # uvicorn's on_headers_complete, for a POST over HTTP/1.1 without an upgrade, when
        # nothing runs on the connection and no concurrency limit is set: its cycle, not its task
        parsed = httptools.parse_url(self.url)
        raw_path = parsed.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope = self.scope
        scope["method"] = "POST"
        scope["path"] = self.root_path + path
        scope["raw_path"] = self.root_path.encode("ascii") + raw_path
        scope["query_string"] = parsed.query or b""
        self.cycle = self._taken = _CYCLE(
            scope=scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=False,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=True,
            on_response=self.on_response_complete,
        )

    def _plain_head(self) -> bool:
        streams = self.streams
        if (
            streams.proxy is None
            or self.access_log
            or self.limit_concurrency is not None
            or self.root_path
        ):
            return False
        parser = self.parser
        if parser.get_method() != b"POST" or parser.get_http_version() != "1.1":
            return False
        if not parser.should_keep_alive() or parser.should_upgrade():
            return False
        cycle = self.cycle
        if (cycle is not None and not cycle.response_complete) or self.pipeline:
            return False
        url = self.url
        if not url.startswith(b"/v1/") or url.startswith(b"/v1/models"):
            return False
        length = None
        for name, value in self.headers:
            if name in _NOT_PLAIN:
                return False
            if name == b"content-length":
                length = value
        # (over the router's own limit: the coroutine answers its 413)
        limit = min(MAX_BODY, streams.proxy.settings.max_body_bytes)
        return length is not None and length.isdigit() and int(length) <= limit

    def on_message_complete(self) -> None:
        super().on_message_complete()  # type: ignore[misc]
        cycle = self._taken
        if cycle is not None:
            self._taken = None
            if cycle is not self.cycle or cycle.disconnected:
                start(self, cycle, self.app)
                return
            try:
                serve(self, cycle)
            except Exception:  # (a bug: never a request left hanging for it)
                log.exception("serving a stream from callbacks failed")
                answer_failure(self, cycle)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        cycle = self._taken
        if cycle is not None:  # its body is not all in: uvicorn's way, which times it
            self._taken = None
            start(self, cycle, self.app)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)  # type: ignore[misc]
        # (as the lean protocol drops ``cycle``: no cycle left through the one taken, whose
        # ``on_response`` points back here; ``data_received`` clears it before it returns,
        # so this only holds should one of uvicorn's callbacks raise between the two)
        self._taken = None


def _cycle_class() -> Any:
    try:
        from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
    except ImportError:
        return None
    return RequestResponseCycle


_CYCLE = _cycle_class()


# what ``on_headers_complete`` passes uvicorn's cycle, and uses of its protocol
_CYCLE_ARGS = frozenset(
    {
        "scope",
        "transport",
        "flow",
        "logger",
        "access_logger",
        "access_log",
        "default_headers",
        "message_event",
        "expect_100_continue",
        "keep_alive",
        "on_response",
    }
)
_PROTOCOL_METHODS = (
    "on_headers_complete",
    "on_message_complete",
    "data_received",
    "connection_lost",
)


def callback_ready() -> bool:
    """Whether uvicorn's internals are the ones this path was written for (the cycle's
    parameters and the protocol's methods checked at start-up: a drift would otherwise turn
    every POST to /v1/ into uvicorn's 400)."""
    if _CYCLE is None or not plain_head_ready():
        return False
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        params = signature(_CYCLE.__init__).parameters
    except (ImportError, TypeError, ValueError):
        return False
    if not _CYCLE_ARGS <= set(params):
        return False
    return all(hasattr(HttpToolsProtocol, name) for name in _PROTOCOL_METHODS)


def callback_protocol(streams: CallbackStreams) -> Callable[[type[Any]], type[Any]] | None:
    """What extends the router's uvicorn protocol (``router.fastpath.lean.adopt``'s
    ``extend``) to serve plain streams from its callbacks; None, said in the log, where
    uvicorn's internals are not the ones this was written for."""
    if not callback_ready():
        log.warning("uvicorn's internals are not as expected: no streams from callbacks")
        return None

    def extend(base: type[Any]) -> type[Any]:
        log.info("plain streams served from the protocol's callbacks (no ASGI task)")
        return type("CallbackHttpToolsProtocol", (_CallbackRequests, base), {"streams": streams})

    return extend


def start(protocol: Any, cycle: Any, app: App) -> None:
    """Run ``app`` on ``cycle`` as uvicorn runs a request's app: a task it waits for (with
    uvicorn's own ``_start_asgi_task`` where it has one: 0.55's ``reset_contextvars``)."""
    own = getattr(protocol, "_start_asgi_task", None)
    if own is not None:
        own(cycle, app)
        return
    task = protocol.loop.create_task(cycle.run_asgi(app))
    task.add_done_callback(protocol.tasks.discard)
    protocol.tasks.add(task)


def answer_failure(protocol: Any, cycle: Any) -> None:
    """After a bug: a 500 in the OpenAI error shape while nothing was written (what uvicorn
    and the proxy answer), else the connection closed (the stream cannot go on)."""
    if cycle.response_started or cycle.disconnected:
        protocol.transport.close()
        return
    failure = RouterError("the router failed to serve this request")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await _send_error(send, failure)

    try:
        start(protocol, cycle, app)
    except Exception:  # (the loop is closing)
        protocol.transport.close()


def serve(protocol: Any, cycle: Any) -> None:
    """A request taken at its head, its body in: serve it from callbacks, or hand it on."""
    streams: CallbackStreams = protocol.streams
    proxy = streams.proxy
    assert proxy is not None
    if streams.busy is not None:
        streams.busy()
    scope = cycle.scope
    path = scope["path"]
    headers = scope["headers"]
    body = bytes(cycle.body)
    info = None
    # (what the app sends to the proxy: ``RouterApp._proxy_for``)
    proxied = path.startswith("/v1/") and path != "/v1/models"
    if proxied and proxy.sync is None and not proxy._api_keys:
        try:
            check_path(path)
            ctype = next((v for k, v in headers if k == b"content-type"), None)
            info = inspect(path, body, ctype)
        except RouterError:
            pass
    if info is None or not info.stream:
        start(protocol, cycle, protocol.app)  # the proxy answers it, from the start
        return
    out = Outcome(path=path, started=proxy.clock())
    if proxy.poke is not None:
        proxy.poke()
    out.read(info.stream, info.sampling, info.prompt_chars)
    decider = proxy.decider
    request = None
    if decider.policy == "slo":
        request = decider.request(info, *slo_headers(headers))
    out.request = request
    decision = decider.decide(request)
    if decision is None:
        start(protocol, cycle, _refuse(proxy, out))
        return
    pool = proxy.clients.get(decision.backend)
    conn = None
    opens = False  # no idle upstream connection: this path opens one (``Stream._connect``)
    admission = proxy.admission
    overflow = decision.reason == "overflow" and admission.enabled
    if (
        pool is not None
        and proxy._rename_for(decision.pool, info) is None
        and not (overflow and admission.still_holds(decision.backend))
    ):
        conn = pool.take_idle()
        if conn is None:
            opens = proxy.settings.callback_connect and pool.has_room
    if conn is None and not opens:
        # (the coroutine asks the queue, waits for a free connection, counts a request sent
        # on, itself)
        streams.handed += 1
        start(protocol, cycle, proxy.resume(out, body, info, request, decision))
        return
    assert pool is not None
    if overflow:  # (sent on past the queue: counted here, once)
        admission.holds(decision.backend)
    lease = proxy.tracker.acquire(decision.backend, out if request is not None else None)
    Stream(protocol, cycle, proxy, out, body, info, request, decision, lease, pool, conn).begin()


def _refuse(proxy: Proxy, out: Outcome) -> App:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        try:
            refusal = NoBackend(
                "no backend can take requests right now", proxy.settings.retry_after()
            )
            out.answered(refusal.status)
            await _send_error(send, refusal)
        finally:
            proxy.finish(out)

    return app


class Stream:
    """One stream served from callbacks, from its attempt to its end (see the module doc)."""

    __slots__ = (
        "protocol",
        "cycle",
        "proxy",
        "out",
        "body",
        "info",
        "request",
        "decision",
        "lease",
        "pool",
        "conn",
        "tried",
        "sending",
        "resent",
        "connecting",
        "direct",
        "tap",
        "streaming",
        "done",
        "task",
    )

    def __init__(
        self,
        protocol: Any,
        cycle: Any,
        proxy: Proxy,
        out: Outcome,
        body: bytes,
        info: RequestInfo,
        request: Request | None,
        decision: Decision,
        lease: Lease,
        pool: OriginPool,
        conn: Connection | None,
    ) -> None:
        self.protocol, self.cycle, self.proxy, self.out = protocol, cycle, proxy, out
        self.body, self.info, self.request, self.decision = body, info, request, decision
        # (the pool object itself: a backend removed meanwhile is gone from ``proxy.clients``)
        # ``conn`` None: none was idle, ``begin`` opens one (set once it is open)
        self.lease, self.pool, self.conn = lease, pool, conn
        self.tried = [decision.backend]
        # the request as it goes upstream, head and body (``_send``), until its answer's head
        # is in (then nothing can send it again)
        self.sending = b""
        self.resent = False  # sent again once already, after a stale kept-alive connection
        # the task opening the upstream connection (``_connect``), until it has ended
        self.connecting: asyncio.Task[Connection] | None = None
        self.tap: SseTap | None = None
        self.streaming = False
        self.done = False
        # the task that owns the upstream connection (``_relay_rest``/``_send_rest``): while
        # it runs, only it touches or releases ``conn`` (``finish`` cancels it, not releases)
        self.task: asyncio.Task[None] | None = None
        self.direct = DirectSend(cycle.send, cycle)

    def begin(self) -> None:
        """Send the request upstream (or hand it on); a bug ends it, releasing what it holds."""
        try:
            self._begin()
        except Exception:
            self._fail_hard()

    def _begin(self) -> None:
        proxy, out, decision, cycle = self.proxy, self.out, self.decision, self.cycle
        protocol, info, body = self.protocol, self.info, self.body
        out.attempt(
            decision.pool,
            decision.backend,
            decision.reason,
            decision.load,
            decision.prefill_share,
            proxy.tracker.started[decision.backend],
            decision.prefill,
        )
        scope = cycle.scope
        target = scope["raw_path"]
        if scope["query_string"]:
            target += b"?" + scope["query_string"]
        client = protocol.client
        client_ip = client[0] if client else None
        fwd = forward_headers(
            scope["headers"],
            client_ip,
            proxy._pool_auth[decision.pool],
            False,
            proxy._trusts(client_ip),
        )
        named = None
        if info.fill_model and proxy.default_model is not None:
            named = proxy.default_model(decision.pool, decision.backend)
        ask_usage = scope["path"] in USAGE_PATHS
        payload = upstream_body(
            info, body, proxy.settings.pool_model_map(decision.pool), ask_usage, named
        )
        self.direct.watch(self.client_left)
        if self.done:  # (gone already)
            return
        self.sending = self.pool.head(b"POST", target, fwd, payload) + payload
        if self.conn is None:
            self._connect()
        else:
            self._send()

    def _send(self) -> None:
        """Send the request on ``conn``; its wake-ups come to ``upstream``."""
        conn = self.conn
        assert conn is not None
        conn.listen(self.upstream)
        try:  # (the head and body in one, as ``send`` writes a body under 64 KiB: MAX_BODY)
            conn.send(self.sending, b"", self.proxy.timeouts, False, MAX_PEEK)
        except UpstreamError as exc:
            self._drop()
            # a kept-alive one closed while idle: sent again, once, as ``OriginPool.request``
            # does; a new one the backend closed at once is a failed attempt (its verdict)
            if conn.reused and not self.resent:
                self._resend()
            else:
                self.hand_on(Attempt(None, exc, self.tried))

    def _resend(self) -> None:
        """A kept-alive connection the backend had closed before a byte came back: the
        request goes out again on a new one (as ``OriginPool.request`` does), opened here
        where this path opens connections, else by the proxy's coroutine. Once: what the new
        one gets is the attempt's answer or failure."""
        self.resent = True
        if self.proxy.settings.callback_connect and self.pool.has_room:
            self.conn = None
            self._connect()
        else:
            self.hand_on(Attempt(None, None, self.tried, resend=True))

    def _drop(self) -> None:
        """Close the upstream connection, as ``OriginPool.request`` closes a failed one."""
        conn = self.conn
        assert conn is not None
        conn.listen(None)
        conn.close()
        self.pool.forget(conn)

    # -- a new upstream connection ---------------------------------------------------------------
    def _connect(self) -> None:
        """Open an upstream connection (no idle one was there) in a task of its own; the
        stream goes on from callbacks once it is open (``_connected``). Shutdown waits for
        the task as for a request's."""
        task = self.pool.connect_soon(self.proxy.timeouts.connect)
        self.connecting = task
        self.protocol.tasks.add(task)
        task.add_done_callback(self._connected)

    def _connected(self, task: asyncio.Task[Connection]) -> None:
        try:
            self._opened(task)
        except Exception:
            self._fail_hard()

    def _opened(self, task: asyncio.Task[Connection]) -> None:
        """The connect's end, however it ended: send on it, hand its failure to the proxy's
        coroutine (its verdict, retries, the client's error), or close what it opened for a
        stream that is over (``finish`` cancelled it, too late)."""
        self.protocol.tasks.discard(task)
        if self.connecting is task:
            self.connecting = None
        if task.cancelled():
            if not self.done:  # (not ``finish``: uvicorn's shutdown gave up waiting for it)
                self._shut_down()
            return
        error = task.exception()
        pool = self.pool
        if error is None:
            conn = task.result()
            self.protocol.streams.connected += 1
            if not self.done and not pool.closed:
                self.conn = conn
                self._send()
                return
            conn.close()
            pool.forget(conn)
            # (cut or closed while it connected: nothing was sent, as ``OriginPool.request``)
            error = UpstreamError("connect", f"client for {pool.origin.url} is closed")
        if self.done:
            return
        if not isinstance(error, UpstreamError):
            raise error  # (a bug: ``_fail_hard``)
        self.hand_on(Attempt(None, error, self.tried))

    def _shut_down(self) -> None:
        """The server stops before the connect ended (uvicorn's graceful-shutdown timeout
        cancelled it): nothing was sent or written; the client gets a 503 in the OpenAI
        shape, as where no backend can take it, and the connection is closed after it."""
        refusal = NoBackend("the router is shutting down", self.proxy.settings.retry_after())
        self.out.answered(refusal.status)
        self.finish(True, served=False)
        cycle = self.cycle
        if not cycle.disconnected and not cycle.response_started:
            body = refusal.body()
            head = [b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"]
            head.append(b"content-length: %d\r\nconnection: close\r\n" % len(body))
            head += [name + b": " + value + b"\r\n" for name, value in refusal.headers]
            cycle.response_started = cycle.response_complete = True
            cycle.transport.write(b"".join(head) + b"\r\n" + body)
        cycle.transport.close()

    # -- the upstream's wake-ups -----------------------------------------------------------------
    def upstream(self) -> None:
        try:
            self._woken()
        except Exception:
            self._fail_hard()

    def _fail_hard(self) -> None:
        """A bug: the stream ends, releasing what it holds once; the client gets a 500 in the
        OpenAI shape if nothing was written yet, else its connection is closed."""
        log.exception("a stream served from callbacks failed")
        if self.done:
            return
        if self.cycle.response_started:
            self.out.broke("relay")
        else:
            self.out.answered(500)
        self.finish(True, served=False)
        answer_failure(self.protocol, self.cycle)

    def _woken(self) -> None:
        if self.done:
            return
        if self.streaming:
            self._streamed()
            return
        conn = self.conn
        assert conn is not None
        if not conn.headers_done and conn.error is None:
            return
        try:  # (what ``Connection.exchange`` does once woken)
            conn.headed(self.proxy.timeouts, MAX_PEEK)
        except UpstreamError as exc:  # failed before its head
            self._drop()
            if conn.stale(exc) and not self.resent:
                self._resend()
            else:
                self.hand_on(Attempt(None, exc, self.tried))
            return
        self.sending = b""  # (its head is in: never sent again)
        data = conn.buffered()
        cycle = self.cycle
        if (
            conn.status != 200
            or not conn.event_stream
            or conn.error is not None
            or b"\n\n" not in data
            or first_event_refusal(data) is not None
            or cycle.disconnected
            or cycle.flow.write_paused
            or not self._answer()
        ):
            conn.listen(None)
            self.hand_on(Attempt(conn, None, self.tried))

    def _answer(self) -> bool:
        """A 200 stream whose first event is in and no refusal: answer it (False where its
        start is not plain: the proxy's coroutine answers it through uvicorn's ``send``)."""
        proxy, conn, decision, out = self.proxy, self.conn, self.decision, self.out
        assert conn is not None
        strip = self.info.add_usage and out.path in USAGE_PATHS
        headers = response_headers(conn.headers, not strip)
        headers.append((b"x-spec-router-pool", decision.pool.encode()))
        headers.append((b"x-spec-router-reason", decision.reason.encode()))
        if decision.tpot > 0:
            headers += _predicted(decision)
        headers += _deciding_as_header(proxy.decider)
        start_message = {"type": "http.response.start", "status": 200, "headers": headers}
        head = plain_head(self.cycle, start_message)
        if head is None:
            return False
        # (the proxy's verdict on a 200: a good answer)
        proxy.health.served(decision.backend, proxy.clock())
        out.answered(200)
        self.streaming = True
        self.tap = tap = SseTap(strip_usage=strip)
        proxy._first_bytes(out, decision.backend)
        first = tap.feed(conn.take())
        if conn.finished:
            self._end(first, [start_message])
            return True
        self.direct.write_start(head, first)
        conn.on_backlog = self._backlog
        cycle = self.cycle
        flow, transport = cycle.flow, cycle.transport
        conn.divert(
            chunk_sink(flow, cycle, transport, tap.feed, None),
            chunk_whole(flow, cycle, transport, tap.plain),
        )
        return True

    def _backlog(self) -> None:
        if not self.cycle.disconnected:
            self.out.fell_behind()
            self.lease.mark_slow()

    def _streamed(self) -> None:
        """Woken mid-stream: its end, a failure, or a client that cannot take more now."""
        conn = self.conn
        assert conn is not None
        error = conn.error
        if error is not None:
            self._broken(error)
            return
        if conn.complete:
            assert self.tap is not None
            self._end(self.tap.feed(conn.take()), [])
            return
        if self.cycle.disconnected:
            return  # (the disconnect ends it)
        # a slow client: the rest is the proxy's read-and-send loop
        conn.listen(None)
        self._later(self._relay_rest())

    def _later(self, work: Awaitable[None]) -> None:
        """Go on in a task that owns the upstream connection from now on (uvicorn's shutdown
        waits for it, as for a request's; a cancelled one still ends the stream)."""
        task = self.protocol.loop.create_task(self._owning(work))
        self.task = task
        task.add_done_callback(self._task_ended)
        self.protocol.tasks.add(task)

    async def _owning(self, work: Awaitable[None]) -> None:
        try:
            await work
        except asyncio.CancelledError:
            # (uvicorn's graceful-shutdown timeout, or ``finish`` from a callback: the client
            # left while this task waited)
            if not self.done:
                self.out.client_left()
                self.finish(True)
            raise

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        """The owning task's end, however it ended (even cancelled before it ran): it gives
        the upstream connection back now, not before."""
        self.protocol.tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("a stream served from callbacks failed", exc_info=exc)
        if self.task is not task:
            return  # (it released it, or handed it to a task of its own)
        self.task = None
        if self.done:
            assert self.conn is not None  # (a task owns only a connection that is there)
            self.conn.release()
            return
        # (a bug, or cancelled before it ran: nothing ended the stream; end it here)
        self.out.broke("relay")
        self.cycle.transport.close()
        self.finish(True)

    def _end(self, last: bytes, pending: list[dict[str, Any]]) -> None:
        if self.done:
            return
        tap = self.tap
        assert tap is not None
        last += tap.flush()
        end = {"type": "http.response.body", "body": last, "more_body": False}
        if not self.direct.write_plain([*pending, end]):
            assert self.conn is not None
            self.conn.listen(None)
            self._later(self._send_rest([*pending, end]))
            return
        self.out.counted(tap.usage)
        self.finish(False)

    def _broken(self, error: UpstreamError) -> None:
        """The upstream failed mid-stream: an SSE error event ends the client's stream."""
        if self.done:
            return
        proxy, out = self.proxy, self.out
        out.broke(error.kind)
        proxy._judge(verdicts.mid_response(error.kind), self.decision, out, str(error))
        log.warning("upstream failed mid-response: %s", error)
        event = sse_error_event(f"upstream failed mid-stream: {error}", "server_error", 502)
        end = {"type": "http.response.body", "body": event, "more_body": False}
        if not self.direct.write_plain([end]) and not self.cycle.disconnected:
            assert self.conn is not None
            self.conn.listen(None)
            self._later(self._send_rest([end], count=False))
            return
        self.finish(False)

    async def _relay_rest(self) -> None:
        """The rest of the body for a client too slow for the sink: read, and send as it
        can take it (uvicorn's ``send`` waits for its transport to drain). Runs in the task
        ``_later`` makes: it owns ``conn``, and checks ``done`` after every wait."""
        conn, tap, send = self.conn, self.tap, self.cycle.send
        assert tap is not None and conn is not None
        try:
            while True:
                data = await conn.read()
                if self.done:
                    return
                if not data:
                    break
                data = tap.feed(data)
                if conn.finished:
                    last = data + tap.flush()
                    end = {"type": "http.response.body", "body": last, "more_body": False}
                    await self._send_rest([end])
                    return
                if data:
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                    if self.done:
                        return
        except UpstreamError as exc:
            self._broken(exc)
            return
        except OSError:
            self.client_left()
            return
        end = {"type": "http.response.body", "body": tap.flush(), "more_body": False}
        await self._send_rest([end])

    async def _send_rest(self, messages: list[dict[str, Any]], count: bool = True) -> None:
        """Send the last messages as uvicorn's ``send`` can (``count``: the tap was flushed
        into them; False: ``_end`` flushed it already, or the stream broke)."""
        if self.done:
            return
        try:
            await self.direct.send_all(messages)
        except OSError:
            self.client_left()
            return
        if self.done:
            return
        tap = self.tap
        if tap is not None and self.out.error is None:
            self.out.counted(tap.usage)
        self.finish(False)

    # -- the client ---------------------------------------------------------------------------
    def client_left(self) -> None:
        if self.done:
            return
        self.out.client_left()
        self.finish(True)

    # -- the end -------------------------------------------------------------------------------
    def hand_on(self, attempt: Any) -> None:
        """Off the callback path before anything reached the client: the proxy's coroutine
        goes on from this attempt, with this lease (and releases both)."""
        self.direct.unwatch()
        app = self.proxy.resume(
            self.out, self.body, self.info, self.request, self.decision, self.lease, attempt
        )
        start(self.protocol, self.cycle, app)  # (raises: _fail_hard releases it all)
        self.done = True
        self.protocol.streams.handed += 1

    def finish(self, left: bool, served: bool = True) -> None:
        """Release what the stream holds, on every way it ends, and tell the observers."""
        if self.done:
            return
        self.done = True
        proxy, conn, lease = self.proxy, self.conn, self.lease
        self.direct.unwatch()
        unfinished = conn is None or not conn.finished
        task = self.task
        if conn is None:  # (still opening one: what it opens is closed, ``_opened``)
            if self.connecting is not None:
                self.connecting.cancel()
        elif task is None or task is asyncio.current_task():
            self.task = None
            conn.release()
        else:  # (a task waits on it: the task releases it once cancelled, never the pool now)
            task.cancel()
        proxy.release(lease, left and unfinished, self.out)
        if served and not left:
            self.protocol.streams.served += 1
        proxy.finish(self.out)
