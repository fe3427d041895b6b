"""A connection served from the protocol's callbacks (``router.forward.callback``) is freed as it
closes, not left in a reference cycle for the garbage collector (review s12 finding 7): the
router in process on a real loopback socket, with the collector off."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from router.app import RouterApp
from router.fastpath import lean
from router.forward.callback import callback_protocol
from router.settings import Settings
from tests.fastpath.test_fast_path_e2e import post
from tests.support.bulk_upstream import BulkUpstream
from tests.support.http import await_for

pytestmark = pytest.mark.anyio

STREAM = (
    b'{"model": "sim", "max_tokens": 8, "stream": true, '
    b'"messages": [{"role": "user", "content": "hi"}]}'
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def serving(app: RouterApp) -> AsyncIterator[tuple[tuple[str, int], list[Any], ServerState]]:
    """The router's callback protocol on a loopback port; the protocols it made (weakly)."""
    loop = asyncio.get_running_loop()
    app.streams.proxy = app.proxy
    extend = callback_protocol(app.streams)
    assert extend is not None
    made: Any = lean.lean_protocol(loop, extend=extend)
    assert made is not None
    config = Config(
        app=app, lifespan="off", ws="none", log_config=None, proxy_headers=False, access_log=False
    )
    config.load()
    state = ServerState()
    refs: list[Any] = []

    def factory() -> Any:
        protocol = made(config=config, server_state=state, app_state={})
        refs.append(weakref.ref(protocol))
        return protocol

    server = await loop.create_server(factory, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[:2], refs, state
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("connect", [True, False])
async def test_a_callback_connection_is_freed_without_the_collector(connect: bool) -> None:
    with (
        BulkUpstream(size=64, events=4).running() as spec,
        BulkUpstream(size=64, events=4).running() as base,
    ):
        settings = Settings(
            speculative_urls=spec.url, baseline_urls=base.url, callback_connect=connect
        )
        app = RouterApp(settings)
        async with app.running(), serving(app) as (address, refs, state):
            enabled = gc.isenabled()
            gc.disable()
            try:

                async def ready() -> bool:
                    return all(app.usable_pools().values())

                async def gone() -> bool:
                    return not state.connections and app.tracker.total == 0

                await await_for(ready)
                # streams served whole, then their client closes: the first finds no idle
                # upstream connection (the callbacks open one, or it is handed to the
                # coroutine), the second is served from the callbacks on the one kept alive
                for _ in range(2):
                    reader, writer = await asyncio.open_connection(*address)
                    writer.write(post("/v1/chat/completions", STREAM))
                    await reader.readuntil(b"0\r\n\r\n")
                    writer.close()
                    await writer.wait_closed()
                    await await_for(gone)
                    await await_for(lambda: _dead(refs[-1]))
                assert app.streams.status() == {
                    "callback_streams": 2 if connect else 1,
                    "callback_handed": 0 if connect else 1,
                    "callback_connected": 1 if connect else 0,
                }
                # a client that leaves mid-body (its head in, half its body sent)
                reader, writer = await asyncio.open_connection(*address)
                whole = post("/v1/chat/completions", STREAM)
                writer.write(whole[: len(whole) - len(STREAM) // 2])
                await writer.drain()
                await await_for(lambda: _connected(state))
                writer.close()
                await writer.wait_closed()
                await await_for(gone)
                await await_for(lambda: _dead(refs[2]))
            finally:
                if enabled:
                    gc.enable()


async def _dead(ref: Any) -> bool:
    """(polled: the transport drops its protocol a loop turn after ``connection_lost``)"""
    return ref() is None


async def _connected(state: ServerState) -> bool:
    return bool(state.connections)
