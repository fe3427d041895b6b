"""The live page's feed: one snapshot of the router a second, as Server-Sent Events.

Snapshots are made on the feed's own timer, once per interval however many pages are open, and
only while at least one is: the hot path never builds one, and an idle router with no page open
runs no timer at all. Every connection sends the latest snapshot when it is made (a connection
that cannot keep up skips to the newest, it never queues them), and is counted in
``connections`` from its first byte to its end on every path: the client leaves (seen by a
watcher blocked in ``receive()``, or by ``send`` raising under ASGI spec 2.4), the router shuts
down (``close``), or the task is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from router.asgi import Receive, Send

log = logging.getLogger("spec_router.ui")

HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    # a buffering reverse proxy in front (nginx) would hold the events back
    (b"x-accel-buffering", b"no"),
]
# EventSource reconnects by itself after this many milliseconds when a feed ends.
RETRY_MS = 2000


class _Subscriber:
    __slots__ = ("wake", "gone")

    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.gone = False


class Feed:
    def __init__(self, snapshot: Callable[[], dict[str, Any]], interval: float) -> None:
        self.snapshot = snapshot
        self.interval = interval
        self.seq = 0  # snapshots made so far
        self.closed = False
        self._message = b""
        self._subscribers: set[_Subscriber] = set()
        self._task: asyncio.Task[None] | None = None

    @property
    def connections(self) -> int:
        """Feed connections open now."""
        return len(self._subscribers)

    def close(self) -> None:
        """The router is shutting down: every feed ends now (a browser retries later)."""
        self.closed = True
        for sub in self._subscribers:
            sub.wake.set()

    # -- the timer --------------------------------------------------------------------------
    def publish(self) -> None:
        """Make one snapshot and wake every connection to send it."""
        try:
            doc = self.snapshot()
            doc["seq"] = self.seq + 1
            data = json.dumps(doc, separators=(",", ":"), allow_nan=False)
        except Exception:
            log.exception("live page snapshot failed")
            return
        self.seq += 1
        self._message = f"id: {self.seq}\ndata: {data}\n\n".encode()
        for sub in self._subscribers:
            sub.wake.set()

    async def _run(self) -> None:
        try:
            while self._subscribers and not self.closed:
                self.publish()
                await asyncio.sleep(self.interval)
        finally:
            self._task = None

    def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    # -- one connection ---------------------------------------------------------------------
    async def serve(self, receive: Receive, send: Send) -> None:
        """The whole response to one ``GET /router/ui/events``."""
        sub = _Subscriber()
        self._subscribers.add(sub)
        watcher = asyncio.get_running_loop().create_task(_watch(receive, sub))
        try:
            self._start()
            await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
            hello = f"retry: {RETRY_MS}\n\n".encode()
            await send({"type": "http.response.body", "body": hello, "more_body": True})
            sent = 0
            while not (sub.gone or self.closed):
                if self.seq > sent:
                    sent = self.seq
                    body = self._message
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                    continue
                sub.wake.clear()
                await sub.wake.wait()
            if not sub.gone:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client went away while we wrote to it (ASGI spec 2.4)
        finally:
            self._subscribers.discard(sub)
            watcher.cancel()


async def _watch(receive: Receive, sub: _Subscriber) -> None:
    """Wait for the client to go away (``http.disconnect``), then wake its connection."""
    with contextlib.suppress(OSError):
        while (await receive())["type"] != "http.disconnect":
            pass
    sub.gone = True
    sub.wake.set()
