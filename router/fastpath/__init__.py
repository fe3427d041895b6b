"""The router's hot-path shortcut under uvicorn's httptools server: ``DirectSend``
(``uvicorn.py``, the only code that knows uvicorn's internals), behind the ``Responder``
interface with a plain-ASGI twin for every other server (``responder.py``); and the request
deadline and head limits of ``spec-router serve``'s protocol (``protocol.py``)."""

from __future__ import annotations

import asyncio
import logging

from router.asgi import Receive, Send
from router.fastpath.responder import PlainResponder, Responder
from router.fastpath.uvicorn import direct_send, why_not_direct

log = logging.getLogger("spec_router.fastpath")

# responses by responder
STATUS_KEYS = ("direct_responses", "plain_responses")


class Responders:
    """Picks each response's responder: ``DirectSend`` under uvicorn's httptools server, plain
    ASGI anywhere else. Counts each, so that a fast path that quietly stopped engaging shows in
    ``/router/status``, and says once in the log why a request went the plain way (``--http
    h11``, another server, a uvicorn whose internals are not the ones this was written for)."""

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
        if not self.plain:
            log.warning(
                "proxied responses take the plain ASGI path, not the fast path (%s): more CPU "
                "per response; uvicorn's httptools server (its default) has the fast path",
                why_not_direct(send),
            )
        self.plain += 1
        return PlainResponder(receive, send, self._loop)

    def status(self) -> dict[str, int]:
        return fast_path_status((self.direct, self.plain))


def fast_path_status(counts: tuple[int, int] = (0, 0)) -> dict[str, int]:
    """``/router/status``'s ``fast_path``: responses by responder (``STATUS_KEYS``)."""
    return dict(zip(STATUS_KEYS, counts, strict=True))
