"""Forward one ``/v1/*`` request to the chosen backend and stream the answer back.

A raw ASGI handler (no framework routing, no ``StreamingResponse``): the hot path is measured in
bench/results/overhead.md. The in-flight lease is taken once the request is routed and released
in this handler's own ``finally`` -- not in a background task or a generator's ``finally``, which
a client disconnect can skip (see STYLE.md). A client disconnect becomes a cancellation of
the handler, which aborts the upstream connection, so the engine stops too. The response goes
out through a ``Responder`` (``router.fastpath``): plain ASGI, or under uvicorn's httptools
server the fast paths of ``router.fastpath.uvicorn``.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from router.account.inflight import InflightTracker, Lease
from router.account.outcome import Outcome
from router.asgi import ClientGone, Receive, Scope, Send
from router.decide.policy import Decision
from router.decide.predict import Request
from router.errors import (
    NoBackend,
    PayloadTooLarge,
    RequestTimeout,
    RouterError,
    Unauthorized,
    UpstreamTimeout,
    UpstreamUnavailable,
    sse_error_event,
)
from router.fastpath import Responders
from router.fastpath.protocol import REQUEST_EXPIRED, REQUEST_STARTED
from router.fastpath.responder import Responder
from router.fastpath.uvicorn import body_in
from router.forward.admission import Admission
from router.forward.decider import Decider
from router.forward.request import (
    RequestInfo,
    check_path,
    forward_headers,
    has_api_key,
    inspect,
    response_headers,
    upstream_body,
)
from router.health.state import HealthRegistry
from router.pools import POOLS, Pool
from router.settings import Settings
from router.upstream import verdicts
from router.upstream.client import Connection, OriginPool, Timeouts, UpstreamError
from router.upstream.stream import MAX_PEEK, BodyTap, SseTap, first_event
from router.upstream.verdicts import Verdict

log = logging.getLogger("spec_router.proxy")


# Seconds between a queued request's looks at whether a backend can serve it now.
QUEUE_RECHECK = 0.05
# Paths whose streams carry token usage the router can ask for.
USAGE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


@dataclass(slots=True)
class Attempt:
    """The callback path's first attempt, handed to the proxy's coroutine: its answer
    (``conn``, the head and a stream's first event in, nothing read) or failure, the backends
    tried; ``resend``: the kept-alive connection it went out on had been closed by the
    backend before a byte came back, so it goes out again, as ``OriginPool.request`` does."""

    conn: Connection | None
    error: UpstreamError | None
    tried: list[str]
    resend: bool = False


@dataclass(slots=True)
class _Flags:
    done: bool = False
    client_gone: bool = False


class Proxy:
    def __init__(
        self,
        settings: Settings,
        decider: Decider,
        tracker: InflightTracker,
        health: HealthRegistry,
        clients: dict[str, OriginPool],
        observers: list[Callable[[Outcome], None]],
        clock: Callable[[], float] = time.monotonic,
        poke: Callable[[], None] | None = None,
        admission: Admission | None = None,
        abort_lag: Callable[[str], float] | None = None,
        default_model: Callable[[Pool, str], str | None] | None = None,
        sync: Callable[[], object] | None = None,
    ) -> None:
        self.settings = settings
        self.decider = decider
        self.poke = poke  # busy polling (router/fastpath/busypoll.py): a request arrived or ended
        self.tracker = tracker
        self.health = health
        self.clients = clients
        self.observers = observers
        self.clock = clock
        # Made in the serving loop. Passed explicitly: asyncio's loop lookup calls getpid()
        # on Python 3.11, a system call per request.
        self.loop = asyncio.get_running_loop()
        self.responders = Responders(self.loop)
        self.admission = admission if admission is not None else Admission(0)
        # how long an engine goes on running a request after its client left (and the
        # router closed the upstream connection): 0 for vLLM, 2-4 s for SGLang
        self.abort_lag = abort_lag
        self.default_model = default_model  # (pool, backend) -> the model a nameless request gets
        # under --workers: take up a change of the members another worker made before routing
        # (router.members.roster), so no request goes to a backend after it left
        self.sync = sync
        self.timeouts = Timeouts(
            settings.connect_timeout, settings.first_byte_timeout, settings.idle_timeout
        )
        # A non-streamed answer comes whole when generation ends (its headers too): one
        # deadline for all of it.
        whole = settings.non_stream_timeout
        self.whole_timeouts = Timeouts(settings.connect_timeout, whole, whole, whole)
        self._api_keys = [k.get_secret_value().encode() for k in settings.api_keys]
        self._pool_auth = {pool: settings.pool_authorization(pool) for pool in POOLS}
        self._trusted = [ipaddress.ip_network(n, strict=False) for n in settings.trusted_proxies]

    # -- entry ------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        out = Outcome(path=scope["path"], started=self.clock())
        poke = self.poke
        if poke is not None:
            poke()
        flags = _Flags()
        try:
            await self._handle(scope, receive, send, out, flags)
        finally:
            self.finish(out)

    def finish(self, out: Outcome) -> None:
        """The request is over, on whichever path: its outcome to every observer."""
        now = self.clock()
        out.finish(now)
        if self.poke is not None:
            self.poke()
        for observe in self.observers:
            try:
                observe(out)
            except Exception:  # an observer must never break the proxy
                log.exception("observer failed")

    def resume(
        self,
        out: Outcome,
        body: bytes,
        info: RequestInfo,
        request: Request | None,
        decision: Decision,
        lease: Lease | None = None,
        attempt: Attempt | None = None,
    ) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
        """The ASGI app that serves a request the callback path (``router.forward.callback``)
        read and decided, from where it left it: before its lease (``lease`` None), or with
        its lease and an ``attempt`` whose answer (or failure) is in, nothing sent to the
        client yet. It ends as ``__call__`` does."""

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            try:
                await self._serve(
                    scope,
                    receive,
                    send,
                    out,
                    _Flags(),
                    body,
                    info,
                    request,
                    decision,
                    lease,
                    attempt,
                )
            finally:
                self.finish(out)

        return app

    async def _handle(
        self, scope: Scope, receive: Receive, send: Send, out: Outcome, flags: _Flags
    ) -> None:
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        try:
            self._authorize(headers)
            check_path(scope["path"])
            body = await self._read_body(scope, headers, receive, send)
            content_type = next((v for k, v in headers if k == b"content-type"), None)
            info = inspect(scope["path"], body, content_type)
        except RouterError as exc:
            out.answered(exc.status)
            await _send_error(send, exc)
            return
        except ClientGone:
            out.client_left()
            return
        out.read(info.stream, info.sampling, info.prompt_chars)

        decider = self.decider
        if self.sync is not None:
            self.sync()
        request = decider.request(info, *slo_headers(headers)) if decider.policy == "slo" else None
        out.request = request
        decision = decider.decide(request)
        if decision is None:
            refusal = NoBackend(
                "no backend can take requests right now", self.settings.retry_after()
            )
            out.answered(refusal.status)
            await _send_error(send, refusal)
            return
        await self._serve(scope, receive, send, out, flags, body, info, request, decision)

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        out: Outcome,
        flags: _Flags,
        body: bytes,
        info: RequestInfo,
        request: Request | None,
        decision: Decision,
        lease: Lease | None = None,
        attempt: Attempt | None = None,
    ) -> None:
        """A request read and decided: its queue, lease, attempts and answer."""
        task = asyncio.current_task(self.loop)
        assert task is not None
        responder = self.responders(receive, send)
        responder.watch(lambda: _client_left(task, flags))
        conn: Connection | None = None
        left = False
        try:
            if lease is None:
                if decision.reason == "overflow" and self.admission.holds(decision.backend):
                    decision = await self._queue(request, out)
                # released in the finally below; the slo policy sees the request in flight there
                lease = self.tracker.acquire(decision.backend, out if request is not None else None)
            conn, decision = await self._open(scope, body, info, decision, lease, out, attempt)
            out.answered(conn.status)
            await self._relay(conn, decision, info, send, responder, flags, lease, out)
        except asyncio.CancelledError:
            if not flags.client_gone:
                raise
            task.uncancel()
            out.client_left()
            left = True
        except ClientGone:
            out.client_left()
            left = True
        except RouterError as exc:
            out.answered(exc.status)
            if not flags.done:
                await _send_error(send, exc)
        finally:
            flags.done = True
            responder.unwatch()
            unfinished = conn is None or not conn.finished
            if conn is not None:
                conn.release()
            if lease is not None:
                self.release(lease, left and unfinished, out)

    def release(self, lease: Lease, abandoned: bool, out: Outcome) -> None:
        """Let a request's lease go, on whichever path it ended (``abandoned``: its client
        left before the answer was whole, and the engine may go on with it for a while; its
        backend's in-flight integral to ``out`` first, ``Outcome.lease_ends``)."""
        now = self.clock()
        out.lease_ends(now, self.tracker.area(lease.backend, now))
        lease.release()
        if abandoned and self.abort_lag is not None:
            lag = self.abort_lag(lease.backend)
            if lag > 0:
                self.tracker.linger(lease.backend, self.clock() + lag)
        if self.admission.enabled:
            self.admission.released()

    def _first_bytes(self, out: Outcome, backend: str) -> None:
        now = self.clock()
        tracker = self.tracker
        out.first_bytes(now, tracker.area(backend, now), tracker.started[backend])
        if out.prefill:
            tracker.prefilled(backend, now, out.prefill)

    async def _queue(self, request: Request | None, out: Outcome) -> Decision:
        """Hold an overflowing request until a backend can serve it within its SLO."""
        return await wait_in_queue(
            self.decider,
            self.admission,
            request,
            out,
            self.settings.retry_after(),
            self.loop,
            self.sync,
        )

    # -- request side -----------------------------------------------------------------------
    def _authorize(self, headers: list[tuple[bytes, bytes]]) -> None:
        if self._api_keys and not has_api_key(headers, self._api_keys):
            raise Unauthorized("invalid or missing API key")

    async def _read_body(
        self, scope: Scope, headers: list[tuple[bytes, bytes]], receive: Receive, send: Send
    ) -> bytes:
        limit = self.settings.max_body_bytes
        length = next((v for k, v in headers if k == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > limit:
            raise PayloadTooLarge(f"request body is larger than {limit} bytes")
        # One deadline for the whole request, from its first byte where the server's protocol
        # tells (router.fastpath.protocol), else from now; no lease is taken before the body.
        extensions = scope.get("extensions")
        timeout = self.settings.request_timeout
        late = f"the request body was not received within {timeout:g}s"
        if extensions and REQUEST_STARTED in extensions:
            # the server's protocol keeps the deadline and wakes ``receive`` at it: no timer
            # of our own per request (router.fastpath.protocol)
            return await self._receive_body(receive, limit, extensions, late)
        if body_in(send):  # all here (most requests): ``receive`` answers at once, no timer
            return await self._receive_body(receive, limit, None, late)
        try:
            async with asyncio.timeout(timeout):
                return await self._receive_body(receive, limit, None, late)
        except TimeoutError:
            raise RequestTimeout(late) from None

    async def _receive_body(
        self, receive: Receive, limit: int, expiry: dict[str, object] | None, late: str
    ) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone()
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"request body is larger than {limit} bytes")
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
            if expiry is not None and expiry.get(REQUEST_EXPIRED):
                raise RequestTimeout(late)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _open(
        self,
        scope: Scope,
        body: bytes,
        info: RequestInfo,
        decision: Decision,
        lease: Lease,
        out: Outcome,
        attempt: Attempt | None = None,
    ) -> tuple[Connection, Decision]:
        """Send the request, retrying elsewhere only while nothing has reached the client
        (``attempt``: the first one was sent already, by the callback path)."""
        method = scope["method"].encode()
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        client = scope.get("client")
        client_ip = client[0] if client else None
        trusted = self._trusts(client_ip)
        ask_usage = info.stream and scope["path"] in USAGE_PATHS
        timeouts = self.timeouts if info.stream else self.whole_timeouts
        peek = MAX_PEEK if info.stream else 0  # (woken once for the head and first event)
        tried: list[str] = [] if attempt is None else attempt.tried
        while True:
            if attempt is None or attempt.resend:
                if attempt is None:
                    out.attempt(
                        decision.pool,
                        decision.backend,
                        decision.reason,
                        decision.load,
                        decision.prefill_share,
                        self.tracker.started[decision.backend],
                        decision.prefill,
                    )
                    tried.append(decision.backend)
                attempt = None
            else:  # the callback path's attempt, its answer in
                conn, error = attempt.conn, attempt.error
                attempt = None
                verdict, refused, conn, error = await self._verdict(conn, error, info)
                alt = self._next(verdict, decision, out, tried, conn, error, refused)
                if alt is None:
                    assert conn is not None
                    return conn, decision
                lease.move(alt.backend)
                decision = alt
                continue
            pool_key = self._pool_auth[decision.pool]
            headers = forward_headers(
                scope["headers"], client_ip, pool_key, bool(self._api_keys), trusted
            )
            named = None
            if info.fill_model and self.default_model is not None:
                named = self.default_model(decision.pool, decision.backend)
            payload = upstream_body(
                info, body, self.settings.pool_model_map(decision.pool), ask_usage, named
            )
            conn = None
            error = None
            try:
                conn = await self.clients[decision.backend].request(
                    method, target, headers, payload, timeouts, first_event_peek=peek
                )
            except UpstreamError as exc:
                error = exc
            verdict, refused, conn, error = await self._verdict(conn, error, info)
            alt = self._next(verdict, decision, out, tried, conn, error, refused)
            if alt is None:
                assert conn is not None
                return conn, decision  # the answer, or a refusal with nowhere else to go
            lease.move(alt.backend)
            decision = alt

    async def _verdict(
        self, conn: Connection | None, error: UpstreamError | None, info: RequestInfo
    ) -> tuple[Verdict, str | None, Connection | None, UpstreamError | None]:
        """What an attempt's answer (``conn``) or failure (``error``) says, a stream's first
        event read: the verdict, an in-stream refusal's message, and the answer still usable
        or the failure."""
        if conn is None:
            assert error is not None
            return verdicts.after_error(error.kind, error.response_started), None, None, error
        verdict = verdicts.after_status(conn.status)
        refused: str | None = None  # a stream refused in its first event: the message
        if info.stream and conn.event_stream:
            try:
                refused, status = await first_event(conn)
            except UpstreamError as exc:  # no event: closed (refused), or too slow
                conn.release()
                if exc.kind == "reset":
                    return verdicts.stream_refused(None), None, None, exc
                return verdicts.after_error(exc.kind, response_started=False), None, None, exc
            if refused is not None:
                verdict = verdicts.stream_refused(status)
        return verdict, refused, conn, None

    def _next(
        self,
        verdict: Verdict,
        decision: Decision,
        out: Outcome,
        tried: list[str],
        conn: Connection | None,
        error: UpstreamError | None,
        refused: str | None,
    ) -> Decision | None:
        """After an attempt: where to send the request next (the answer in ``conn`` let go),
        or None to answer with ``conn``; raises the client's error when there is nothing to
        answer with and nowhere to go."""
        detail = str(error) if error else refused or f"HTTP {verdict.kind[5:]}"
        self._judge(verdict, decision, out, detail)
        alt = None
        if verdict.retry and out.attempts < self.settings.max_attempts:
            if self.sync is not None:
                self.sync()
            alt = self.decider.retry(decision, tried)
        if alt is None:
            if conn is not None and refused is None:
                return None
            if conn is not None:  # refused inside a 200: the client gets a real 503
                conn.release()
                out.broke(verdict.kind)
                raise NoBackend(
                    f"no backend could take the request (last: {refused})",
                    self.settings.retry_after(),
                )
            assert error is not None
            out.broke(error.kind)
            raise _refusal(error, verdict.retry, self.settings.retry_after())
        if conn is not None:
            conn.release()  # aborts: the body of a refusal is not worth reading
        out.retried(verdict.kind)
        return alt

    def _trusts(self, client_ip: str | None) -> bool:
        """Whether the client is a proxy whose X-Forwarded-For the router keeps."""
        if not self._trusted or client_ip is None:
            return False
        try:
            address = ipaddress.ip_address(client_ip)
        except ValueError:  # (a Unix socket's peer, say)
            return False
        return any(address in network for network in self._trusted)

    def _judge(self, verdict: Verdict, decision: Decision, out: Outcome, detail: str) -> None:
        """Apply what an attempt said about its backend: a failure, an ejection, a good answer."""
        if verdict.failed:
            out.attempt_failed(verdict.kind)
        if verdict.eject:
            self.health.eject(decision.backend, self.clock(), detail)
        elif verdict.served:
            self.health.served(decision.backend, self.clock())

    # -- response side ----------------------------------------------------------------------
    async def _relay(
        self,
        conn: Connection,
        decision: Decision,
        info: RequestInfo,
        send: Send,
        responder: Responder,
        flags: _Flags,
        lease: Lease,
        out: Outcome,
    ) -> None:
        ctype = next((v for k, v in conn.headers if k == b"content-type"), b"")
        is_sse = ctype.startswith(b"text/event-stream")
        rename = self._rename_for(decision.pool, info)
        ask_usage = info.stream and out.path in USAGE_PATHS
        strip = ask_usage and info.add_usage
        tap: SseTap | BodyTap | None
        if is_sse:
            tap = SseTap(strip_usage=strip, rename=rename)
        elif conn.status < 300:
            tap = BodyTap()
        else:
            tap = None
        keep_length = rename is None and not (is_sse and strip)
        if rename is not None and not is_sse:
            await self._relay_rewritten(conn, decision, responder, rename, out)
            return
        headers = response_headers(conn.headers, keep_length)
        headers.append((b"x-spec-router-pool", decision.pool.encode()))
        headers.append((b"x-spec-router-reason", decision.reason.encode()))
        if decision.tpot > 0:  # what the slo policy expected of this request
            headers += _predicted(decision)
        headers += _deciding_as_header(self.decider)
        start = {"type": "http.response.start", "status": conn.status, "headers": headers}
        # The per-chunk loop: kept flat (no helper coroutines) because it runs for every chunk
        # of every stream, and that is most of the router's CPU under load. Under uvicorn's
        # httptools server (``direct``) the start goes out with the body bytes that came with
        # the upstream's headers in one write, and the rest of a chunked body skips the loop:
        # the upstream connection writes it to the client from its socket callback
        # (``_divert``), and ``read()`` returns only at the end, on an error, or when the
        # client is too slow for that.
        read, feed = conn.read, (tap.feed if tap is not None else None)

        # A slow client, on every server and path: the body waiting for it passed the upstream
        # connection's high-water mark and the connection stopped reading from the engine.
        def backlog() -> None:
            if flags.client_gone:  # (not slow: gone, and its cancellation is on its way)
                return
            out.fell_behind()
            lease.mark_slow()

        conn.on_backlog = backlog
        pending: list[dict[str, Any]] | None = [start]  # what waits for the first body bytes
        last = b""
        try:
            if not conn.has_body:
                await _send_all(responder, [start])
                pending = None
                self._divert(conn, responder, tap, lease, out)
            while True:
                data = await read()
                if not data:
                    break
                if out.first_byte is None:
                    self._first_bytes(out, decision.backend)
                if feed is not None:
                    data = feed(data)
                if conn.finished:  # the last bytes go out with the end of the response
                    last = data
                    break
                if pending is not None:
                    chunk = {"type": "http.response.body", "body": data, "more_body": True}
                    await _send_all(responder, [*pending, chunk] if data else pending)
                    pending = None
                    self._divert(conn, responder, tap, lease, out)
                elif data:
                    await send({"type": "http.response.body", "body": data, "more_body": True})
        except UpstreamError as exc:
            out.broke(exc.kind)
            self._judge(verdicts.mid_response(exc.kind), decision, out, str(exc))
            if pending is not None:  # nothing reached the client yet: a 504 or an ordinary 502
                if exc.kind in verdicts.SLOW_KINDS:
                    raise UpstreamTimeout(f"upstream did not answer within {exc}") from None
                raise UpstreamUnavailable(f"upstream failed: {exc}") from None
            await self._break_stream(send, exc, is_sse)
            return
        except OSError as exc:  # ASGI spec 2.4: the client is gone
            raise ClientGone() from exc
        if isinstance(tap, SseTap):
            last += tap.flush()
        flags.done = True
        end = {"type": "http.response.body", "body": last, "more_body": False}
        await _send_all(responder, [*pending, end] if pending else [end])
        if tap is not None:
            out.counted(tap.usage)

    def _divert(
        self,
        conn: Connection,
        responder: Responder,
        tap: SseTap | BodyTap | None,
        lease: Lease,
        out: Outcome,
    ) -> None:
        """Let the upstream connection write the body's chunks straight to the client (a
        client that cannot keep up is left to ``read()``, and counted slow by ``_relay``'s
        ``backlog``)."""
        first = None
        if out.first_byte is None:
            first = functools.partial(self._first_bytes, out, lease.backend)
        sink = responder.body_sink(tap.feed if tap is not None else None, first)
        if sink is not None:
            conn.divert(sink)

    async def _break_stream(self, send: Send, exc: UpstreamError, is_sse: bool) -> None:
        """The backend failed after the response started: the client must see a broken stream."""
        log.warning("upstream failed mid-response: %s", exc)
        if not is_sse:
            # A plain body cannot carry an error; ending it short makes the server drop the
            # connection, which is the honest signal.
            raise ClientGone() from exc
        event = sse_error_event(f"upstream failed mid-stream: {exc}", "server_error", 502)
        try:
            await send({"type": "http.response.body", "body": event, "more_body": False})
        except OSError as exc:
            raise ClientGone() from exc

    def _rename_for(self, pool: Pool, info: RequestInfo) -> tuple[bytes, bytes] | None:
        model_map = self.settings.pool_model_map(pool)
        if info.model is None or info.model not in model_map:
            return None
        served = json.dumps(model_map[info.model], ensure_ascii=False)
        public = json.dumps(info.model, ensure_ascii=False)
        return (f'"model":{served}'.encode(), f'"model":{public}'.encode())

    async def _relay_rewritten(
        self,
        conn: Connection,
        decision: Decision,
        responder: Responder,
        rename: tuple[bytes, bytes],
        out: Outcome,
    ) -> None:
        """A non-streaming body with a per-pool model name: read it whole, map the name back."""
        parts = []
        while True:
            try:
                data = await conn.read()
            except UpstreamError as exc:
                out.broke(exc.kind)
                self._judge(verdicts.mid_response(exc.kind), decision, out, str(exc))
                if exc.kind in verdicts.SLOW_KINDS:
                    raise UpstreamTimeout(f"upstream did not answer within {exc}") from None
                raise UpstreamUnavailable(f"upstream failed: {exc}") from None
            if not data:
                break
            if out.first_byte is None:
                self._first_bytes(out, decision.backend)
            parts.append(data)
        body = b"".join(parts).replace(*rename)
        tap = BodyTap()
        tap.feed(body)
        out.counted(tap.usage)
        headers = response_headers(conn.headers, keep_length=False)
        headers += [
            (b"content-length", str(len(body)).encode()),
            (b"x-spec-router-pool", decision.pool.encode()),
            (b"x-spec-router-reason", decision.reason.encode()),
        ]
        if decision.tpot > 0:
            headers += _predicted(decision)
        headers += _deciding_as_header(self.decider)
        start = {"type": "http.response.start", "status": conn.status, "headers": headers}
        end = {"type": "http.response.body", "body": body, "more_body": False}
        await _send_all(responder, [start, end])


def _deciding_as_header(decider: Decider) -> list[tuple[bytes, bytes]]:
    """``x-spec-router-deciding-as`` when the configured policy decides as another for want
    of curves (``slo`` as ``spillover`` before any table or learning); none otherwise."""
    actual = decider.deciding_as
    return [] if actual == decider.policy else [(b"x-spec-router-deciding-as", actual.encode())]


async def wait_in_queue(
    decider: Decider,
    admission: Admission,
    request: Request | None,
    out: Outcome,
    retry_after: int,
    loop: asyncio.AbstractEventLoop,
    sync: Callable[[], object] | None = None,
) -> Decision:
    """Hold an overflowing request in the router's queue (``Admission``) until a backend can
    serve it within its SLO or its engine is no longer measured past it; raise ``QueueFull``
    (429) or ``NoBackend`` (503) where the router refuses it. Its deadline is the admission's
    ``timeout`` (None: the request's strict TTFT target). The proxy and the gateway's endpoint
    picker (``router.gateway``) both wait here."""
    admission.enter(retry_after)
    admitted = False
    out.queued()
    timeout = admission.timeout
    if timeout is None:
        timeout = decider.slo_ttft if request is None else request.slo_ttft
    try:
        deadline = loop.time() + timeout
        again = False
        while True:
            left = deadline - loop.time()
            if left <= 0:
                admission.time_out()
                raise NoBackend(
                    "no backend could serve the request within its SLO before the "
                    "router's queue deadline",
                    retry_after,
                )
            # woken when a request in flight ends; and it looks again now and then, as
            # what it waits for (the recent load the predictions see) also fades with time
            await admission.wait(min(left, QUEUE_RECHECK), again)
            again = True
            if sync is not None:  # (the pools may have changed while it waited)
                sync()
            peek = decider.peek(request)
            if peek is None or peek.reason != "overflow" or not admission.still_holds(peek.backend):
                decision = decider.decide(request)
                if decision is None:
                    raise NoBackend("no backend can take requests right now", retry_after)
                admitted = True
                return decision
    finally:
        admission.leave(admitted)


def slo_headers(headers: list[tuple[bytes, bytes]]) -> tuple[float | None, float | None]:
    """A request's own SLO (``x-slo-ttft-ms`` / ``x-slo-tpot-ms``), in seconds; None: unset or
    not a positive number."""
    ttft = tpot = None
    for name, value in headers:
        if name == b"x-slo-ttft-ms":
            ttft = _ms(value)
        elif name == b"x-slo-tpot-ms":
            tpot = _ms(value)
    return ttft, tpot


def _predicted(decision: Decision) -> list[tuple[bytes, bytes]]:
    """The slo policy's prediction for this request, in milliseconds (for clients and tests)."""
    return [
        (b"x-spec-router-predicted-ttft-ms", b"%.1f" % (decision.ttft * 1000)),
        (b"x-spec-router-predicted-tpot-ms", b"%.2f" % (decision.tpot * 1000)),
    ]


def _ms(value: bytes) -> float | None:
    try:
        ms = float(value)
    except ValueError:
        return None
    return ms / 1000.0 if math.isfinite(ms) and ms > 0 else None


def _refusal(error: UpstreamError, retried_out: bool, retry_after: int) -> RouterError:
    answer = verdicts.refusal(error.kind, retried_out)
    if answer == "timeout":
        return UpstreamTimeout(f"upstream did not answer within {error}")
    if answer == "no_backend":
        return NoBackend(f"no backend could take the request (last error: {error})", retry_after)
    return UpstreamUnavailable(str(error))


async def _send_all(responder: Responder, messages: list[dict[str, Any]]) -> None:
    """Send ``messages`` in order (under uvicorn's httptools server, in one write)."""
    try:
        await responder.send_all(messages)
    except OSError as exc:  # ASGI spec 2.4: sending on a closed connection raises OSError
        raise ClientGone() from exc


async def _send_error(send: Send, exc: RouterError) -> None:
    body = exc.body()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *exc.headers,
    ]
    try:
        await send({"type": "http.response.start", "status": exc.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
    except OSError:
        pass


def _client_left(task: asyncio.Task[Any], flags: _Flags) -> None:
    if not flags.done:
        flags.client_gone = True
        task.cancel()
