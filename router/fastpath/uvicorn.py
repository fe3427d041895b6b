"""The one place that knows uvicorn's internals: fast paths through its httptools server.

See ``DirectSend``, a ``Responder`` (``router.fastpath.responder``). Everything else in the
router talks plain ASGI; when uvicorn changes what this module relies on, ``direct_send``
returns None and the router falls back to plain ASGI (``Responders`` counts which was used).
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Callable
from typing import Any

from router.fastpath.responder import Sink, chunk_sink


class DirectSend:
    """Fast paths through uvicorn's httptools server for one response (see ``direct_send``).

    uvicorn's ``send`` writes every message to the socket on its own: the status line and
    headers, then each body chunk. That is one write per message and, for a streamed body, one
    task switch per chunk to reach ``send`` -- at thousands of streams a large share of the
    router's CPU. Two shortcuts, both leaving uvicorn's bookkeeping
    (framing, keep-alive, completion) to uvicorn:

    - ``send_all`` runs uvicorn's own ``send`` for several messages (the start and the
      body bytes already at hand) and puts what it wrote on the wire in one write;
    - ``body_sink`` frames each chunk of a chunked body and writes it straight to the
      client's transport, from the upstream connection's socket callback, but only while
      uvicorn's ``send`` would not have to wait (paused for a slow client, or gone).
    """

    __slots__ = ("_send", "_cycle", "_flow", "_transport", "_event")

    def __init__(self, send: Any, cycle: Any) -> None:
        self._send = send
        self._cycle = cycle
        self._flow = cycle.flow
        self._transport = cycle.transport
        self._event: _DisconnectEvent | None = None

    async def send_all(self, messages: list[dict[str, Any]]) -> None:
        if self.write_plain(messages):
            return
        cycle, real = self._cycle, self._transport
        held = _Held(real)
        cycle.transport = held
        try:
            for message in messages:
                await self._send(message)
        finally:
            cycle.transport = real
            if held.parts:
                real.write(b"".join(held.parts))
            if held.closed:
                real.close()

    def write_plain(self, messages: list[dict[str, Any]]) -> bool:
        """Write ``messages`` as uvicorn's ``send`` would, without it, where that is plain: a
        chunked body (its start without content-length, transfer-encoding or connection
        headers, on a kept-alive connection, no access log, not a HEAD, 204 or 304) and a client
        that can take it now. The same bytes in one write, the same state of uvicorn's cycle
        after it; False, having done nothing, anywhere else (uvicorn's own ``send`` then runs).
        uvicorn's ``send`` builds the head in Python one header at a time and is a coroutine
        per message: a visible share of a request's CPU (bench/results/fast-path.md, session 9).
        """
        cycle = self._cycle
        if _PLAIN is None or self._flow.write_paused or cycle.disconnected or cycle.access_log:
            return False
        parts: list[bytes] = []
        head = None
        # (a body under way: what uvicorn's send would add a chunk to)
        chunked = bool(cycle.chunked_encoding and not cycle.response_complete)
        ended = False
        for message in messages:
            kind = message["type"]
            if not cycle.response_started and head is None:
                if kind != "http.response.start":
                    return False
                head = _plain_head(cycle, message)
                if head is None:
                    return False
                parts.append(head)
                chunked = True
                continue
            if ended or kind != "http.response.body" or not chunked:
                return False
            body = message.get("body", b"")
            if body:
                parts.append(b"%x\r\n%b\r\n" % (len(body), body))
            if not message.get("more_body", False):
                parts.append(b"0\r\n\r\n")
                ended = True
        if head is not None:
            cycle.response_started = True
            cycle.waiting_for_100_continue = False
            cycle.chunked_encoding = True
        if parts:
            self._transport.write(b"".join(parts))
        if ended:
            cycle.response_complete = True
            cycle.message_event.set()
            if not cycle.keep_alive:
                self._transport.close()
            cycle.on_response()
        return True

    def write_start(self, head: bytes, body: bytes) -> None:
        """Write a chunked response's start, ``head`` as ``plain_head`` made it for this
        cycle (checked by the caller just before: no second pass over the headers), with its
        first body bytes: what ``write_plain`` writes for the two messages."""
        cycle = self._cycle
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        cycle.chunked_encoding = True
        self._transport.write(head + b"%x\r\n%b\r\n" % (len(body), body) if body else head)

    def watch(self, on_disconnect: Callable[[], None]) -> None:
        """Call ``on_disconnect`` (once) if the client goes away before the response is done.

        What a task blocked in ``receive()`` would learn, without the task: uvicorn marks the
        request ``disconnected`` and sets its ``message_event`` when the connection is lost, so
        the event is swapped for one that reports it. The request body must have been read.
        """
        cycle = self._cycle
        cycle.message_event = self._event = _DisconnectEvent(cycle, on_disconnect)
        if cycle.disconnected:
            on_disconnect()

    def unwatch(self) -> None:
        """Drop the references ``watch`` made (the request is over): uvicorn's request object
        and its event point at each other, and a cycle of them per request would be left to the
        garbage collector -- measurably slower under load."""
        if self._event is not None:
            self._event.detach()
            self._event = None

    def chunked(self) -> bool:
        """Whether the response under way has a chunked body that ``body_sink`` may add to."""
        cycle = self._cycle
        return bool(
            cycle.response_started
            and cycle.chunked_encoding
            and not cycle.response_complete
            and cycle.scope["method"] != "HEAD"
        )

    def ready(self) -> bool:
        """Whether uvicorn's ``send`` would write now (not paused for a slow client, not gone)."""
        return not (
            self._flow.write_paused or self._cycle.disconnected or self._transport.is_closing()
        )

    def body_sink(
        self, feed: Callable[[bytes], bytes] | None, first: Callable[[], None] | None
    ) -> Sink | None:
        """The ``Sink`` for a chunked body under way (``router.fastpath.responder.chunk_sink``: what
        ``ready()`` checks, and the chunk's framing, inlined)."""
        if not self.chunked():
            return None
        return chunk_sink(self._flow, self._cycle, self._transport, feed, first)


def plain_head_ready() -> bool:
    """Whether ``plain_head`` knows uvicorn's status lines and header checks."""
    return _PLAIN is not None and _HTTPTOOLS_SEND is not None


def plain_head(cycle: Any, start: dict[str, Any]) -> bytes | None:
    """``_plain_head``, None too where uvicorn's parts are not the ones this was written for."""
    return None if _PLAIN is None else _plain_head(cycle, start)


def _plain_head(cycle: Any, start: dict[str, Any]) -> bytes | None:
    """The status line and headers uvicorn's ``send`` writes for ``start`` where they are plain
    (see ``DirectSend.write_plain``), ending with ``transfer-encoding: chunked`` as uvicorn
    adds it; None anywhere else, or where uvicorn would refuse a header (its own checks).
    Joins and searches whole blocks, not one header at a time: a character class found in the
    joined names (or names and values) is found in one of them, and a name that only looks
    like framing (``x-connection-id``) just leaves the start to uvicorn."""
    assert _PLAIN is not None
    status_lines, bad_names, bad_values = _PLAIN
    status = start["status"]
    scope = cycle.scope
    if (
        status in (204, 304)
        or not cycle.keep_alive
        or cycle.chunked_encoding is not None
        or scope["method"] == "HEAD"
        or _CLOSE in scope["headers"]  # (uvicorn 0.30 closes on it with keep_alive still set)
    ):
        return None
    pairs = [*cycle.default_headers, *start.get("headers", ())]
    if not pairs:
        return status_lines[status] + _CHUNKED
    names = b"".join(map(_NAME, pairs))
    lower = names.lower()
    if b"content-length" in lower or b"transfer-encoding" in lower or b"connection" in lower:
        return None
    # uvicorn's checks, each a class of single bytes: the bytes it refuses, deleted (a control
    # character in a name is refused by its name check too)
    values = b"".join(map(b"".join, pairs))
    if len(names.translate(None, bad_names)) != len(names) or len(
        values.translate(None, bad_values)
    ) != len(values):
        return None
    if lower != names:
        pairs = [(name.lower(), value) for name, value in pairs]
    return b"%b%b\r\n%b" % (status_lines[status], b"\r\n".join(map(b": ".join, pairs)), _CHUNKED)


_NAME = operator.itemgetter(0)
_CLOSE = (b"connection", b"close")
_CHUNKED = b"transfer-encoding: chunked\r\n\r\n"


class _DisconnectEvent(asyncio.Event):
    """uvicorn's per-request event, which also reports a lost connection as it is set."""

    def __init__(self, cycle: Any, on_disconnect: Callable[[], None]) -> None:
        super().__init__()
        self._cycle = cycle
        self._on_disconnect: Callable[[], None] | None = on_disconnect

    def set(self) -> None:
        super().set()
        callback = self._on_disconnect
        if callback is not None and self._cycle.disconnected:
            self._on_disconnect = None
            callback()

    def detach(self) -> None:
        self._cycle = _GONE
        self._on_disconnect = None


class _Gone:
    disconnected = False


_GONE = _Gone()


class _Held:
    """Stands in for the client transport while uvicorn's ``send`` runs, keeping its writes."""

    __slots__ = ("parts", "closed", "_real")

    def __init__(self, real: Any) -> None:
        self.parts: list[bytes] = []
        self.closed = False
        self._real = real

    def write(self, data: bytes) -> None:
        self.parts.append(data)

    def close(self) -> None:
        self.closed = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def direct_send(send: Any) -> DirectSend | None:
    """A ``DirectSend`` when ``send`` is uvicorn's httptools server before its response has
    started; otherwise None, and the caller uses ``send`` as any ASGI app would."""
    if _HTTPTOOLS_SEND is None or getattr(send, "__func__", None) is not _HTTPTOOLS_SEND:
        return None
    cycle: Any = send.__self__
    try:
        if cycle.response_started:
            return None
        direct = DirectSend(send, cycle)
        direct.chunked()  # every attribute it relies on is there
        direct.ready()
        if not isinstance(cycle.message_event, asyncio.Event):
            return None
    except (AttributeError, KeyError):  # another uvicorn than the one this was written for
        return None
    return direct


def body_in(send: Any) -> bool:
    """Whether the request ``send`` answers has its whole body in, under uvicorn's httptools
    server: its ``receive()`` then answers at once, with nothing to wait for (or to time)."""
    if _HTTPTOOLS_SEND is None or getattr(send, "__func__", None) is not _HTTPTOOLS_SEND:
        return False
    cycle: Any = send.__self__
    return getattr(cycle, "more_body", True) is False and not getattr(cycle, "disconnected", True)


def why_not_direct(send: Any) -> str:
    """Why ``direct_send`` gives no ``DirectSend`` for ``send``, in words for the log."""
    owner = getattr(send, "__self__", None)
    where = f"{type(owner).__module__}.{type(owner).__qualname__}" if owner is not None else None
    if _HTTPTOOLS_SEND is None:
        return "uvicorn's httptools server is not available here"
    if getattr(send, "__func__", None) is _HTTPTOOLS_SEND:
        if owner is not None and getattr(owner, "response_started", False):
            return "the response had already started"
        return f"uvicorn {_uvicorn_version()}'s httptools server is not the one it was written for"
    if where is not None and "h11" in where:
        return "uvicorn's h11 server (--http h11)"
    return f"the server's send is {where or repr(send)}, not uvicorn's httptools server's"


def _uvicorn_version() -> str:
    try:
        import uvicorn
    except ImportError:  # (not reached: _HTTPTOOLS_SEND came from it)
        return "?"
    return str(uvicorn.__version__)


def _httptools_send() -> Any:
    try:
        from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
    except ImportError:  # uvicorn without httptools: no direct path
        return None
    return RequestResponseCycle.send


_HTTPTOOLS_SEND = _httptools_send()


def _plain_parts() -> tuple[dict[int, bytes], bytes, bytes] | None:
    """uvicorn's status lines, and the bytes its header name and value checks refuse, for
    ``_plain_head``; None without them, or when a check is not one class of single bytes."""
    try:
        from uvicorn.protocols.http import httptools_impl
    except ImportError:
        return None
    try:
        lines = httptools_impl.STATUS_LINE
        checks = (httptools_impl.HEADER_RE, httptools_impl.HEADER_VALUE_RE)
    except AttributeError:  # another uvicorn than the one this was written for
        return None
    refused = []
    for check in checks:
        pattern = check.pattern
        if not (isinstance(pattern, bytes) and pattern[:1] == b"[" and pattern[-1:] == b"]"):
            return None
        refused.append(bytes(c for c in range(256) if check.fullmatch(bytes((c,)))))
    return lines, refused[0], refused[1]


_PLAIN = _plain_parts()
