"""The router's hot-path shortcuts: the only code that knows uvicorn's internals
(``uvicorn.py``), behind the ``Responder`` interface with a plain-ASGI twin (``responder.py``),
and busy polling (``busypoll.py``)."""

from __future__ import annotations

import asyncio

from router.asgi import Receive, Send
from router.fastpath.lane import LaneCycle
from router.fastpath.responder import PlainResponder, Responder
from router.fastpath.uvicorn import direct_send
from router.upstream.relay import RELAY_BUILT, relayed

STATUS_KEYS = ("lane_responses", "direct_responses", "plain_responses")


class Responders:
    """Picks each response's responder: the request's own ``LaneCycle`` under the router's
    protocol, uvicorn's httptools fast path where it is recognised, else plain ASGI. Counts
    each, so that a fast path that quietly stopped engaging (uvicorn renamed what it relies on)
    shows in ``/router/status``."""

    __slots__ = ("_loop", "lane", "direct", "plain")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.lane = 0
        self.direct = 0
        self.plain = 0

    def __call__(self, receive: Receive, send: Send) -> Responder:
        cycle = getattr(send, "__self__", None)
        if type(cycle) is LaneCycle:
            self.lane += 1
            return cycle
        direct = direct_send(send)
        if direct is not None:
            self.direct += 1
            return direct
        self.plain += 1
        return PlainResponder(receive, send, self._loop)

    def status(self) -> dict[str, int | bool]:
        return fast_path_status((self.lane, self.direct, self.plain))


def fast_path_status(counts: tuple[int, int, int] = (0, 0, 0)) -> dict[str, int | bool]:
    """``/router/status``'s ``fast_path``: responses by responder (``STATUS_KEYS``), and the
    reads of chunked streams that router.upstream.relay's C relay wrote (none where it is not
    built, ``raw_relay`` false: every read then goes the Python way)."""
    status: dict[str, int | bool] = dict(zip(STATUS_KEYS, counts, strict=True))
    status["raw_relay"] = RELAY_BUILT
    status["raw_reads"] = relayed()
    return status
