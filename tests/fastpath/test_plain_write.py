"""``DirectSend.send_all`` writes a plain chunked response without uvicorn's ``send``
(``write_plain``): held to uvicorn's own ``send`` on twin request cycles of the uvicorn
installed (``make test-uvicorn`` runs this under the oldest and the newest supported), for
every shape of start and message list the proxy sends and the ones it must leave to uvicorn:
the same bytes, the same close, the same state of the cycle, the same error."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from router.fastpath.uvicorn import DirectSend, direct_send, plain_head
from tests.support.transport import KeptTransport

pytestmark = pytest.mark.anyio

STATE = (
    "response_started",
    "response_complete",
    "chunked_encoding",
    "expected_content_length",
    "keep_alive",
    "waiting_for_100_continue",
)

SSE = [(b"content-type", b"text/event-stream"), (b"x-spec-router-pool", b"speculative")]
HEADS = {
    "sse": SSE,
    "upper-case name": [(b"Content-Type", b"text/event-stream"), (b"X-Thing", b"A b")],
    "content-length": [(b"content-type", b"application/json"), (b"content-length", b"2")],
    "transfer-encoding": [*SSE, (b"transfer-encoding", b"chunked")],
    "connection close": [*SSE, (b"connection", b"close")],
    "bad name": [(b"bad name", b"x")],
    "bad value": [(b"x-a", b"1\x01")],
    "tab in value": [(b"x-a", b"1\t2")],  # (uvicorn 0.30 refuses a tab, later ones take it)
    "framing look-alike": [*SSE, (b"x-connection-id", b"7")],
    "none": [],
}
START = {"type": "http.response.start", "status": 200}


def body(data: bytes, more: bool) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


# the lists the proxy sends (router.forward.proxy), and a few it never does
SEQUENCES: dict[str, list[Any]] = {
    "start": ["start"],
    "start+chunk": ["start", body(b"data: 1\n\n", True)],
    "start+end": ["start", body(b"", False)],
    "start+chunk+end": ["start", body(b"ab", True), body(b"c", False)],
    "start+last": ["start", body(b"data: [DONE]\n\n", False)],
    "empty chunk": ["start", body(b"", True), body(b"", False)],
    "two starts": ["start", "start"],
    "after the end": ["start", body(b"", False), body(b"x", True)],
    "no start": [body(b"x", True)],
}


class Request:
    """A real uvicorn request cycle on a transport that keeps what is written."""

    def __init__(
        self, keep_alive: bool, method: str, access_log: bool, defaults: bool, close: bool = False
    ) -> None:
        self.transport = KeptTransport()
        self.responses = 0
        defaults_ = [(b"server", b"uvicorn"), (b"date", b"Mon, 07 Dec 2026 00:00:00 GMT")]
        scope = {
            "type": "http",
            "method": method,
            "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions",
            "query_string": b"",
            "http_version": "1.1",
            "client": ("127.0.0.1", 1),
            # (uvicorn 0.30 keeps keep_alive for a request's "connection: close" and closes
            # on the header itself; later ones clear keep_alive)
            "headers": [(b"connection", b"close")] if close else [],
        }
        self.cycle = RequestResponseCycle(
            scope=scope,  # type: ignore[arg-type]
            transport=self.transport,  # type: ignore[arg-type]
            flow=FlowControl(self.transport),  # type: ignore[arg-type]
            logger=logging.getLogger("test.plain"),
            access_logger=logging.getLogger("test.plain.access"),
            access_log=access_log,
            default_headers=defaults_ if defaults else [],
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=keep_alive,
            on_response=self._responded,
        )

    def _responded(self) -> None:
        self.responses += 1

    def seen(self) -> tuple[Any, ...]:
        c = self.cycle
        return (
            b"".join(self.transport.written),
            self.transport.closed,
            self.responses,
            c.message_event.is_set(),
            *(getattr(c, name) for name in STATE),
        )


async def by_uvicorn(request: Request, messages: list[dict[str, Any]]) -> str | None:
    try:
        for message in messages:
            await request.cycle.send(message)  # type: ignore[arg-type]
    except RuntimeError as exc:
        return str(exc)
    return None


async def by_direct(request: Request, messages: list[dict[str, Any]]) -> str | None:
    direct = direct_send(request.cycle.send)
    assert isinstance(direct, DirectSend)
    try:
        await direct.send_all(messages)
    except RuntimeError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(
    ("head", "sequence", "status", "method"),
    [
        *itertools.product(HEADS, ["start+chunk", "start+chunk+end"], [200], ["POST"]),
        *itertools.product(["sse"], SEQUENCES, [200], ["POST"]),
        *itertools.product(["sse", "none"], ["start+chunk+end"], [200, 204, 304, 502], ["POST"]),
        ("sse", "start+chunk+end", 200, "HEAD"),
    ],
)
@pytest.mark.parametrize(
    ("keep_alive", "close"), [(True, False), (False, True), (True, True), (False, False)]
)
@pytest.mark.parametrize("access_log", [False, True])
async def test_send_all_writes_what_uvicorns_send_writes(
    head: str,
    sequence: str,
    status: int,
    method: str,
    keep_alive: bool,
    close: bool,
    access_log: bool,
) -> None:
    start = {**START, "status": status, "headers": HEADS[head]}
    messages = [start if m == "start" else m for m in SEQUENCES[sequence]]
    seen = []
    for send in (by_uvicorn, by_direct):
        request = Request(keep_alive, method, access_log, defaults=True, close=close)
        error = await send(request, messages)
        seen.append((error, request.seen()))
    assert seen[1] == seen[0]


async def test_a_body_after_a_plain_start_goes_the_plain_way_too() -> None:
    """The proxy's shape: the start alone, then a chunk, then the end alone, each a call."""
    steps: list[list[dict[str, Any]]] = [
        [{**START, "headers": SSE}],
        [body(b"x", True)],
        [body(b"", False)],
    ]
    by_uvicorn_ = Request(True, "POST", False, defaults=False)
    for messages in steps:
        assert await by_uvicorn(by_uvicorn_, messages) is None
    request = Request(True, "POST", False, defaults=False)
    direct = direct_send(request.cycle.send)
    assert isinstance(direct, DirectSend)

    async def refuse(message: dict[str, Any]) -> None:
        raise AssertionError(f"uvicorn's send ran for {message}: not the plain way")

    direct._send = refuse  # (all three are plain)
    for messages in steps:
        await direct.send_all(messages)
    assert request.seen() == by_uvicorn_.seen()
    assert request.seen()[:3] == (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-spec-router-pool: "
        b"speculative\r\ntransfer-encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
        False,
        1,
    )


