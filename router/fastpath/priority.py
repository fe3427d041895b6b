"""New requests before the chunks of running streams: the writes of diverted chunks wait,
for at most ``delay``, while the router starts a request (from its body being in until it is
decided).

Under waves of new connections (clients that reconnect per stream and start together) a
request's first byte waits behind everything the loop does in its turns, most of which is
relaying the chunks of streams already running: a write to a client per chunk, the larger
part of a chunk's cost. A chunk a few milliseconds late costs a running stream little; a
request's first byte behind hundreds of them is its TTFT. So while ``starting`` > 0 a
``chunk_sink`` keeps its framed chunks (``Held``) instead of writing them; they go out, in
order, per stream in one write, when no request is starting any more, when ``delay`` has
passed since the first one was kept, or before anything else is written to that client (its
end, an error event: ``Held.flush`` from the proxy). ``delay`` 0 writes every chunk at once.
"""

from __future__ import annotations

import asyncio
from typing import Any


class Held:
    """One stream's kept chunks (framed), for ``write`` (its client's transport)."""

    __slots__ = ("parts", "write", "closing", "queued")

    def __init__(self, write: Any, closing: Any) -> None:
        self.parts: list[bytes] = []
        self.write = write
        self.closing = closing
        self.queued = False  # in the gate's list of streams with kept chunks

    def flush(self) -> None:
        """Write what is kept (nothing once the client's transport is closing)."""
        parts = self.parts
        if parts:
            data = parts[0] if len(parts) == 1 else b"".join(parts)
            parts.clear()
            if not self.closing():
                self.write(data)

    def drop(self) -> None:
        self.parts.clear()


class Priority:
    """Counts the requests the router is starting and holds chunk writes meanwhile."""

    __slots__ = ("_loop", "delay", "starting", "kept", "writes", "_held", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        self._loop = loop
        self.delay = delay
        self.starting = 0
        self.kept = 0  # chunks kept back, in all (for /router/status)
        self.writes = 0  # the writes of the flushes that sent them
        self._held: list[Held] = []
        self._timer: asyncio.TimerHandle | None = None

    def begin(self) -> None:
        self.starting += 1

    def end(self) -> None:
        self.starting -= 1
        if not self.starting and self._held:
            self.flush()

    def hold(self, held: Held, data: bytes) -> None:
        """Keep ``data`` for ``held``'s stream until the next flush."""
        held.parts.append(data)
        self.kept += 1
        if not held.queued:
            held.queued = True
            self._held.append(held)
            if self._timer is None:
                self._timer = self._loop.call_later(self.delay, self.flush)

    def flush(self) -> None:
        """Write every stream's kept chunks, in the order the streams first kept one."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        held, self._held = self._held, []
        for one in held:
            one.queued = False
            if one.parts:
                self.writes += 1
                one.flush()
