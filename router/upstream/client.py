"""A small HTTP/1.1 client for the proxy's hot path: asyncio protocols + httptools.

Why not httpx or aiohttp: on this project's benchmarks the upstream client is most of the
router's CPU per request (httpx ~10x aiohttp; see bench/results/overhead.md). This client does
only what a reverse proxy to LLM engines needs -- keep-alive pools per origin, one write per
request, streaming response bodies with back-pressure, and the timeouts (connect; first body
byte, then the idle gap between chunks; or one total for a whole answer) -- and leaves parsing
to httptools, the C parser uvicorn already uses.

The first-byte timer runs until the first *body* byte, not the headers: vLLM (and SGLang 0.5.3)
send a stream's headers before the request is even queued, so the wait in the engine's queue
and its prefill come after them (docs/engines.md, section 7).

Life of a response: ``OriginPool.request()`` returns a ``Connection`` once the response headers
have arrived; the caller reads the body with ``read()`` until it returns ``b""`` and must call
``release()`` exactly once, on every path. A caller that can write to its client without
waiting may ``divert()`` the body to a sink: each read's bytes then go out from the socket
callback itself, with no task switch per chunk, and ``read()`` only returns at the end, on an
error, or when the sink declines (the client is slow) and the bytes wait for ``read()`` again.

A connection whose response was read to the end goes back to the pool; any other is aborted,
which is also how a cancelled request stops the engine (it sees the TCP connection close).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

import httptools

from router.origin import Origin
from router.timers import LazyTimer

# Back-pressure: stop reading from the engine when this much body is waiting for a slow client.
HIGH_WATER: Final = 256 * 1024

ErrorKind = Literal[
    "connect",
    "connect_timeout",
    "reset",
    "first_byte_timeout",
    "idle_timeout",
    "total_timeout",
    "protocol",
    "relay",
    "drained",
]


class UpstreamError(Exception):
    """A failure talking to a backend.

    ``kind`` is one of ``connect`` (refused or unreachable), ``connect_timeout``, ``reset``
    (connection closed or reset before the response was complete), ``first_byte_timeout``,
    ``idle_timeout``, ``protocol`` (unparseable response), ``relay`` (the sink given to
    ``Connection.divert`` failed), ``drained`` (the backend left its pool and its drain
    deadline passed: the router cut the exchange, ``OriginPool.cut``). ``response_started``
    tells whether response headers had arrived, which decides whether a retry can still be
    safe.
    """

    def __init__(self, kind: ErrorKind, message: str, *, response_started: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.response_started = response_started


class UnresolvedHost(UpstreamError):
    """A ``connect`` failure because the backend's host name does not resolve (for the health
    poller's warning; everything else treats it as any ``connect`` failure)."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float
    first_byte: float  # request sent -> first body byte
    idle: float  # longest gap between body chunks after that
    total: float | None = None  # request sent -> whole answer, instead of the two above


