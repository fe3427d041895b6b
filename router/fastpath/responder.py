"""How the proxy answers a client: one interface, a plain-ASGI implementation, and (in
``router.fastpath.uvicorn``) a faster one for uvicorn's httptools server.

A responder sends the response's messages (several at once where it can write them together),
reports a client that goes away before the response is done, and may offer a ``Sink``
that writes the rest of a chunked body straight to the client from the upstream's socket
callback. ``send_all`` raises ``OSError`` when the client is gone (ASGI spec 2.4).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from router.asgi import Receive, Send

# Takes body bytes from the upstream's socket callback. Returns True once it has written them
# (what its ``feed`` made of them) to the client, or False, having consumed nothing, when the
# client cannot take them now (it is slow, or gone).
Sink = Callable[[bytes], bool]


def chunk_sink(
    flow: Any,
    cycle: Any,
    transport: Any,
    feed: Callable[[bytes], bytes] | None,
    first: Callable[[], None] | None,
) -> Sink:
    """A ``Sink`` writing each call's bytes as one chunk of a chunked body to ``transport``,
    while the client can take it (``flow`` not paused for a slow client, ``cycle`` not
    disconnected, the transport not closing). The ready check and the framing are inlined: it
    runs for every chunk of every stream (``bench/lab/chunk_path.py`` times it)."""
    write, closing = transport.write, transport.is_closing

    def sink(data: bytes) -> bool:
        nonlocal first
        if flow.write_paused or cycle.disconnected or closing():
            return False
        if first is not None:
            first()
            first = None
        if feed is not None:
            data = feed(data)
        if data:
            write(b"%x\r\n%b\r\n" % (len(data), data))
        return True

    return sink


# Takes a whole chunk of the upstream's chunked body as it came (``data``, its payload
# ``data[start:end]``): True once it has written it to the client unchanged, framing and all;
# False, having done nothing, when the chunk must take the ``Sink``'s way (see ``chunk_whole``).
WholeChunk = Callable[[bytes, int, int], bool]


def chunk_whole(
    flow: Any,
    cycle: Any,
    transport: Any,
    plain: Callable[[bytes, int, int], bool] | None,
) -> WholeChunk:
    """The ``chunk_sink``'s twin for a whole upstream chunk whose size line is the one it
    would write (``router.upstream.client.Connection.divert``'s ``whole``): written as it came,
    one write, no re-framing, while the client can take it and ``plain`` (when given: the
    tap's ``SseTap.plain``) says its payload passes the tap unchanged; else False, and the
    chunk goes through the parser to ``chunk_sink``, which sees it as always."""
    write, closing = transport.write, transport.is_closing

    def whole(data: bytes, start: int, end: int) -> bool:
        if flow.write_paused or cycle.disconnected or closing():
            return False
        if plain is not None and not plain(data, start, end):
            return False
        write(data)
        return True

    return whole


class Responder(Protocol):
    async def send_all(self, messages: list[dict[str, Any]]) -> None: ...

    def watch(self, on_disconnect: Callable[[], None]) -> None:
        """Call ``on_disconnect`` (once) if the client leaves before the response is done.
        The request body must have been read."""

    def unwatch(self) -> None: ...

    def body_sink(
        self, feed: Callable[[bytes], bytes] | None, first: Callable[[], None] | None
    ) -> Sink | None:
        """A ``Sink`` that writes the rest of a chunked body straight to the client, once the
        response has started: each call's bytes through ``feed`` (when given), framed as one
        chunk; ``first`` (when given) is called once, before the first bytes it takes."""


class PlainResponder:
    """Any ASGI server: messages one by one, a task blocked in ``receive()`` for disconnects."""

    __slots__ = ("_receive", "_send", "_loop", "_watcher")

    def __init__(self, receive: Receive, send: Send, loop: asyncio.AbstractEventLoop) -> None:
        self._receive = receive
        self._send = send
        self._loop = loop
        self._watcher: asyncio.Task[None] | None = None

    async def send_all(self, messages: list[dict[str, Any]]) -> None:
        for message in messages:
            await self._send(message)

    def watch(self, on_disconnect: Callable[[], None]) -> None:
        self._watcher = self._loop.create_task(_watch(self._receive, on_disconnect))

    def unwatch(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    def body_sink(
        self, feed: Callable[[bytes], bytes] | None, first: Callable[[], None] | None
    ) -> Sink | None:
        return None


async def _watch(receive: Receive, on_disconnect: Callable[[], None]) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            on_disconnect()
            return