async def test_a_paused_or_gone_client_leaves_it_to_uvicorns_send() -> None:
    request = Request(True, "POST", False, defaults=False)
    request.cycle.disconnected = True
    assert await by_direct(request, [{**START, "headers": SSE}]) is None
    assert request.seen()[:3] == (b"", False, 0)  # (uvicorn's send drops it)
    assert not request.cycle.response_started


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("first", [b"", b"data: 1\n\n"])
async def test_write_start_writes_what_uvicorns_send_writes_for_a_plain_start(
    head: str, first: bytes
) -> None:
    """The callback path's start (router.forward.callback): ``plain_head`` once, then
    ``write_start``, as uvicorn's ``send`` writes the start and first chunk, where the head is
    plain (``plain_head`` gives None for the rest, and they go through ``send``)."""
    start = {**START, "headers": HEADS[head]}
    messages = [start, body(first, True)] if first else [start]
    request = Request(True, "POST", False, defaults=True)
    direct = direct_send(request.cycle.send)
    assert isinstance(direct, DirectSend)
    made = plain_head(request.cycle, start)
    if made is None:
        assert head not in ("sse", "upper-case name", "none")
        return
    expected = Request(True, "POST", False, defaults=True)
    assert await by_uvicorn(expected, messages) is None
    direct.write_start(made, first)
    assert request.seen() == expected.seen()
