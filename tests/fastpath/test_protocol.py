"""The request deadline, head limits and keep-alive of ``spec-router serve``'s protocol
(router/fastpath/protocol.py), in process: uvicorn's own httptools protocol with the router's
mixin, on a transport that keeps what is written and a loop whose clock the test moves (as
uvicorn's tests/protocols/test_http.py drives its protocols). The app runs as a real task.
tests/forward/test_checklist_e2e.py (case 9) drives the same machine over sockets, through the
whole router."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, cast

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from router.fastpath.protocol import (
    BODY_GRACE,
    LINGER,
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    REQUEST_EXPIRED,
    REQUEST_STARTED,
    http_protocol,
)
from tests.support.fakeloop import FakeLoop, Transport, settle

pytestmark = pytest.mark.anyio

TIMEOUT = 1.0  # the request deadline
KEEP_ALIVE = 5.0
EARLY = 0.0625  # before a deadline by this much (a binary fraction: the sums are exact)

GET = b"GET / HTTP/1.1\r\nhost: test\r\n\r\n"
SLOW = b"GET /slow HTTP/1.1\r\nhost: test\r\n\r\n"


def post(path: bytes, body: bytes, length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return b"POST %s HTTP/1.1\r\nhost: test\r\ncontent-length: %d\r\n\r\n%s" % (path, size, body)


class App:
    """Reads each request's body (unless ``/early``, answered first as a 401 would be), then
    answers 200 ``ok``; ``/slow`` waits for ``release`` first; an expired body gets the 408
    the proxy would give. Keeps each request's scope."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []
        self.release = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        self.scopes.append(scope)
        status, body = 200, b"ok"
        if scope["path"] != "/early":
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                if not message.get("more_body"):
                    break
                if scope["extensions"].get(REQUEST_EXPIRED):
                    status, body = 408, b"late"
                    break
        if scope["path"] == "/slow":
            await self.release.wait()
        headers = [(b"content-length", b"%d" % len(body))]
        if status == 408:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class Connection:
    def __init__(self, app: Any = None) -> None:
        self.app = app if app is not None else App()
        self.loop = FakeLoop()
        config = Config(
            app=self.app,
            lifespan="off",
            ws="none",
            log_config=None,
            proxy_headers=False,
            server_header=False,
            date_header=False,
            timeout_keep_alive=KEEP_ALIVE,  # type: ignore[arg-type]  # (uvicorn hints int)
        )
        protocol_class = http_protocol(TIMEOUT)
        assert not isinstance(protocol_class, str), "uvicorn's protocol is not as expected"
        made = protocol_class(  # type: ignore[call-arg]
            config=config, server_state=ServerState(), app_state={}, _loop=self.loop
        )
        self.protocol: Any = cast(Any, made)  # (uvicorn's, with the router's mixin)
        self.transport = Transport()
        self.transport.protocol = self.protocol
        self.protocol.connection_made(self.transport)  # (a stand-in: duck-typed)

    async def send(self, data: bytes) -> None:
        self.protocol.data_received(data)
        await settle()

    def client_closes(self) -> None:
        self.protocol.connection_lost(None)

    @property
    def ended(self) -> bool:
        """Closed, or half-closed (lingering: the answer is out, nothing more will be)."""
        return self.transport.closed or self.transport.eof


def answers(data: bytes) -> list[bytes]:
    """The status lines in ``data`` (every answer here has a short body, no "HTTP/1.1 ")."""
    return re.findall(rb"HTTP/1\.1 \d{3} [^\r]*", data)


def error_code(data: bytes) -> str:
    code: str = json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["code"]
    return code


# -- the request deadline -----------------------------------------------------------------------


async def test_a_head_that_never_completes_gets_408_at_the_deadline_however_it_trickles() -> None:
    c = Connection()
    await c.send(b"POST / HTTP/1.1\r\n")
    for _ in range(3):  # a byte now and then does not move the deadline
        await c.loop.advance(0.25)
        await c.send(b"x")
    assert c.transport.buffer == b"" and not c.ended
    await c.loop.advance(TIMEOUT - 0.75)
    answer = c.transport.take()
    assert answer.startswith(b"HTTP/1.1 408 ") and b"connection: close\r\n" in answer
    assert error_code(answer) == "request_timeout"
    assert c.transport.eof and not c.transport.closed  # half closed: lingering
    assert c.app.scopes == []  # the app never saw it
    await c.send(b"more of the head")  # read and dropped
    assert c.transport.buffer == b""
    await c.loop.advance(LINGER)
    assert c.transport.closed


async def test_a_connection_that_sends_nothing_is_closed_at_the_deadline_without_an_answer() -> (
    None
):
    c = Connection()
    await c.loop.advance(TIMEOUT - EARLY)
    assert not c.ended
    await c.loop.advance(EARLY)
    assert c.transport.closed and c.transport.buffer == b""


async def test_on_a_kept_connection_the_deadline_runs_from_the_requests_first_byte() -> None:
    c = Connection()
    await c.send(GET)
    assert answers(c.transport.take()) == [b"HTTP/1.1 200 OK"]
    await c.loop.advance(3.0)  # idle, well past the first request's deadline
    await c.send(b"GET / HTTP/1.1\r\n")
    await c.loop.advance(TIMEOUT - EARLY)
    assert not c.ended
    await c.loop.advance(EARLY)
    assert answers(c.transport.take()) == [b"HTTP/1.1 408 Request Timeout"]


