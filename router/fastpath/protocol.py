"""uvicorn's httptools protocol with what a reverse proxy facing the internet needs from it.

uvicorn has no timeout for receiving a request (checklist case 9, slowloris): its keep-alive
timer is cancelled by every byte that arrives, so a client that trickles one header byte at a
time, or opens a connection and sends nothing, holds it for ever (the gap behind
xorbitsai/inference PR #5213). ASGI code cannot help: an app is called only once the headers are
complete. So this protocol, a subclass of uvicorn's, puts one absolute deadline
(``request_timeout``) on receiving each request:

- from the connection's start (for its first request) or the request's first byte (for later
  ones on a keep-alive connection) until its headers are complete. Missed: a 408 in the OpenAI
  shape when part of a request came, a plain close when nothing did, and the app never sees it.
- the body, to the same deadline, is the app's to answer: at the deadline this protocol marks
  the scope (``REQUEST_EXPIRED``) and wakes the app's pending ``receive()``, and the proxy
  answers 408 itself (``router.forward.proxy``; ``REQUEST_STARTED`` in the scope tells it that
  this protocol keeps the deadline). For any other handler this protocol closes the connection
  ``BODY_GRACE`` seconds after the deadline if the body is still incomplete.

One timer per connection, armed lazily: a request moves the deadline (``_due``) and the timer,
when it fires early, re-arms itself for it (``router.timers.LazyTimer``): a timer armed and
cancelled for every phase of every request was a visible share of the router's CPU per small
request.

It also bounds a request's head, where uvicorn and httptools set no limit at all: more than
``MAX_HEAD_BYTES`` before the headers are complete, or more than ``MAX_HEADERS`` headers, get a
431 (Envoy's defaults: 60 KiB, 100 headers). And it answers a request that httptools cannot parse
(CR, LF or NUL in a header, a bad request line, conflicting framing) with a 400 in the OpenAI
shape, where uvicorn writes plain text.

Like ``router.fastpath.uvicorn``, this relies on uvicorn internals (the parser callbacks,
``cycle``, ``transport``); ``http_protocol`` returns uvicorn's plain ``"httptools"`` when they are
not what this was written for, and the router still enforces the body deadline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from router.errors import error_body
from router.fastpath.lean import IdleOnComplete, httptools_protocol
from router.timers import LazyTimer

log = logging.getLogger("spec_router.protocol")

REQUEST_STARTED = "spec_router.request_started"  # scope["extensions"] key: loop time
REQUEST_EXPIRED = "spec_router.request_expired"  # ... True once the body's deadline has passed
BODY_GRACE = 1.0  # lets the proxy's own 408 go first
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100
# After an error answer that ends the connection (400, 408, 431), how long it goes on reading
# and dropping what the client still sends before it closes: closing a socket with unread
# bytes sends a reset, which can destroy the answer before the client reads it (nginx's
# lingering_close). The client's own close ends it sooner.
LINGER = 2.0


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request already answered."""


def _response(status: bytes, body: bytes) -> bytes:
    head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
        status,
        len(body),
    )
    return head + b"connection: close\r\n\r\n" + body


_BASE = httptools_protocol(
    "on_message_begin",
    "on_headers_complete",
    "on_message_complete",
    "on_response_complete",
    "send_400_response",
    "_unset_keepalive_if_required",
    "timeout_keep_alive_handler",
)


def http_protocol(request_timeout: float) -> type[asyncio.Protocol] | str:
    """What to pass as uvicorn's ``http``: this protocol with ``request_timeout``, or plain
    ``"httptools"`` when uvicorn's internals are not the ones this was written for."""
    if _BASE is None:
        log.warning("uvicorn's httptools protocol is not as expected: no request-header deadline")
        return "httptools"
    return type("RouterHttpProtocol", (_DeadlineMixin, _BASE), {"request_timeout": request_timeout})


