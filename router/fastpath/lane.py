"""The proxied request's own response cycle under the router's HTTP protocol (the lane).

Under uvicorn's httptools server each request runs as an ASGI task on uvicorn's
``RequestResponseCycle``: its scope is completed, the app dispatches on the path, and every
response message goes through uvicorn's generic ``send`` (header checks, framing, access log).
For the router's hot path that shape cost about as much CPU as the router's own work per request
(``bench/server_shape.py``; issue 14). The router's protocol (``router.fastpath.protocol``) gives
a proxied request (``POST /v1/...``) a ``LaneCycle`` instead: the same state under the same
names, so uvicorn's protocol parses into it, queues pipelined requests behind it, reports a lost
connection to it and shuts it down as it does its own cycle, but the proxy runs on it directly,
and it is also the proxy's ``Responder`` (``router.fastpath.responder``): each answer goes out
in one write, framed here, and a chunked body is written from the upstream's socket callback.

What it leaves out, a request that needs it is not given a lane and goes through uvicorn's
cycle as before (``_DeadlineMixin._lane`` in ``router.fastpath.protocol``): ``Expect:
100-continue``, upgrades, an access log, ``limit_concurrency``, a root path, a path with
escapes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from router.errors import error_body
from router.fastpath.responder import Sink, chunk_sink
from router.upstream.relay import Raw, raw_relay

if TYPE_CHECKING:
    from router.upstream.stream import BodyTap, SseTap

log = logging.getLogger("spec_router.lane")


def _status_lines() -> dict[int, bytes]:
    try:
        from uvicorn.protocols.http.httptools_impl import STATUS_LINE
    except ImportError:
        return {}
    return dict(STATUS_LINE)


_STATUS_LINE = _status_lines()
_NO_BODY = frozenset({204, 304})


def status_line(status: int) -> bytes:
    line = _STATUS_LINE.get(status)
    return line if line is not None else b"HTTP/1.1 %d \r\n" % status


class _Event:
    """The request's message event, as uvicorn's protocol sets it (a body arrived, the request
    is complete, the connection was lost, its deadline passed), with the lane's disconnect
    report: cheaper than an ``asyncio.Event`` and a task to watch it."""

    __slots__ = ("_cycle", "_set", "_waiter")

    def __init__(self, cycle: LaneCycle) -> None:
        self._cycle: LaneCycle | None = cycle
        self._set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        cycle = self._cycle
        if cycle is not None and cycle.disconnected:
            callback = cycle.on_disconnect
            if callback is not None:
                cycle.on_disconnect = None
                callback()

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        if self._set:
            return
        cycle = self._cycle
        assert cycle is not None
        waiter = self._waiter = cycle.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def detach(self) -> None:
        self._cycle = None


class LaneCycle:
    """One proxied request and its response on a connection of the router's protocol."""

    __slots__ = (
        "scope",
        "transport",
        "flow",
        "loop",
        "message_event",
        "on_response",
        "on_disconnect",
        "default_headers",
        "disconnected",
        "keep_alive",
        "waiting_for_100_continue",
        "body",
        "more_body",
        "response_started",
        "response_complete",
        "chunked_encoding",
        "_length",
    )

    def __init__(
        self,
        scope: dict[str, Any],
        transport: asyncio.Transport,
        flow: Any,
        loop: asyncio.AbstractEventLoop,
        keep_alive: bool,
        on_response: Callable[[], None],
        default_headers: list[tuple[bytes, bytes]],
    ) -> None:
        self.scope = scope
        self.transport = transport
        self.flow = flow
        self.loop = loop
        self.message_event = _Event(self)
        self.on_response = on_response
        self.on_disconnect: Callable[[], None] | None = None
        self.default_headers = default_headers
        # (the names below are uvicorn's ``RequestResponseCycle``'s: its protocol uses them)
        self.disconnected = False
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = False
        self.body = bytearray()
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        self.chunked_encoding = False
        self._length = 0  # body bytes still due under a content-length

    # -- the request's task (started by the router's protocol; by uvicorn's when pipelined) ---
    async def run_asgi(self, app: Any) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            if isinstance(exc, Exception):
                log.error("exception in the proxy", exc_info=exc)
            # (a cancellation: uvicorn's shutdown, past its graceful wait)
            if not self.response_started and not self.disconnected:
                self._write_messages([_FAILED_START, _FAILED_BODY])
            else:
                self.transport.close()
            if not isinstance(exc, Exception):
                raise
        else:
            if not self.response_started and not self.disconnected:
                log.error("the proxy returned without starting a response")
                self._write_messages([_FAILED_START, _FAILED_BODY])
            elif not self.response_complete and not self.disconnected:
                self.transport.close()  # a body cut short: the client must see it broken
        finally:
            self.on_response = _nothing
            self.on_disconnect = None
            self.message_event.detach()

    # -- ASGI -------------------------------------------------------------------------------
    async def receive(self) -> dict[str, Any]:
        if not self.disconnected and not self.response_complete:
            self.flow.resume_reading()
            event = self.message_event
            await event.wait()
            event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        message = {"type": "http.request", "body": bytes(self.body), "more_body": self.more_body}
        self.body = bytearray()
        return message

    async def send(self, message: dict[str, Any]) -> None:
        await self.send_all([message])

    # -- Responder ----------------------------------------------------------------------------
    async def send_all(self, messages: list[dict[str, Any]]) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return  # (as uvicorn's send: the proxy learns it from ``watch``)
        self._write_messages(messages)

    def watch(self, on_disconnect: Callable[[], None]) -> None:
        self.on_disconnect = on_disconnect
        if self.disconnected:
            self.on_disconnect = None
            on_disconnect()

    def unwatch(self) -> None:
        self.on_disconnect = None

    def body_sink(
        self, feed: Callable[[bytes], bytes] | None, first: Callable[[], None] | None
    ) -> Sink | None:
        if not self._chunked_under_way():
            return None
        return chunk_sink(self.flow, self, self.transport, feed, first)

    def body_relay(self, tap: SseTap | BodyTap | None) -> Raw | None:
        if not self._chunked_under_way():
            return None
        return raw_relay(self.flow, self, self.transport, tap)

    def _chunked_under_way(self) -> bool:
        """A chunked body has started and not ended: one a sink may add to."""
        return self.response_started and self.chunked_encoding and not self.response_complete

    # -- framing ------------------------------------------------------------------------------
    def _write_messages(self, messages: list[dict[str, Any]]) -> None:
        if not messages:
            return
        parts: list[bytes] = []
        for message in messages:
            if self.response_complete:
                raise RuntimeError(f"unexpected ASGI message {message['type']!r} after the end")
            if not self.response_started:
                if message["type"] != "http.response.start":
                    raise RuntimeError(f"expected http.response.start, got {message['type']!r}")
                self._start(message, parts)
                continue
            if message["type"] != "http.response.body":
                raise RuntimeError(f"expected http.response.body, got {message['type']!r}")
            body = message.get("body", b"")
            more = message.get("more_body", False)
            if self.chunked_encoding:
                if body:
                    parts.append(b"%x\r\n%b\r\n" % (len(body), body))
                if not more:
                    parts.append(b"0\r\n\r\n")
            else:
                if len(body) > self._length:
                    raise RuntimeError("response content longer than its content-length")
                self._length -= len(body)
                if body:
                    parts.append(body)
            if not more:
                if self._length:
                    raise RuntimeError("response content shorter than its content-length")
                self.response_complete = True
        transport = self.transport
        if parts:
            transport.write(b"".join(parts))
        if self.response_complete:
            self.message_event.set()
            if not self.keep_alive:
                transport.close()
            self.on_response()

    def _start(self, message: dict[str, Any], parts: list[bytes]) -> None:
        self.response_started = True
        status: int = message["status"]
        parts.append(status_line(status))
        length: int | None = None
        headers = message.get("headers", ())
        if self.default_headers:
            headers = [*self.default_headers, *headers]
        for name, value in headers:
            # (the proxy's headers: the upstream's, parsed by httptools, and its own)
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and b"close" in value.lower():
                self.keep_alive = False
                continue
            elif name == b"transfer-encoding":
                continue  # (framed here)
            parts += [name, b": ", value, b"\r\n"]
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        if length is not None:
            self._length = length
            parts.append(b"\r\n")
        elif status in _NO_BODY:
            parts.append(b"\r\n")
        else:
            self.chunked_encoding = True
            parts.append(b"transfer-encoding: chunked\r\n\r\n")


def _nothing() -> None:
    pass


_FAILED = error_body("internal error in the router", "server_error", "internal_error")
_FAILED_START = {
    "type": "http.response.start",
    "status": 500,
    "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(_FAILED)),
        (b"connection", b"close"),
    ],
}
_FAILED_BODY = {"type": "http.response.body", "body": _FAILED, "more_body": False}