class Connection(asyncio.Protocol):
    """One upstream TCP connection, carrying one request/response at a time."""

    def __init__(self, pool: OriginPool) -> None:
        self._pool = pool
        self._loop = pool.loop
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.reused = False
        self.idle_since = 0.0
        self._body: deque[bytes] = deque()
        # One timer per connection, kept across its exchanges and moved lazily (_arm_timer).
        self._timer = LazyTimer(self._loop, self._deadline, self._timed_out)
        # called instead of waking a waiter (``listen``): an exchange served from callbacks
        self._listener: Callable[[], None] | None = None
        self._reset_exchange()

    def _reset_exchange(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self._content_type: bytes | None = None  # (the first one, as event_stream reads it)
        self._event_stream = False
        self._headers_done = False
        self._interim = False
        self._complete = False
        self._framed = False  # content-length or chunked: a clean end is knowable
        self._keep_alive = False
        self._body.clear()
        self._buffered = 0
        self._paused = False
        self._error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        # the exchange's deadline (see _arm_timer): its kind, and for a fixed one its time
        self._timing: ErrorKind | None = None
        self._due = 0.0
        self._delay = 0.0
        self._last_activity = 0.0
        self._received_any = False
        self._head_only = False
        # > 0: the caller waits for a stream's first event, not just the head (see exchange)
        self._peek = 0
        self._before_body: float | None = None  # the idle timeout, armed at the first body byte
        self._sink: Callable[[bytes], bool] | None = None
        # (``divert``'s ``whole``) takes a whole chunk of a chunked body as it came; with
        # ``_at_boundary`` (the parser has read up to the end of a chunk), ``data_received``
        # offers it a read that is exactly one whole chunk, without the parser
        self._whole: Callable[[bytes, int, int], bool] | None = None
        self._chunked = False  # transfer-encoding: chunked
        self._chunk_open = False  # (the parser's) a chunk's size line read, not its end
        self._at_boundary = False
        # called when unread body bytes pass HIGH_WATER and reading stops: the reader (and so,
        # behind it, the client) is slower than the upstream
        self.on_backlog: Callable[[], None] | None = None

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        poke = self._pool.poke
        if poke is not None:
            poke()
        self._received_any = True
        self._last_activity = self._loop.time()
        whole = self._whole
        if whole is not None and self._at_boundary:
            # One whole chunk, exactly (``divert``'s ``whole``), the parser at a chunk's end:
            # reading a whole chunk leaves its state where it was, so it need not see it. Its
            # size line as ``chunk_sink`` writes one (lower-case hex, no extension): the bytes
            # the client gets are the same either way. (Inlined: every chunk of every stream.)
            # (the size it must state, were it one whole chunk: then its line says so)
            line = data.find(b"\r\n")
            size = len(data) - line - 4
            if size > 0 and data[-2:] == b"\r\n" and data[:line] == b"%x" % size:
                try:
                    if whole(data, line + 2, len(data) - 2):
                        return
                except Exception as exc:
                    self._relay_failed(exc)
                    return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail("protocol", f"invalid response from {self._pool.origin.url}: {exc}")
            self._abort()
            return
        if self._whole is not None:
            self._at_boundary = (
                self._chunked
                and not self._chunk_open
                and data[-2:] == b"\r\n"
                and self._headers_done
                and not self._complete
                and self._error is None
                and self._before_body is None
                and not self._peek
                and not self._paused
            )
        sink = self._sink
        if sink is None or not self._body:
            return
        # Hand this read's body bytes to the sink (inlined: it runs for every chunk of every
        # stream): one sink call per socket read, however many chunks it held. Once the
        # response is complete the bytes are left for the reader, which sends them with the
        # end of the response in one write.
        if self._complete or self._error is not None:
            self._wake()
            return
        body = self._body
        if len(body) == 1:
            data = body.popleft()
        else:
            data = b"".join(body)
            body.clear()
        try:
            taken = sink(data)
        except Exception as exc:
            self._relay_failed(exc)
            return
        if not taken:  # the client cannot take it now: back to read() for the rest
            self._sink = self._whole = None
            body.append(data)
            self._buffered = len(data)
            self._wake()

    def _relay_failed(self, exc: Exception) -> None:
        self._sink = self._whole = None
        self._fail("relay", f"relaying the response from {self._pool.origin.url}: {exc!r}")
        self._abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._drop_timer()  # complete, or failing below: nothing left to time
        self._pool.forget(self)
        if self._complete:
            return
        if self._headers_done and not self._framed and exc is None:
            # A response delimited by the connection's end (no length, not chunked).
            self._complete = True
            self._wake()
            return
        detail = f": {exc}" if exc else ""
        self._fail("reset", f"connection to {self._pool.origin.url} closed{detail}")

    def pause_writing(self) -> None:  # request bodies are written in one go; nothing to pause
        pass

    def resume_writing(self) -> None:
        pass

    # -- httptools callbacks ----------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if self._headers_done:  # a chunked body's trailer: not one of the response's headers
            return
        name = name.lower()
        if name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value):
            self._framed = True
            if name == b"transfer-encoding":
                self._chunked = value.rstrip().lower().endswith(b"chunked")
        elif name == b"content-type" and self._content_type is None:
            self._content_type = value
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            # an interim response (100 Continue, 103 Early Hints): the final one follows
            self.headers = []
            self._content_type = None
            self._framed = self._chunked = False
            self._interim = True
            return
        self.status = status
        ctype = self._content_type
        self._event_stream = (
            status == 200 and ctype is not None and ctype.startswith(b"text/event-stream")
        )
        self._keep_alive = self._parser.should_keep_alive()
        self._headers_done = True
        if self._head_only or self.status in (204, 304) or 100 <= self.status < 200:
            # No body follows; llhttp cannot know that for HEAD, so we stop here.
            self._framed = True
            self._complete = True
            self._keep_alive = False if self._head_only else self._keep_alive
        if self._peek:
            if not self._complete and self.event_stream:
                return  # the caller waits on for the first event: on_body wakes it
            self._peek = 0
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self._before_body is not None:  # the first body byte: from here on, gaps count
            self._arm_timer(self._before_body, "idle_timeout")
            self._before_body = None
        self._body.append(body)
        if self._sink is not None:
            return  # data_received hands it on once the whole read is parsed
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
            if self.on_backlog is not None:
                self.on_backlog()
        if self._peek:  # waiting for a whole first event (or ``_peek`` bytes without one)
            # (each piece is looked at once, as it comes: in it, or across its start)
            pieces = self._body
            ends = b"\n\n" in body or (
                body[:1] == b"\n" and len(pieces) > 1 and pieces[-2][-1:] == b"\n"
            )
            if not ends and self._buffered < self._peek and not self._paused:
                return
            self._peek = 0
        self._wake()

    def on_chunk_header(self) -> None:
        self._chunk_open = True

    def on_chunk_complete(self) -> None:
        self._chunk_open = False

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._complete = True
        self._keep_alive = self._keep_alive and self._parser.should_keep_alive()
        self._wake()

    # -- internals ----------------------------------------------------------------------------
    def _wake(self) -> None:
        listener = self._listener
        if listener is not None:
            listener()
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, kind: ErrorKind, message: str) -> None:
        if self._error is None and not self._complete:
            self._error = UpstreamError(kind, message, response_started=self._headers_done)
        self._wake()

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _arm_timer(self, delay: float, kind: ErrorKind) -> None:
        """Fail the exchange with ``kind`` after ``delay`` seconds: of silence for
        ``idle_timeout`` (from the last byte read), else from now. The connection's one timer
        (``router.timers.LazyTimer``) is kept across its exchanges: a kept-alive connection
        makes no timer per request."""
        self._timing, self._delay = kind, delay
        start = self._last_activity if kind == "idle_timeout" else self._loop.time()
        self._due = start + delay
        self._timer.arm(self._due)

    def _cancel_timer(self) -> None:
        """Disarm: a pending timer finds nothing due and ends (``close`` cancels it)."""
        self._timing = None

    def _drop_timer(self) -> None:
        self._timing = None
        self._timer.cancel()

    def _deadline(self) -> float | None:
        """When the exchange's deadline passes, as of now (the timer asks when it goes off)."""
        kind = self._timing
        if kind is None or self._complete or self._error is not None:
            return None
        if kind == "idle_timeout":
            if self._paused:  # not reading for a slow client: the silence is ours, not the engine's
                self._last_activity = self._loop.time()
            return self._last_activity + self._delay
        return self._due

    def _timed_out(self) -> None:
        kind = self._timing
        assert kind is not None
        what = {"first_byte_timeout": "first byte", "total_timeout": "whole answer"}.get(
            kind, "next chunk"
        )
        self._fail(kind, f"{self._pool.origin.url}: no {what} within {self._delay:g}s")
        self._abort()

    async def _wait(self) -> None:
        waiter = self._loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None

    # -- the exchange ------------------------------------------------------------------------
    async def exchange(
        self,
        head: bytes,
        body: bytes,
        timeouts: Timeouts,
        head_only: bool,
        first_event_peek: int = 0,
    ) -> None:
        """Send one request and wait until the response headers arrive (or fail).

        ``first_event_peek`` > 0: for a 200 event stream, wait on until its first event is in
        too (a blank line), or that many bytes without one, the end, an error, or reading
        paused for a backlog; so that the caller, which reads it next
        (``router.upstream.stream.first_event``), is woken once and not twice: engines send the
        head when they take a request and the first event after the prefill. A failure after
        the head is then not raised here but left for ``read()``, as it would have been had
        this returned at the head; the first-byte timer still gives way to the idle timer at
        the first body byte.
        """
        self.send(head, body, timeouts, head_only, first_event_peek)
        while not self._headers_done and self._error is None:
            await self._wait()
        self.headed(timeouts, first_event_peek)

    def send(
        self,
        head: bytes,
        body: bytes,
        timeouts: Timeouts,
        head_only: bool,
        first_event_peek: int = 0,
    ) -> None:
        """``exchange``'s first half: send the request and arm its timer (no waiting)."""
        self._reset_exchange()
        self._head_only = head_only
        self._peek = first_event_peek
        transport = self._transport
        if transport is None or transport.is_closing():
            raise UpstreamError("reset", f"connection to {self._pool.origin.url} closed")
        transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            transport.write(body)
        self._last_activity = self._loop.time()
        if timeouts.total is not None:
            self._arm_timer(timeouts.total, "total_timeout")  # runs until the answer is whole
        else:
            self._arm_timer(timeouts.first_byte, "first_byte_timeout")
            if first_event_peek:  # (held past the first body byte: on_body swaps the timers)
                self._before_body = timeouts.idle

    def headed(self, timeouts: Timeouts, first_event_peek: int = 0) -> None:
        """``exchange``'s second half, once the head is in or the exchange failed: raise its
        error, or arm the timer for the body."""
        self._peek = 0
        if self._error is not None and not (
            first_event_peek and self._headers_done and self.event_stream
        ):  # (a held stream's failure after its head is read(); anything else's, as before)
            self._cancel_timer()
            raise self._error
        if not self._complete and timeouts.total is None:
            if self._body:
                self._arm_timer(timeouts.idle, "idle_timeout")
            else:  # headers alone: the first-byte timer goes on
                self._before_body = timeouts.idle

    async def read(self) -> bytes:
        """The body bytes that have arrived since the last call; ``b""`` once it is complete."""
        while not self._body:
            if self._error is not None:
                raise self._error
            if self._complete:
                self._cancel_timer()
                return b""
            # (inlined _wait(): one coroutine object less per chunk)
            waiter = self._waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        if len(self._body) == 1:
            data = self._body.popleft()
        else:
            data = b"".join(self._body)
            self._body.clear()
        self._buffered = 0
        if self._paused and self._transport is not None:
            self._paused = False
            # the silence while paused was ours (see _on_timer): the engine's idle time starts
            # now, not at the timer's last look, up to an idle timeout ago
            self._last_activity = self._loop.time()
            self._transport.resume_reading()
        return data

    def take(self) -> bytes:
        """The body bytes in, without waiting (``read()`` for a caller woken by ``listen``)."""
        body = self._body
        if not body:
            return b""
        data = body.popleft() if len(body) == 1 else b"".join(body)
        body.clear()
        self._buffered = 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._last_activity = self._loop.time()
            self._transport.resume_reading()
        return data

    async def read_all(self) -> bytes:
        """The rest of the body, whole (for small answers: health, metrics, model lists)."""
        parts = []
        while chunk := await self.read():
            parts.append(chunk)
        return b"".join(parts)

    def unread(self, data: bytes) -> None:
        """Put body bytes already read back in front, for the next ``read()`` (a peek)."""
        if data:
            self._body.appendleft(data)
            self._buffered += len(data)

    def listen(self, listener: Callable[[], None] | None) -> None:
        """Call ``listener`` wherever a waiter would be woken (the head, the first event, body
        bytes for no sink, the end, an error), for an exchange served from socket callbacks
        (``router.forward.callback``); None: back to waiters (``read()``)."""
        self._listener = listener

    @property
    def headers_done(self) -> bool:
        return self._headers_done

    @property
    def error(self) -> UpstreamError | None:
        return self._error

    @property
    def peek_pending(self) -> bool:
        """A stream's first event is still awaited (``exchange``'s ``first_event_peek``)."""
        return bool(self._peek)

    def buffered(self) -> bytes:
        """The body bytes in, not yet read (left in place)."""
        return b"".join(self._body)

    def divert(
        self,
        sink: Callable[[bytes], bool],
        whole: Callable[[bytes, int, int], bool] | None = None,
    ) -> None:
        """Send body bytes to ``sink`` as they arrive, until it returns False (see module doc).

        The sink runs inside the socket callback: it must not block, and returns False without
        consuming anything when it cannot write now. Bytes already buffered stay for ``read()``.

        ``whole`` (for a chunked body): offered first each read that is exactly one whole chunk
        of it, framing and all (``data``; its payload ``data[start:end]``), with the parser at
        a chunk's end; True: it took the chunk as it came, which the parser then need not read;
        False, having done nothing: the read goes the parser's way to ``sink``. Its size line is
        the one ``router.fastpath.responder.chunk_sink`` writes for that payload.
        """
        self._sink = sink
        self._whole = whole
        self._at_boundary = False  # (known again after the parser's next read)

    @property
    def event_stream(self) -> bool:
        """The response is a 200 with an SSE body (whose first event may hold a refusal)."""
        return self._event_stream

    @property
    def has_body(self) -> bool:
        """Body bytes are waiting: ``read()`` will return them without waiting."""
        return bool(self._body)

    @property
    def complete(self) -> bool:
        """The whole response is in (some of it may not have been read)."""
        return self._complete

    @property
    def finished(self) -> bool:
        """The response is complete and every byte of it was handed out."""
        return self._complete and not self._body and self._error is None

    def stale(self, error: UpstreamError) -> bool:
        """A reused keep-alive connection the server had closed: it closed (``reset``) before
        a single response byte. Anything else -- a first-byte timeout above all -- means the
        request reached an engine that is working on it, and must not be sent again."""
        return error.kind == "reset" and self.reused and not self._received_any

    def release(self) -> None:
        """Give the connection back (response fully read) or abort it. Safe to call twice."""
        self._cancel_timer()
        # (they hold the request's side: let it go now)
        self._sink = self._whole = self.on_backlog = self._listener = None
        if self._complete and not self._body and self._keep_alive and self._error is None:
            self._pool.put_back(self)
        else:
            self._drop_timer()
            self._abort()
            self._pool.forget(self)

    def close(self) -> None:
        self._drop_timer()
        self._abort()


