"""The relay of a chunked stream's common case in C (router/upstream/_relay.c), where it was built.

``Relay(flow, cycle, transport, tap, strip).raw(data)`` writes one read of the engine's chunked
body to the client as it came, framing and all, when the read is whole chunks the SSE tap would
pass unchanged and the client can take them now; else it writes nothing and returns False, and
the read goes the Python way (httptools, the tap, ``router.fastpath.responder.chunk_sink``),
as every read does where the extension was not built (``RELAY_BUILT``). It removes the Python
calls per chunk that were most of the router's CPU per stream at 20 chunks
(bench/results/overhead-harnesses.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from router.upstream.stream import BodyTap, SseTap

if TYPE_CHECKING:
    from router.upstream._relay import Relay

Raw = Callable[[bytes], bool]

_Relay: type[Relay] | None
try:
    from router.upstream._relay import Relay as _Relay
    from router.upstream._relay import relayed as _relayed
except ImportError:  # no compiler where it was installed: the Python path does it all
    _Relay = None

    def _relayed() -> int:
        return 0


RELAY_BUILT = _Relay is not None


def raw_relay(flow: Any, cycle: Any, transport: Any, tap: SseTap | BodyTap | None) -> Raw | None:
    """``Relay.raw`` for a response under way, or None: where the extension is not built, and
    for a ``BodyTap`` (a whole body kept for its usage: it must see every byte)."""
    if _Relay is None or not (tap is None or type(tap) is SseTap):
        return None
    raw: Raw = _Relay(flow, cycle, transport, tap, tap is not None and tap.strips_usage).raw
    return raw


def relayed() -> int:
    """How many reads ``Relay.raw`` wrote in this process (``/router/status``'s ``raw_reads``)."""
    return _relayed()
