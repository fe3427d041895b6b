"""The live page's feed under hand-written ASGI receive/send: one timer for all connections and
none without one; every connection released on every exit path (client gone under ASGI spec 2.3
and 2.4, shutdown, cancellation); a connection that cannot keep up skips to the newest."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from router.asgi import Message
from router.control.feed import Feed
from tests.support.http import await_for

pytestmark = pytest.mark.anyio

INTERVAL = 0.02


class Client:
    """One feed connection: records what it was sent; ``leave()`` is a disconnect."""

    def __init__(self, spec_24: bool = False, stall: asyncio.Event | None = None) -> None:
        self.messages: list[Message] = []
        self.left = asyncio.Event()
        self.spec_24 = spec_24
        self.stall = stall  # while unset, sends block (a client that does not read)
        self._requested = False

    async def receive(self) -> Message:
        if not self._requested:
            self._requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.left.wait()
        if self.spec_24:
            await asyncio.Event().wait()  # spec 2.4: receive() is not told; send() raises
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if self.spec_24 and self.left.is_set():
            raise OSError("client disconnected")
        if self.stall is not None:
            await self.stall.wait()
        self.messages.append(message)

    def leave(self) -> None:
        self.left.set()

    def snapshots(self) -> list[dict[str, Any]]:
        out = []
        for m in self.messages:
            body = m.get("body", b"")
            for line in body.decode().splitlines():
                if line.startswith("data: "):
                    out.append(json.loads(line[6:]))
        return out


async def _ready(value: bool) -> bool:
    return value


def counting_feed() -> tuple[Feed, list[int]]:
    made: list[int] = []

    def snapshot() -> dict[str, Any]:
        made.append(1)
        return {"made": len(made)}

    return Feed(snapshot, INTERVAL), made


async def test_one_timer_for_every_connection_and_none_without_any() -> None:
    feed, made = counting_feed()
    await asyncio.sleep(INTERVAL * 3)
    assert made == [] and feed.connections == 0  # nobody watching: no snapshots
    a, b = Client(), Client()
    tasks = [asyncio.create_task(feed.serve(c.receive, c.send)) for c in (a, b)]
    await await_for(lambda: _ready(len(a.snapshots()) >= 3 and len(b.snapshots()) >= 3))
    assert feed.connections == 2
    # two pages, one snapshot per tick: both saw the same ones
    seqs_a = [s["seq"] for s in a.snapshots()]
    assert seqs_a == sorted(seqs_a) and feed.seq == len(made)
    start = a.messages[0]
    assert start["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in start["headers"]
    a.leave()
    b.leave()
    await asyncio.gather(*tasks)
    assert feed.connections == 0
    await await_for(lambda: _ready(feed._task is None))
    count = len(made)
    await asyncio.sleep(INTERVAL * 3)
    assert len(made) == count  # the timer stopped with the last connection


@pytest.mark.parametrize("spec_24", [False, True], ids=["spec-2.3", "spec-2.4"])
async def test_a_client_that_leaves_is_released(spec_24: bool) -> None:
    feed, _ = counting_feed()
    client = Client(spec_24=spec_24)
    task = asyncio.create_task(feed.serve(client.receive, client.send))
    await await_for(lambda: _ready(len(client.snapshots()) >= 1))
    assert feed.connections == 1
    client.leave()
    await asyncio.wait_for(task, 5)
    assert feed.connections == 0


async def test_shutdown_ends_every_feed_with_a_complete_response() -> None:
    feed, _ = counting_feed()
    clients = [Client(), Client()]
    tasks = [asyncio.create_task(feed.serve(c.receive, c.send)) for c in clients]
    await await_for(lambda: _ready(all(c.snapshots() for c in clients)))
    feed.close()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert feed.connections == 0
    for c in clients:
        assert c.messages[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


async def test_cancellation_releases_the_connection() -> None:
    feed, _ = counting_feed()
    client = Client()
    task = asyncio.create_task(feed.serve(client.receive, client.send))
    await await_for(lambda: _ready(feed.connections == 1 and bool(client.snapshots())))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert feed.connections == 0


async def test_a_slow_client_skips_to_the_newest_snapshot() -> None:
    feed, made = counting_feed()
    stall = asyncio.Event()
    slow = Client(stall=stall)
    task = asyncio.create_task(feed.serve(slow.receive, slow.send))
    await await_for(lambda: _ready(len(made) >= 5))
    stall.set()  # it reads again: what it gets next is the newest, not a backlog
    await await_for(lambda: _ready(len(slow.snapshots()) >= 1))
    await await_for(lambda: _ready(len(made) >= 8))
    seqs = [s["seq"] for s in slow.snapshots()]
    assert len(seqs) < len(made)  # it was never sent the ones made while it stalled
    assert len(seqs) == len(set(seqs)) and seqs == sorted(seqs)
    slow.leave()
    await asyncio.wait_for(task, 5)
    assert feed.connections == 0


async def test_a_failing_snapshot_does_not_end_the_feed() -> None:
    calls: list[int] = []

    def snapshot() -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return {"n": len(calls)}

    feed = Feed(snapshot, INTERVAL)
    client = Client()
    task = asyncio.create_task(feed.serve(client.receive, client.send))
    await await_for(lambda: _ready(len(client.snapshots()) >= 2))
    assert [s["n"] for s in client.snapshots()][:2] == [1, 3]
    client.leave()
    await asyncio.wait_for(task, 5)
    assert feed.connections == 0
