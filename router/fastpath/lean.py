"""uvicorn's own httptools protocol, with one keep-alive timer for all of a server's connections.

uvicorn arms a keep-alive timer at the end of every response (``loop.call_later``) and cancels
it at the next read or at the connection's close: a timer made and dropped per request, 3-4 us
each in process (``bench/results/fast-path.md``, session 9). Here every response's end is one
entry in a queue that one timer for the whole server sweeps (``KeepAliveSweep``): a connection
still idle since that response when its keep-alive has passed is closed, as uvicorn closes it,
at most ``SWEEP_GRAIN`` late. Nothing else of uvicorn's protocol changes.

``spec-router serve`` has its own protocol (``router.fastpath.protocol``). Under ``uvicorn
router.app:app`` the router's lifespan puts this one in the place of uvicorn's plain httptools
protocol (``adopt``), before uvicorn opens its socket: uvicorn reads its config's protocol
class for each connection. Any other protocol (``--http h11``, a class of the user's, another
uvicorn whose internals are not the ones this was written for) is left as it is.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from router.timers import CLOCK_SLACK, LazyTimer

log = logging.getLogger("spec_router.fastpath")

# How late past its keep-alive an idle connection may be closed (seconds): the sweep's timer
# goes off at most once per grain, however many responses end in it.
SWEEP_GRAIN = 0.05


class KeepAliveSweep:
    """One timer for the keep-alive of every connection of a server.

    ``idle(protocol, since, due)`` files a connection that went idle at ``since`` (loop time)
    and is to be closed at ``due`` if it still is; entries are filed in order of ``due`` (one
    keep-alive for all), so the sweep looks only at the queue's head. A connection busy again,
    idle again since, or gone is skipped (a weak reference: a closed connection is not kept)."""

    __slots__ = ("_queue", "_timer", "loop", "grain")

    def __init__(self, loop: asyncio.AbstractEventLoop, grain: float = SWEEP_GRAIN) -> None:
        self.loop = loop
        self.grain = grain
        self._queue: deque[tuple[float, weakref.ref[Any], float]] = deque()
        self._timer = LazyTimer(loop, self._due, self._sweep)

    def idle(self, protocol: Any, since: float, due: float) -> None:
        self._queue.append((due, weakref.ref(protocol), since))
        self._timer.arm(due + self.grain)  # (a timer pending no later is kept: no new one)

    def _due(self) -> float | None:
        queue = self._queue
        return queue[0][0] if queue else None

    def _sweep(self) -> None:
        queue = self._queue
        now = self.loop.time() + CLOCK_SLACK
        while queue and queue[0][0] <= now:
            _, ref, since = queue.popleft()
            protocol = ref()
            if protocol is not None and protocol.idle_since == since:
                protocol.timeout_keep_alive_handler()
        if queue:
            self._timer.arm(queue[0][0] + self.grain)

    def __len__(self) -> int:
        return len(self._queue)


def _addresses_ready(base: type[Any]) -> bool:
    """Whether uvicorn's ``connection_made`` is the one ``_SweptKeepAlive.connection_made``
    stands in for (by the names it uses: another uvicorn's keeps its own)."""
    made = getattr(getattr(base, "connection_made", None), "__code__", None)
    return made is not None and set(made.co_names) <= _MADE_NAMES


# (the names uvicorn's connection_made uses, 0.30 to 0.55)
_MADE_NAMES = frozenset(
    {
        "connections",
        "add",
        "transport",
        "flow",
        "FlowControl",
        "server",
        "get_local_addr",
        "client",
        "get_remote_addr",
        "scheme",
        "is_ssl",
        "logger",
        "level",
        "TRACE_LOG_LEVEL",
        "log",
    }
)


def _local_addr(transport: Any) -> tuple[str, int | None] | None:
    """uvicorn's ``get_local_addr``, from the address the transport noted when it was made
    (uvloop keeps it: no socket object and no ``getsockname`` per connection)."""
    info = transport.get_extra_info("sockname")
    if isinstance(info, tuple | list) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    if isinstance(info, str):
        return (info, None)
    return None


def _remote_addr(transport: Any) -> tuple[str, int] | None:
    """uvicorn's ``get_remote_addr``, as ``_local_addr`` (no ``getpeername``)."""
    info = transport.get_extra_info("peername")
    if isinstance(info, tuple | list) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    return None


def httptools_protocol(*needed: str) -> type[Any] | None:
    """uvicorn's ``HttpToolsProtocol`` when it has every method in ``needed`` (what a protocol
    built on it overrides or calls), else None: uvicorn without httptools, or one whose
    internals moved."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # uvicorn without httptools
        return None
    if not all(hasattr(HttpToolsProtocol, name) for name in needed):
        return None
    return HttpToolsProtocol


_BASE = httptools_protocol(
    "on_response_complete", "_unset_keepalive_if_required", "timeout_keep_alive_handler"
)


def _flow_and_trace() -> tuple[Any, int]:
    try:
        from uvicorn.logging import TRACE_LOG_LEVEL
        from uvicorn.protocols.http.flow_control import FlowControl
    except ImportError:  # (no uvicorn: no lean protocol either)
        return None, 5
    return FlowControl, TRACE_LOG_LEVEL


_FLOW, _TRACE = _flow_and_trace()


class IdleOnComplete:
    """uvicorn's ``on_response_complete`` without its per-response keep-alive timer: the
    connection marks itself idle (``_mark_idle``) and its own timer closes it once the
    keep-alive has passed. Shared by the router's protocols (this module's and
    ``router.fastpath.protocol``'s)."""

    # (attributes of uvicorn's protocol this relies on)
    transport: asyncio.Transport
    flow: Any
    pipeline: Any
    server_state: Any

    def _mark_idle(self) -> None:
        raise NotImplementedError

    def on_response_complete(self) -> None:
        if self.pipeline:  # uvicorn's starts the request pipelined behind: no timer there
            super().on_response_complete()  # type: ignore[misc]
            return
        # (uvicorn's, but for the timer)
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        self._mark_idle()


class _SweptKeepAlive(IdleOnComplete):
    """Mixed into uvicorn's ``HttpToolsProtocol`` by ``lean_protocol``."""

    sweep: KeepAliveSweep  # (set on the class lean_protocol makes)
    addresses: bool  # (ditto) connection_made's addresses as the transport noted them
    # (attributes of uvicorn's protocol this relies on)
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    flow: Any
    pipeline: Any
    server_state: Any
    timeout_keep_alive: float
    connections: set[Any]
    server: Any
    client: Any
    scheme: str
    logger: logging.Logger

    idle_since: float | None = None  # the last response ended then, nothing came since

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        # (uvloop makes a server's protocol with no loop: uvicorn's would look it up, a
        # getpid() per connection on Python 3.11; the sweep's is the serving loop)
        super().__init__(config, server_state, app_state, _loop or self.sweep.loop)  # type: ignore[call-arg]

    def connection_made(self, transport: Any) -> None:
        if not self.addresses:
            super().connection_made(transport)  # type: ignore[misc]
            return
        # uvicorn's, with the addresses the transport noted at accept (``_local_addr``): a
        # connection for each of tail.py's streams (its load generator reconnects each time)
        self.connections.add(self)
        self.transport = transport
        self.flow = _FLOW(transport)
        self.server = _local_addr(transport)
        self.client = _remote_addr(transport)
        self.scheme = "https" if transport.get_extra_info("sslcontext") else "http"
        if self.logger.level <= _TRACE:
            prefix = "{}:{} - ".format(*self.client) if self.client else ""
            self.logger.log(_TRACE, "%sHTTP connection made", prefix)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)  # type: ignore[misc]
        # uvicorn's request object points back at its protocol (``on_response``, a bound
        # method): with ``cycle`` dropped here the connection's objects are freed as it closes,
        # not left in a reference cycle to the garbage collector. tail.py makes a connection
        # per stream; its young collections took 7-20 ms each, every ~0.85 s (session 12,
        # bench/results/fast-path.md). Whatever still runs for the request holds its own.
        self.cycle = None

    def _unset_keepalive_if_required(self) -> None:
        # (uvicorn's: a read, or the connection's close, cancels its keep-alive timer)
        self.idle_since = None

    def _mark_idle(self) -> None:
        self.idle_since = now = self.loop.time()
        self.sweep.idle(self, now, now + self.timeout_keep_alive)


