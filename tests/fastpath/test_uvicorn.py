"""The fast path (router/fastpath/uvicorn.py) on uvicorn's own httptools protocol, in process:
the protocol ``uvicorn router.app:app`` runs, driven as uvicorn's tests drive it (a transport
that keeps what is written, a loop whose clock the test moves). These hold DirectSend to the
uvicorn internals it relies on; ``make test-uvicorn`` runs them on the oldest and the newest
uvicorn the pin allows."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from router.fastpath.uvicorn import DirectSend, body_in, direct_send, why_not_direct
from tests.support.fakeloop import FakeLoop, Transport, settle

pytestmark = pytest.mark.anyio

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/event-stream")],
}


def post(body: bytes, length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return b"POST /v1/x HTTP/1.1\r\nhost: test\r\ncontent-length: %d\r\n\r\n%s" % (size, body)


class Writes(Transport):
    """Also counts the writes: the fast path's point is fewer of them."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data: bytes) -> None:
        super().write(data)
        self.writes += 1


def connect(app: App, protocol: type[Any] = HttpToolsProtocol) -> tuple[Any, Writes]:
    config = Config(
        app=app,
        lifespan="off",
        ws="none",
        log_config=None,
        proxy_headers=False,
        server_header=False,
        date_header=False,
    )
    made = protocol(config=config, server_state=ServerState(), app_state={}, _loop=FakeLoop())
    server = cast(Any, made)
    transport = Writes()
    transport.protocol = server
    server.connection_made(transport)  # (a stand-in: duck-typed)
    return server, transport


async def test_the_start_and_the_first_bytes_go_out_in_one_write_then_chunks_from_the_sink() -> (
    None
):
    seen: list[Any] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        direct = direct_send(send)
        assert isinstance(direct, DirectSend)
        await direct.send_all(
            [START, {"type": "http.response.body", "body": b"a", "more_body": True}]
        )
        sink = direct.body_sink(None, lambda: seen.append("first"))
        assert sink is not None
        seen.append(sink(b"bc"))  # from the upstream's socket callback, in the real proxy
        await direct.send_all([{"type": "http.response.body", "body": b"", "more_body": False}])

    server, transport = connect(app)
    server.data_received(post(b"{}"))
    await settle()
    assert seen == ["first", True]
    head, body = transport.take().split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 OK") and b"transfer-encoding: chunked" in head
    assert body == b"1\r\na\r\n2\r\nbc\r\n0\r\n\r\n"
    assert transport.writes == 3  # start + first bytes, the sink's chunk, the end
    assert server.cycle.response_complete and not transport.closed  # kept alive


async def test_a_whole_body_is_in_and_one_still_coming_is_not() -> None:
    answers: list[bool] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        answers.append(body_in(send))
        while (await receive()).get("more_body"):
            answers.append(body_in(send))
        answers.append(body_in(send))
        await send(START | {"headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    server, _ = connect(app)
    server.data_received(post(b"{}"))
    await settle()
    assert answers == [True, True]
    answers.clear()
    server.data_received(post(b"12", length=4))  # (the same connection, kept alive)
    await settle()
    assert answers == [False, False]  # not all in, before and after its first part
    server.data_received(b"34")
    await settle()
    assert answers == [False, False, True]


async def test_watch_reports_a_client_that_leaves_once() -> None:
    left: list[int] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        direct = direct_send(send)
        assert direct is not None
        direct.watch(lambda: left.append(1))
        await direct.send_all([START])
        await asyncio.Event().wait()  # streams until cancelled

    server, _ = connect(app)
    server.data_received(post(b"{}"))
    await settle()
    assert left == []
    server.connection_lost(None)
    await settle()
    assert left == [1]
    for task in server.tasks:
        task.cancel()


async def test_off_the_fast_path_the_reason_is_named() -> None:
    reasons: list[tuple[bool, str]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        reasons.append((direct_send(send) is None, why_not_direct(send)))
        await send(START | {"headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        reasons.append((direct_send(send) is None, why_not_direct(send)))

    for protocol in (H11Protocol, HttpToolsProtocol):
        server, _ = connect(app, protocol)
        server.data_received(post(b"{}"))
        await settle()
    h11, h11_after, tools, tools_after = reasons
    assert h11 == (True, "uvicorn's h11 server (--http h11)")
    assert h11_after[0] is True
    assert tools[0] is False  # (DirectSend: nothing to explain)
    assert tools_after == (True, "the response had already started")