class _LingerOnClose:
    """The client's transport, as one request's cycle sees it, with a lingering ``close``."""

    __slots__ = ("_real", "close")

    def __init__(self, real: asyncio.Transport, close: Callable[[], None]) -> None:
        self._real = real
        self.close = close

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _DeadlineMixin(IdleOnComplete):
    """Mixed into uvicorn's ``HttpToolsProtocol`` by ``http_protocol``."""

    request_timeout = 30.0
    # (attributes of uvicorn's protocol this relies on)
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any
    scope: Any
    headers: list[tuple[bytes, bytes]]
    flow: Any
    pipeline: Any
    server_state: Any
    timeout_keep_alive: float
    timeout_keep_alive_handler: Callable[[], None]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the request's deadline (None: nothing due), and its one timer for the connection
        self._due: float | None = None
        self._timer = LazyTimer(self.loop, self._request_due, self._expired)
        self._woken = False  # the app was told its body's deadline passed
        self._started = 0.0  # when the request being received is due from (loop time)
        self._partial = False  # bytes of a request's head arrived, its headers are not complete
        self._in_body = False
        self._head_bytes = 0  # received while waiting for a head (a bound, not an exact count)
        self._refusal: bytes | None = None
        self._lingering = False  # answered and half-closed: reading only to drop it
        self._linger: asyncio.TimerHandle | None = None
        self._running: list[Any] = []  # responses under way behind ``self.cycle`` (``_behind``)
        self._idle_since: float | None = None  # the last response ended, nothing came since
        self._idle_timer = LazyTimer(self.loop, self._idle_due, self.timeout_keep_alive_handler)

    # -- uvicorn's protocol, extended -------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._started = self.loop.time()  # the first request is due from the connection's start
        self._arm(self._started + self.request_timeout)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        self._idle_since = None  # (busy: uvicorn's own data_received says so too, see below)
        if self._in_body:
            super().data_received(data)  # type: ignore[misc]
            return
        # Counted whole (this read may hold a body too): checked only if, once parsed, the
        # head is still incomplete. What httptools buffers is bounded by that plus one read.
        self._head_bytes += len(data)
        super().data_received(data)  # type: ignore[misc]
        if self._partial and not self._in_body and self._head_bytes > MAX_HEAD_BYTES:
            self._refuse(f"the request head is larger than {MAX_HEAD_BYTES} bytes")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        # (a pending timer keeps this protocol alive)
        self._timer.cancel()
        self._idle_timer.cancel()
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        self._idle_since = None
        for cycle in self._running:  # (see ``_behind``)
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
        self._running = []
        super().connection_lost(exc)  # type: ignore[misc]

    # -- the keep-alive timer, kept lazily -----------------------------------------------------
    # uvicorn makes a keep-alive timer after every response and cancels it at the next read: a
    # timer made and cancelled per request. Here the connection keeps one (router.timers): a
    # read marks the connection busy, a response's end marks it idle, and the timer closes it
    # only once it has been idle for the whole keep-alive.
    def _unset_keepalive_if_required(self) -> None:
        self._idle_since = None

    # (on_response_complete: router.fastpath.lean.IdleOnComplete's)

    def _mark_idle(self) -> None:
        self._idle_since = now = self.loop.time()
        self._idle_timer.arm(now + self.timeout_keep_alive)

    def _idle_due(self) -> float | None:
        """When the keep-alive passes, as of now; None while a request is in progress (the
        end of its response arms the timer again) or the connection is lingering (the linger's
        own timer ends it)."""
        if self._lingering:
            return None
        since = self._idle_since
        if since is None:
            cycle = self.cycle
            if (
                self._partial
                or self._in_body
                or self.pipeline
                or (cycle is not None and not cycle.response_complete)
            ):
                return None
            # bytes came that began no request (a stray CRLF): idle from now
            since = self._idle_since = self.loop.time()
        return since + self.timeout_keep_alive

    def on_message_begin(self) -> None:
        super().on_message_begin()  # type: ignore[misc]
        if self._due is None:  # a later request on a keep-alive connection
            self._started = self.loop.time()
            self._arm(self._started + self.request_timeout)
        self._partial = True
        self.scope["extensions"] = {REQUEST_STARTED: self._started}

    def on_headers_complete(self) -> None:
        self._disarm()
        if len(self.headers) > MAX_HEADERS:
            self._refuse(f"the request has more than {MAX_HEADERS} headers")
            raise _Refused()  # (uvicorn's data_received catches the parser's error)
        self._partial = False
        self._in_body = True
        self._woken = False
        self._arm(self._started + self.request_timeout)
        existing = self.cycle
        super().on_headers_complete()  # type: ignore[misc]
        if existing is not None and self.cycle is not existing and not existing.response_complete:
            self._behind(existing)  # this request was pipelined behind it

    def _behind(self, running: Any) -> None:
        """Keep the response under way when a pipelined request takes ``self.cycle``: uvicorn
        tells only ``self.cycle`` of a lost connection, and the handler still sending would not
        learn that its client left (``connection_lost``)."""
        self._running = [c for c in self._running if not c.response_complete]
        self._running.append(running)

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_body = False
        self._head_bytes = 0
        super().on_message_complete()  # type: ignore[misc]
        cycle = self.cycle
        if cycle is not None and cycle.response_complete and not self.pipeline:
            self._mark_idle()  # answered before its body was in (a 401, a 413): idle from here

    def send_400_response(self, msg: str) -> None:
        if self._refusal is not None:  # answered already (431)
            return
        body = error_body(f"invalid HTTP request: {msg}", "invalid_request_error", "invalid_http")
        if not self.transport.is_closing() and not self._lingering:
            self._answer_and_close(_response(b"400 Bad Request", body))

    def _refuse(self, message: str) -> None:
        self._disarm()
        body = error_body(message, "invalid_request_error", "headers_too_large")
        self._refusal = _response(b"431 Request Header Fields Too Large", body)
        if not self.transport.is_closing() and not self._lingering:
            self._answer_and_close(self._refusal)

    def _answer_and_close(self, response: bytes) -> None:
        """Write ``response`` and end the connection without losing it (``_linger_close``).

        Behind a response still under way (the request this one was pipelined behind), just
        close: that answer's writes would fail on a half-closed transport."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            self.transport.close()
            return
        self.transport.write(response)
        self._linger_close()

    def _linger_close(self) -> None:
        """End the connection after what was written, without a reset that could destroy it
        (see ``LINGER``): half close, drop what still comes, close at the client's close or
        after ``LINGER``."""
        transport = self.transport
        if self._lingering or transport.is_closing():
            return
        if not transport.can_write_eof():
            transport.close()
            return
        self._lingering = True
        transport.write_eof()
        self._linger = self.loop.call_later(LINGER, transport.close)

    # -- the deadline ---------------------------------------------------------------------------
    def _arm(self, when: float) -> None:
        self._due = when
        self._timer.arm(when)

    def _disarm(self) -> None:
        self._due = None  # a pending timer finds nothing due and ends

    def _request_due(self) -> float | None:
        return self._due

    def _expired(self) -> None:
        due = self._due
        assert due is not None  # (the timer fires only on a deadline that passed)
        self._due = None
        transport = self.transport
        if transport is None or transport.is_closing() or self._lingering:
            return
        owner: object = transport.get_protocol()
        if owner is not self:  # handed to a WebSocket protocol
            return
        cycle = self.cycle
        if self._in_body and any(not c.response_complete for c in self._running):
            # a pipelined request whose body this server stopped reading (uvicorn pauses
            # reading behind a response under way): its time starts again when that is done
            self._arm(self.loop.time() + self.request_timeout)
            return
        if self._in_body and not self._woken:
            # the app answers (the proxy's 408); closed after a grace if it does not
            self._woken = True
            self._arm(due + BODY_GRACE)
            if cycle is not None and not cycle.response_started:
                self.scope["extensions"][REQUEST_EXPIRED] = True
                # the answer ends the connection while the client may still be sending: its
                # close (uvicorn's, once the 408 is written) lingers too
                cycle.transport = _LingerOnClose(transport, self._linger_close)
                cycle.message_event.set()
            return
        if self._in_body:
            self._in_body = False
            if cycle is not None and cycle.response_started and not cycle.response_complete:
                cycle.keep_alive = False  # it is being answered: close once that is done
            elif cycle is not None and cycle.response_complete:
                self._linger_close()  # answered (a 413, say) while the body still trickles in
            else:
                transport.close()  # the handler sees a disconnect
            return
        if cycle is not None and not cycle.response_complete:
            # a pipelined request's head, behind a response still under way: end after it
            cycle.keep_alive = False
            return
        if self._partial:
            message = f"the request was not received within {self.request_timeout:g}s"
            body = error_body(message, "invalid_request_error", "request_timeout")
            self._answer_and_close(_response(b"408 Request Timeout", body))
            return
        transport.close()
