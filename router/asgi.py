"""ASGI type aliases and the client's disconnect, shared by the router's raw ASGI handlers and
the sims."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class ClientGone(Exception):
    """The client disconnected (``http.disconnect``, or ``send`` failed): nothing more can be
    sent to it."""
