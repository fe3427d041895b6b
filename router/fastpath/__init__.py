"""The router's hot-path shortcuts: the only code that knows uvicorn's internals
(``uvicorn.py``), behind the ``Responder`` interface with a plain-ASGI twin (``responder.py``),
and busy polling (``busypoll.py``)."""

from __future__ import annotations

import asyncio

from router.asgi import Receive, Send
from router.fastpath.responder import PlainResponder, Responder
from router.fastpath.uvicorn import direct_send


class Responders:
    """Picks each response's responder: uvicorn's httptools fast path where it is recognised,
    else plain ASGI. Counts both, so that a fast path that quietly stopped engaging (uvicorn
    renamed what it relies on) shows in ``/router/status``."""

    __slots__ = ("_loop", "direct", "plain")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.direct = 0
        self.plain = 0

    def __call__(self, receive: Receive, send: Send) -> Responder:
        direct = direct_send(send)
        if direct is not None:
            self.direct += 1
            return direct
        self.plain += 1
        return PlainResponder(receive, send, self._loop)

    def status(self) -> dict[str, int]:
        return {"direct_responses": self.direct, "plain_responses": self.plain}
