"""The lean protocol's connection (router/fastpath/lean.py), over real loopback sockets on both
event loops: the scope's addresses as uvicorn's own protocol gives them, without uvicorn's
per-connection look-ups (a socket object, getsockname, getpeername, the loop)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from router.fastpath import lean
from tests.support.loops import on_both_loops  # noqa: F401 (the fixture)

pytestmark = pytest.mark.anyio

GET = b"GET /where HTTP/1.1\r\nhost: test\r\n\r\n"


async def served_to(protocol_class: type[Any] | None) -> tuple[Any, Any]:
    """(what the app saw: client, server, scheme; what the client's socket says: its own
    address, the server's) for one request over a fresh connection."""
    seen: list[tuple[Any, Any, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        seen.append((scope["client"], scope["server"], scope["scheme"]))
        headers = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    config = Config(app=app, lifespan="off", ws="none", log_config=None, proxy_headers=False)
    config.load()
    made = protocol_class or config.http_protocol_class
    state = ServerState()
    loop = asyncio.get_running_loop()
    # (uvloop and asyncio make a server's protocol with no arguments: no loop given)
    server = await loop.create_server(
        lambda: made(config=config, server_state=state, app_state={}),  # type: ignore[call-arg]
        "127.0.0.1",
        0,
    )
    try:
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        writer.write(GET)
        await reader.readuntil(b"ok")
        mine = (writer.get_extra_info("sockname"), writer.get_extra_info("peername"))
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
        await server.wait_closed()
    assert len(seen) == 1
    return seen[0], mine


async def test_the_lean_protocol_gives_the_app_the_addresses_uvicorns_gives() -> None:
    loop = asyncio.get_running_loop()
    lean_class: Any = lean.lean_protocol(loop)
    assert lean_class is not None and lean_class.addresses  # (this uvicorn's connection_made)
    theirs, their_sockets = await served_to(HttpToolsProtocol)
    ours, our_sockets = await served_to(lean_class)
    for (client, server, scheme), (me, them) in ((theirs, their_sockets), (ours, our_sockets)):
        assert client == (str(me[0]), me[1])
        assert server == (str(them[0]), them[1])
        assert scheme == "http"
    assert {type(x) for x in (*theirs[0], *ours[0])} == {str, int}


async def test_a_connection_made_unlike_uvicorns_known_one_is_left_to_uvicorn() -> None:
    """Where uvicorn's ``connection_made`` uses other names than the one the lean protocol
    stands in for, it runs uvicorn's own (and the app still sees its addresses)."""

    class Other(HttpToolsProtocol):
        def connection_made(self, transport: Any) -> None:
            self.something_new = transport.get_extra_info("peercert")
            super().connection_made(transport)

    assert lean._addresses_ready(HttpToolsProtocol)
    assert not lean._addresses_ready(Other)
    loop = asyncio.get_running_loop()
    lean_class = lean.lean_protocol(loop)
    assert lean_class is not None
    fallback: type[Any] = type("Fallback", (lean_class,), {"addresses": False})
    (client, server, scheme), (me, them) = await served_to(fallback)
    assert client == (str(me[0]), me[1]) and server == (str(them[0]), them[1])