def lean_protocol(
    loop: asyncio.AbstractEventLoop, extend: Callable[[type[Any]], type[Any]] | None = None
) -> type[asyncio.Protocol] | None:
    """uvicorn's httptools protocol with the shared keep-alive sweep, for connections served
    on ``loop`` (``extend``: a subclass of it made by the layer above, the router's callback
    streams: ``router.forward.callback``); None where uvicorn's internals are not the ones
    this was written for."""
    if _BASE is None:
        return None
    sweep = KeepAliveSweep(loop)
    attrs = {"sweep": sweep, "addresses": _addresses_ready(_BASE)}
    lean: type[Any] = type("LeanHttpToolsProtocol", (_SweptKeepAlive, _BASE), attrs)
    return lean if extend is None else extend(lean)


def adopt(
    receive: Any,
    loop: asyncio.AbstractEventLoop | None = None,
    extend: Callable[[type[Any]], type[Any]] | None = None,
) -> bool:
    """From the app's lifespan, under ``uvicorn router.app:app``: put ``lean_protocol`` in
    place of uvicorn's plain httptools protocol in the config of the server that runs this
    lifespan (``receive`` is its lifespan's), for connections served on ``loop`` (default: the
    running one), extended by ``extend`` when given. True when it did; anything but uvicorn's
    plain httptools protocol is left as it is."""
    config = getattr(getattr(receive, "__self__", None), "config", None)
    if _BASE is None or config is None or getattr(config, "http_protocol_class", None) is not _BASE:
        return False
    lean = lean_protocol(loop if loop is not None else asyncio.get_running_loop(), extend)
    if lean is None:  # (not reached: _BASE is there)
        return False
    config.http_protocol_class = lean
    log.info("client connections: uvicorn's httptools protocol, one keep-alive timer for all")
    return True
