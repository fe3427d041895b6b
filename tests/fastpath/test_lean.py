"""uvicorn's httptools protocol with one keep-alive sweep for all connections
(router/fastpath/lean.py), in process: the protocol on a transport that keeps what is written
and a loop whose clock the test moves, as tests/fastpath/test_protocol.py drives
``spec-router serve``'s; and its adoption from the lifespan of ``uvicorn router.app:app``."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any, cast

import pytest
from uvicorn.config import Config
from uvicorn.lifespan.on import LifespanOn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from router.fastpath.lean import SWEEP_GRAIN, KeepAliveSweep, adopt
from tests.support.fakeloop import FakeLoop, Transport, settle

pytestmark = pytest.mark.anyio

KEEP_ALIVE = 5.0
EARLY = 0.0625  # (a binary fraction: the sums are exact)

GET = b"GET / HTTP/1.1\r\nhost: test\r\n\r\n"
SLOW = b"GET /slow HTTP/1.1\r\nhost: test\r\n\r\n"


class App:
    """Answers 200 ``ok``; ``/slow`` waits for ``release`` first."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        if scope["path"] == "/slow":
            await self.release.wait()
        headers = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})


def config(app: Any) -> Config:
    made = Config(
        app=app,
        lifespan="off",
        ws="none",
        log_config=None,
        proxy_headers=False,
        server_header=False,
        date_header=False,
        timeout_keep_alive=KEEP_ALIVE,  # type: ignore[arg-type]  # (uvicorn hints int)
    )
    made.load()
    return made


class Server:
    """uvicorn's config with the lean protocol adopted on a fake loop; connections to it."""

    def __init__(self) -> None:
        self.app = App()
        self.loop = FakeLoop()
        self.config = config(self.app)
        assert self.config.http_protocol_class is HttpToolsProtocol

    def adopt(self) -> None:
        assert adopt(LifespanOn(self.config).receive, cast(Any, self.loop))

    def connect(self) -> Connection:
        return Connection(self)


class Connection:
    def __init__(self, server: Server) -> None:
        self.loop = server.loop
        made = server.config.http_protocol_class(  # type: ignore[call-arg]
            config=server.config, server_state=ServerState(), app_state={}, _loop=server.loop
        )
        self.protocol: Any = cast(Any, made)
        self.transport = Transport()
        self.transport.protocol = self.protocol
        self.protocol.connection_made(self.transport)  # (a stand-in: duck-typed)

    async def send(self, data: bytes) -> None:
        self.protocol.data_received(data)
        await settle()


@pytest.fixture
async def server() -> Server:
    made = Server()
    made.adopt()
    return made


async def test_adopt_puts_the_lean_protocol_in_place_of_uvicorns_httptools_one() -> None:
    made = Server()
    made.adopt()
    lean = made.config.http_protocol_class
    assert issubclass(lean, HttpToolsProtocol) and lean is not HttpToolsProtocol
    # twice (a second lifespan on the same config): uvicorn's plain one is gone, nothing changes
    assert not adopt(LifespanOn(made.config).receive, cast(Any, made.loop))
    assert made.config.http_protocol_class is lean


async def test_adopt_leaves_any_other_protocol_and_any_other_server_alone() -> None:
    h11 = Config(app=App(), http="h11", ws="none", lifespan="off", log_config=None)
    h11.load()
    before = h11.http_protocol_class
    assert not adopt(LifespanOn(h11).receive)
    assert h11.http_protocol_class is before

    async def receive() -> dict[str, str]:  # another server's lifespan: no uvicorn config
        return {"type": "lifespan.startup"}

    assert not adopt(receive)


async def test_an_idle_connection_is_closed_after_its_keep_alive_at_most_a_grain_late(
    server: Server,
) -> None:
    c = server.connect()
    await c.send(GET)
    assert c.transport.take().startswith(b"HTTP/1.1 200 OK")
    await c.loop.advance(KEEP_ALIVE - EARLY)
    assert not c.transport.closed
    await c.loop.advance(EARLY + SWEEP_GRAIN)
    assert c.transport.closed


async def test_a_request_in_the_keep_alive_moves_it_to_the_end_of_its_answer(
    server: Server,
) -> None:
    c = server.connect()
    await c.send(GET)
    await c.loop.advance(3.0)
    await c.send(GET)  # the first answer's entry is still queued ...
    await c.loop.advance(3.0)  # ... and is swept now, in the second idle spell: skipped
    assert not c.transport.closed
    await c.loop.advance(KEEP_ALIVE - 3.0 - EARLY)
    assert not c.transport.closed
    await c.loop.advance(EARLY + SWEEP_GRAIN)
    assert c.transport.closed


async def test_a_request_answered_past_the_keep_alive_keeps_its_connection(
    server: Server,
) -> None:
    c = server.connect()
    await c.send(GET)
    await c.send(SLOW)
    await c.loop.advance(KEEP_ALIVE + 1.0)  # the first answer's entry is swept while it is served
    assert not c.transport.closed
    server.app.release.set()
    await c.loop.advance(KEEP_ALIVE - EARLY)
    assert not c.transport.closed
    await c.loop.advance(EARLY + SWEEP_GRAIN)
    assert c.transport.closed


async def test_one_timer_serves_many_connections_and_skips_those_gone(server: Server) -> None:
    kept = [server.connect() for _ in range(3)]
    gone = server.connect()
    for c in [*kept, gone]:
        await c.send(GET)
    assert len(server.loop.pending()) == 1  # one timer for all four
    gone.protocol.connection_lost(None)
    await server.loop.advance(KEEP_ALIVE + SWEEP_GRAIN)
    assert all(c.transport.closed for c in kept)
    assert server.loop.pending() == []


async def test_the_sweep_does_not_keep_a_closed_connection_alive(server: Server) -> None:
    c = server.connect()
    await c.send(GET)
    c.protocol.connection_lost(None)
    protocol = c.protocol
    del c
    assert len(server.config.http_protocol_class.sweep) == 1  # type: ignore[attr-defined]
    ref = weakref.ref(protocol)
    del protocol
    gc.collect()
    assert ref() is None
    await server.loop.advance(KEEP_ALIVE + SWEEP_GRAIN)  # (its entry finds nothing)
    assert server.loop.pending() == []


async def test_the_sweep_goes_off_at_most_once_per_grain() -> None:
    loop = FakeLoop()
    sweep = KeepAliveSweep(cast(Any, loop), grain=0.5)
    closed: list[int] = []

    class Idle:
        def __init__(self, n: int) -> None:
            self.n = n
            self.idle_since = 0.0

        def timeout_keep_alive_handler(self) -> None:
            closed.append(self.n)

    idle = [Idle(n) for n in range(10)]
    for n, protocol in enumerate(idle):  # answers ending 0.1 s apart
        loop.now = protocol.idle_since = n * 0.1
        sweep.idle(protocol, protocol.idle_since, protocol.idle_since + 1.0)
    fired = 0
    while loop.pending():
        timer = min(loop.pending(), key=lambda t: t.when())
        loop.timers.remove(timer)
        loop.now = timer.when()
        timer.callback(*timer.args)
        fired += 1
    assert closed == list(range(10))
    assert fired <= 3  # (0.9 s of deadlines, a grain of 0.5 s)