class OriginPool:
    """Keep-alive connections to one backend origin."""

    def __init__(
        self,
        origin: Origin,
        *,
        max_connections: int,
        max_idle: int,
        keepalive_expiry: float,
        loop: asyncio.AbstractEventLoop | None = None,
        poke: Callable[[], None] | None = None,
    ) -> None:
        self.origin = origin
        self.poke = poke  # busy polling (router/fastpath/busypoll.py): bytes arrived
        self._max_connections = max_connections
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self.loop = loop or asyncio.get_running_loop()
        # insertion-ordered set: popitem() takes the most recently used (LIFO keeps few warm)
        self._idle: dict[Connection, None] = {}
        self._open: set[Connection] = set()
        # connects under way (``_connect``, on either path): each will be one of ``_open``
        self._connecting = 0
        self._max_idle = max_idle
        self._expiry = keepalive_expiry
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if origin.tls else None
        self._closed = False

    @property
    def open_connections(self) -> int:
        return len(self._open)

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    @property
    def connecting(self) -> int:
        """Connects under way: connections that count against ``max_connections`` already."""
        return self._connecting

    def forget(self, conn: Connection) -> None:
        if conn in self._open:
            self._open.discard(conn)
            self._wake_slot_waiter()
        self._idle.pop(conn, None)

    def _wake_slot_waiter(self) -> None:
        # (a woken waiter stays in the queue until it has run: ``has_room`` is False till then)
        for waiter in self._slot_waiters:
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _wait_for_slot(self, timeout: float) -> None:
        """Block while the pool is at ``max_connections`` and nothing is idle."""
        deadline = self.loop.time() + timeout
        while (
            len(self._open) + self._connecting >= self._max_connections
            and not self._idle
            and not self._closed
        ):
            waiter = self.loop.create_future()
            self._slot_waiters.append(waiter)
            try:
                async with asyncio.timeout_at(deadline):
                    await waiter
            except TimeoutError:
                raise UpstreamError(
                    "connect_timeout",
                    f"{self.origin.url}: all {self._max_connections} connections busy "
                    f"for {timeout:g}s",
                ) from None
            finally:
                if not waiter.done():
                    waiter.cancel()
                with contextlib.suppress(ValueError):  # (``close`` emptied the queue)
                    self._slot_waiters.remove(waiter)

    def put_back(self, conn: Connection) -> None:
        if self._closed or len(self._idle) >= self._max_idle or conn._transport is None:
            conn.close()
            self.forget(conn)
            return
        conn.idle_since = self.loop.time()
        conn.reused = True
        self._idle[conn] = None
        self._wake_slot_waiter()

    async def _connect(self, timeout: float) -> Connection:
        """A new connection, counted in ``_connecting`` until it is one of ``_open``."""
        self._connecting += 1
        try:
            conn = await self._open_one(timeout)
        except BaseException:
            self._connect_failed()
            raise
        self._connecting -= 1
        self._open.add(conn)
        return conn

    def _connect_failed(self) -> None:
        self._connecting -= 1
        self._wake_slot_waiter()  # (its slot is free again)

    async def _open_one(self, timeout: float) -> Connection:
        conn = Connection(self)
        try:
            async with asyncio.timeout(timeout):
                await self.loop.create_connection(
                    lambda: conn, self.origin.host, self.origin.port, ssl=self._ssl
                )
        except TimeoutError:
            raise UpstreamError(
                "connect_timeout", f"connect to {self.origin.url} timed out after {timeout:g}s"
            ) from None
        except socket.gaierror as exc:
            raise UnresolvedHost(
                "connect", f"cannot resolve {self.origin.host!r}: {exc.strerror or exc}"
            ) from None
        except OSError as exc:
            raise UpstreamError(
                "connect", f"cannot connect to {self.origin.url}: {exc.strerror or exc}"
            ) from None
        return conn

    def _take_idle(self) -> Connection | None:
        now = self.loop.time()
        while self._idle:
            conn, _ = self._idle.popitem()
            transport = conn._transport
            if transport is not None and not transport.is_closing():
                if now - conn.idle_since < self._expiry:
                    return conn
            conn.close()
            self.forget(conn)
        return None

    async def request(
        self,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        timeouts: Timeouts,
        on_stale: Callable[[], None] | None = None,
        first_event_peek: int = 0,
    ) -> Connection:
        """Send a request; return the connection once response headers are in (and, with
        ``first_event_peek``, a 200 event stream's first event: see ``Connection.exchange``).

        The caller owns the returned connection and must ``release()`` it. On error nothing is
        left open. A reused keep-alive connection that the server had already closed (both
        engines close idle ones after 5 s) is retried once on a fresh one (and ``on_stale``
        called): the engine never saw that request. One that timed out is not: the engine
        has it.
        """
        if self._closed:
            raise UpstreamError("connect", f"client for {self.origin.url} is closed")
        head = self.head(method, target, headers, body)
        head_only = method == b"HEAD"
        conn = self._take_idle()
        if conn is None:
            if len(self._open) + self._connecting >= self._max_connections:
                await self._wait_for_slot(timeouts.connect)
                conn = self._take_idle()
            if self._closed:  # (cut or closed while it waited: nothing was sent)
                raise UpstreamError("connect", f"client for {self.origin.url} is closed")
            if conn is None:
                conn = await self._connect(timeouts.connect)
        try:
            try:
                self._check_open()
                await conn.exchange(head, body, timeouts, head_only, first_event_peek)
            except UpstreamError as exc:
                if not conn.stale(exc):
                    raise
                if on_stale is not None:
                    on_stale()
                conn.release()
                conn = await self._connect(timeouts.connect)
                self._check_open()
                await conn.exchange(head, body, timeouts, head_only, first_event_peek)
        except BaseException:
            conn.close()
            self.forget(conn)
            raise
        return conn

    def _check_open(self) -> None:
        """Raise where the pool was cut or closed (while ``request`` connected: nothing sent;
        its ``except`` closes the connection)."""
        if self._closed:
            raise UpstreamError("connect", f"client for {self.origin.url} is closed")

    def take_idle(self) -> Connection | None:
        """A kept-alive connection to send on now, if there is one (and the pool is open)."""
        return None if self._closed else self._take_idle()

    @property
    def closed(self) -> bool:
        """Closed or cut: no request goes out on it any more."""
        return self._closed

    @property
    def has_room(self) -> bool:
        """Open, below ``max_connections`` with the connects under way counted, and no
        ``request`` waiting for a slot (it has the next one): a new connection may be opened now."""
        return (
            not self._closed
            and len(self._open) + self._connecting < self._max_connections
            and not self._slot_waiters
        )

    def connect_soon(self, timeout: float) -> asyncio.Task[Connection]:
        """A new connection, opened in a task of its own (its result, or ``UpstreamError``),
        for a caller served from socket callbacks (``router.forward.callback``), which has no
        coroutine to wait in. Once the task has its result the connection counts as open:
        the caller sends on it or closes it (``close`` then ``forget``). It counts against
        ``max_connections`` from now (a wave is decided in one loop turn, before any task runs)."""
        self._connecting += 1
        task = self.loop.create_task(self._open_one(timeout))
        task.add_done_callback(self._connected)  # (before the caller's: it runs first)
        return task

    def _connected(self, task: asyncio.Task[Connection]) -> None:
        if task.cancelled() or task.exception() is not None:
            self._connect_failed()
            return
        self._connecting -= 1
        self._open.add(task.result())

    def head(
        self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> bytes:
        """The request's head as ``request`` sends it."""
        parts = [method, b" ", self.origin.base_path, target, b" HTTP/1.1\r\nhost: "]
        parts += [self.origin.host_header, b"\r\n"]
        for name, value in headers:
            parts += [name, b": ", value, b"\r\n"]
        if body or method not in (b"GET", b"HEAD"):
            parts.append(b"content-length: %d\r\n" % len(body))
        parts.append(b"\r\n")
        return b"".join(parts)

    def close(self) -> None:
        """Abort every connection: used at shutdown, after in-flight requests were drained."""
        self._closed = True
        for conn in list(self._open):
            conn.close()
        self._idle.clear()
        self._wake_all_slot_waiters()

    def close_idle(self) -> None:
        """Close the kept-alive connections (the backend is draining: none will be reused)."""
        for conn in list(self._idle):
            conn.close()
            self.forget(conn)

    def cut(self, message: str) -> int:
        """End every exchange in progress as failed (kind ``drained``, so each request ends
        as on an upstream failure: a stream with an error event, else a 502) and refuse new
        ones; returns how many were cut (a connect under way counts: its request goes
        nowhere, ``request`` and the callback path see the pool closed once it is open)."""
        self._closed = True
        busy = [conn for conn in self._open if conn not in self._idle]
        for conn in busy:
            conn._fail("drained", f"{self.origin.url}: {message}")
            conn.close()
        self.close()
        return len(busy) + self._connecting

    def _wake_all_slot_waiters(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