async def test_a_body_that_misses_the_deadline_wakes_the_app_which_answers_408() -> None:
    c = Connection()
    await c.send(post(b"/", b"12345", length=10))
    scope = c.app.scopes[0]
    assert scope["extensions"][REQUEST_STARTED] == 0.0  # (the proxy's deadline starts here)
    await c.loop.advance(TIMEOUT)
    assert scope["extensions"][REQUEST_EXPIRED] is True
    assert answers(c.transport.take()) == [b"HTTP/1.1 408 Request Timeout"]
    # the answer ends the connection while the client may still be sending: it lingers
    assert c.transport.eof and not c.transport.closed
    c.client_closes()
    assert c.transport.closed


async def test_an_app_that_does_not_answer_a_late_body_has_its_connection_closed() -> None:
    woken: list[dict[str, Any]] = []

    async def deaf(scope: dict[str, Any], receive: Any, send: Any) -> None:
        woken.append(await receive())
        await asyncio.Event().wait()  # never answers

    c = Connection(deaf)
    await c.send(post(b"/", b"1", length=10))
    await c.send(b"2")  # the first receive() took what came; this one waits
    await c.loop.advance(TIMEOUT)
    assert not c.transport.closed
    await c.loop.advance(BODY_GRACE)
    assert c.transport.closed and c.transport.buffer == b""


async def test_a_request_pipelined_behind_a_response_under_way_waits_for_it() -> None:
    """uvicorn stops reading behind a response under way, so a pipelined request's body cannot
    come: its deadline starts again once that response is done, and is kept then."""
    c = Connection()
    await c.send(SLOW + post(b"/", b"{", length=100))
    await c.loop.advance(TIMEOUT + BODY_GRACE + 0.5)
    assert c.transport.buffer == b"" and not c.ended  # the slow answer is still under way
    c.app.release.set()
    await c.loop.advance(0)
    assert answers(c.transport.take()) == [b"HTTP/1.1 200 OK"]
    await c.loop.advance(TIMEOUT)
    assert answers(c.transport.take()) == [b"HTTP/1.1 408 Request Timeout"]


# -- the head's limits and bad requests -----------------------------------------------------------


async def test_a_head_larger_than_the_limit_gets_431() -> None:
    c = Connection()
    await c.send(b"GET / HTTP/1.1\r\nhost: test\r\nx-big: " + b"a" * MAX_HEAD_BYTES)
    answer = c.transport.take()
    assert answers(answer) == [b"HTTP/1.1 431 Request Header Fields Too Large"]
    assert error_code(answer) == "headers_too_large" and c.transport.eof


async def test_a_request_with_too_many_headers_gets_431_and_the_app_never_sees_it() -> None:
    c = Connection()
    headers = b"".join(b"x-h%d: 1\r\n" % i for i in range(MAX_HEADERS + 1))
    await c.send(b"GET / HTTP/1.1\r\nhost: test\r\n" + headers + b"\r\n")
    assert answers(c.transport.take()) == [b"HTTP/1.1 431 Request Header Fields Too Large"]
    assert c.app.scopes == []


async def test_a_head_within_the_limits_with_a_large_body_in_the_same_read_is_served() -> None:
    c = Connection()
    await c.send(post(b"/", b"b" * (2 * MAX_HEAD_BYTES)))
    assert answers(c.transport.take()) == [b"HTTP/1.1 200 OK"]


async def test_a_request_httptools_cannot_parse_gets_400_in_the_openai_shape() -> None:
    c = Connection()
    await c.send(b"GET / HTTP/1.1\r\nhost: te\x00st\r\n\r\n")
    answer = c.transport.take()
    assert answers(answer) == [b"HTTP/1.1 400 Bad Request"]
    assert error_code(answer) == "invalid_http" and c.ended


# -- keep-alive ---------------------------------------------------------------------------------


async def test_an_idle_connection_is_closed_after_the_whole_keep_alive_from_its_last_answer() -> (
    None
):
    c = Connection()
    await c.send(GET)
    await c.loop.advance(3.0)
    await c.send(GET)  # the first answer's timer is still pending ...
    await c.loop.advance(3.0)  # ... and fires now, in the second idle spell: it must look again
    assert not c.ended
    await c.loop.advance(KEEP_ALIVE - 3.0 - EARLY)
    assert not c.ended
    await c.loop.advance(EARLY)
    assert c.transport.closed
    assert answers(c.transport.take()) == [b"HTTP/1.1 200 OK"] * 2


async def test_a_request_answered_past_the_keep_alive_keeps_its_connection() -> None:
    c = Connection()
    await c.send(GET)
    await c.send(SLOW)
    await c.loop.advance(KEEP_ALIVE + 1.0)  # the first answer's timer fires while it is served
    assert not c.ended
    c.app.release.set()
    await c.loop.advance(KEEP_ALIVE - EARLY)
    assert not c.ended
    await c.loop.advance(EARLY)
    assert c.transport.closed


async def test_bytes_that_begin_no_request_do_not_hold_the_connection_open() -> None:
    c = Connection()
    await c.send(GET)
    await c.loop.advance(1.0)
    await c.send(b"\r\n")  # a stray CRLF: no request, so no request deadline either
    # idle from the keep-alive timer's next look (the timer is kept lazily, per connection)
    await c.loop.advance(2 * KEEP_ALIVE)
    assert c.transport.closed


async def test_a_connection_answered_before_its_body_is_in_is_closed_when_idle() -> None:
    # (a 401 or a 413, answered before the body is read, keeps the connection)
    c = Connection()
    await c.send(post(b"/early", b"12345", length=10))
    assert answers(c.transport.take()) == [b"HTTP/1.1 200 OK"]
    await c.send(b"67890")  # the rest of the body, after the answer
    await c.loop.advance(KEEP_ALIVE)
    assert c.transport.closed


async def test_connection_lost_leaves_no_timer_behind() -> None:
    c = Connection()
    await c.send(b"POST / HTTP/1.1\r\n")
    c.client_closes()
    assert c.loop.pending() == []
