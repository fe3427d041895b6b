"""ASGI plumbing the simulator needs and a framework would hide: disconnect watching,
resetting a connection mid-body, plain responses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Callable
from typing import Any

from router.asgi import ClientGone, Receive, Send
from router.sim.protocol import BadRequest

MAX_BODY = 16 * 1024 * 1024
JSON = [(b"content-type", b"application/json")]


class Watch:
    """Waits for the client's ``http.disconnect`` (read after the body), then sets ``gone``
    and calls ``on_gone``."""

    def __init__(self, receive: Receive) -> None:
        self.gone = asyncio.Event()
        self.on_gone: Callable[[], None] | None = None
        self.task = asyncio.get_running_loop().create_task(self._run(receive))

    async def _run(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone.set()
        if self.on_gone is not None:
            self.on_gone()


class SimulatedReset(Exception):
    """Raised to make the server drop a connection when its transport is out of reach."""


class DropSimulatedReset(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, SimulatedReset)


def reset_connection(send: Send) -> None:
    """Drop the client's TCP connection with an RST, mid-body if need be.

    uvicorn does not put the transport in the scope; its ``send`` is a bound method of the
    request cycle that holds it. With ``SO_LINGER`` 0, ``abort()`` sends RST, not FIN. Failing
    that, raising makes uvicorn close the connection (a FIN, still an incomplete body).
    """
    transport: Any = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None or not (
        hasattr(transport, "abort") and hasattr(transport, "get_extra_info")
    ):
        raise SimulatedReset  # uvloop's transports are not asyncio.Transport subclasses
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    head = [*(JSON if headers is None else headers), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


async def read_body(receive: Receive) -> bytes:
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        part = message.get("body", b"")
        size += len(part)
        if size > MAX_BODY:
            raise BadRequest("request body too large")
        parts.append(part)
        if not message.get("more_body", False):
            return b"".join(parts)
