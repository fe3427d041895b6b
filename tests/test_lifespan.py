"""The lifespan reports start-up and shutdown failures as what they are (ASGI lifespan spec).

Driven with hand-written receive/send, as Starlette tests its own lifespan: uvicorn asserts
against a ``lifespan.startup.failed`` sent after start-up completed, and the real error is lost.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from router.app import RouterApp
from router.asgi import Message
from router.settings import Settings

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def no_gc_tuning(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lifespan tunes the process's garbage collector for a server; not this one's."""
    monkeypatch.setattr("router.lifecycle.tune_gc", lambda: None)


class Boom(RuntimeError):
    pass


async def drive(app: RouterApp, shutdown: bool = True) -> list[Message]:
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    sent: list[Message] = []
    await inbox.put({"type": "lifespan.startup"})

    async def receive() -> Message:
        return await inbox.get()

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "lifespan.startup.complete" and shutdown:
            await inbox.put({"type": "lifespan.shutdown"})

    with pytest.raises(Boom):
        await app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
    return sent


def settings() -> Settings:
    # nothing listens on these ports: the poller just keeps probing until it is stopped
    return Settings(speculative_urls=["http://127.0.0.1:9"], baseline_urls=["http://127.0.0.1:10"])


def fail(*args: Any) -> None:
    raise Boom("the poller failed")


async def test_a_shutdown_failure_is_reported_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    app = RouterApp(settings())

    async def stop() -> None:
        fail()

    monkeypatch.setattr(app.poller, "stop", stop)
    sent = await drive(app)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.failed"]
    assert "the poller failed" in sent[-1]["message"]


async def test_a_startup_failure_is_reported_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    app = RouterApp(settings())
    monkeypatch.setattr(app.poller, "start", fail)
    sent = await drive(app)
    assert [m["type"] for m in sent] == ["lifespan.startup.failed"]
    assert "the poller failed" in sent[-1]["message"]
