"""``LaneCycle``: a proxied request's own response cycle (router/fastpath/lane.py), on a
transport that keeps what is written. tests/fastpath/test_fast_path_e2e.py drives it over real
sockets under the router's protocol."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from router.fastpath.lane import LaneCycle
from router.upstream.stream import BodyTap, SseTap
from tests.support.transport import KeptTransport


class Flow:
    write_paused = False
    read_paused = False

    def resume_reading(self) -> None:
        self.read_paused = False


def lane(
    keep_alive: bool = True, default_headers: Any = ()
) -> tuple[LaneCycle, KeptTransport, list[int]]:
    transport, done = KeptTransport(), list[int]()
    cycle = LaneCycle(
        {"method": "POST", "path": "/v1/chat/completions"},
        transport,  # type: ignore[arg-type]
        Flow(),
        None,  # type: ignore[arg-type]  # (no test here waits for the client)
        keep_alive,
        lambda: done.append(1),
        list(default_headers),
    )
    return cycle, transport, done


def start(status: int = 200, *headers: tuple[bytes, bytes]) -> dict[str, Any]:
    return {"type": "http.response.start", "status": status, "headers": list(headers)}


def body(data: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_sized_answer_goes_out_in_one_write_and_keeps_the_connection() -> None:
    cycle, transport, done = lane()
    run(cycle.send_all([start(200, (b"content-length", b"2"), (b"x-a", b"1")), body(b"ok")]))
    assert transport.written == [
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-a: 1\r\n\r\nok",
    ]
    assert cycle.response_complete and done == [1] and not transport.closed
    assert cycle.message_event.is_set()  # (uvicorn's protocol waits on it for the next request)


def test_a_stream_is_chunked_and_ends_with_the_last_chunk() -> None:
    cycle, transport, done = lane()
    run(cycle.send_all([start(200, (b"content-type", b"text/event-stream")), body(b"ab", True)]))
    assert transport.written[0].endswith(b"transfer-encoding: chunked\r\n\r\n2\r\nab\r\n")
    assert not cycle.response_complete and done == []
    sink = cycle.body_sink(None, None)
    assert sink is not None and sink(b"xyz")
    # the C relay's writer: for an SSE tap or none, never for a body kept whole for its usage
    raw = cycle.body_relay(SseTap(strip_usage=True))
    assert raw is not None and raw(b"4\r\nu\n\n\n\r\n") and cycle.body_relay(None) is not None
    assert cycle.body_relay(BodyTap()) is None
    run(cycle.send(body(b"", False)))
    assert transport.written[1:] == [b"3\r\nxyz\r\n", b"4\r\nu\n\n\n\r\n", b"0\r\n\r\n"]
    assert cycle.response_complete and done == [1]
    assert cycle.body_sink(None, None) is None  # nothing more to add to
    assert cycle.body_relay(None) is None


def test_no_raw_writer_before_a_chunked_response_starts() -> None:
    cycle, _, _ = lane()
    assert cycle.body_relay(None) is None  # not started
    run(cycle.send_all([start(200, (b"content-length", b"4")), body(b"ab", True)]))
    assert cycle.body_relay(None) is None  # a length, not chunks


def test_without_keep_alive_the_answer_says_so_and_the_connection_closes() -> None:
    cycle, transport, _ = lane(keep_alive=False)
    run(cycle.send_all([start(503, (b"content-length", b"0")), body(b"")]))
    assert b"connection: close\r\n" in transport.written[0] and transport.closed


def test_an_upstream_connection_close_ends_keep_alive_and_framing_is_its_own() -> None:
    cycle, transport, _ = lane(default_headers=[(b"server", b"r")])
    headers = ((b"connection", b"Close"), (b"transfer-encoding", b"chunked"))
    run(cycle.send_all([start(200, *headers), body(b"a")]))
    head = transport.written[0]
    assert head.startswith(b"HTTP/1.1 200 OK\r\nserver: r\r\nconnection: close\r\n")
    assert head.count(b"transfer-encoding") == 1 and transport.closed


def test_no_body_statuses_are_not_chunked() -> None:
    cycle, transport, _ = lane()
    run(cycle.send_all([start(204), body(b"")]))
    assert transport.written == [b"HTTP/1.1 204 No Content\r\n\r\n"]


@pytest.mark.parametrize("sent", [b"abc", b"a"])
def test_a_body_that_breaks_its_content_length_is_an_error(sent: bytes) -> None:
    cycle, _, done = lane()
    with pytest.raises(RuntimeError, match="content-length"):
        run(cycle.send_all([start(200, (b"content-length", b"2")), body(sent)]))
    assert done == []


def test_messages_out_of_order_are_errors() -> None:
    cycle, _, _ = lane()
    with pytest.raises(RuntimeError, match="start"):
        run(cycle.send(body(b"x")))
    run(cycle.send_all([start(200, (b"content-length", b"0")), body(b"")]))
    with pytest.raises(RuntimeError, match="after the end"):
        run(cycle.send(body(b"x")))


def test_a_lost_connection_is_reported_once_to_the_watcher_and_to_receive() -> None:
    cycle, transport, _ = lane()
    cycle.body += b"{}"
    cycle.more_body = False
    cycle.message_event.set()
    assert run(cycle.receive()) == {"type": "http.request", "body": b"{}", "more_body": False}
    gone: list[int] = []
    cycle.watch(lambda: gone.append(1))
    cycle.disconnected = True  # as uvicorn's connection_lost does
    cycle.message_event.set()
    cycle.message_event.set()
    assert gone == [1]
    assert run(cycle.receive()) == {"type": "http.disconnect"}
    run(cycle.send_all([start(200), body(b"x")]))  # after the client left: dropped
    assert transport.written == []
    late: list[int] = []
    cycle.watch(lambda: late.append(1))  # watching a connection already lost reports at once
    assert late == [1]


def test_a_handler_that_fails_before_answering_gets_a_500_in_the_openai_shape() -> None:
    cycle, transport, _ = lane()

    async def failing(scope: Any, receive: Any, send: Any) -> None:
        raise ValueError("boom")

    run(cycle.run_asgi(failing))
    head, _, payload = transport.written[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 500 ") and b"connection: close" in head
    assert b'"error"' in payload and transport.closed


def test_a_handler_that_stops_mid_body_leaves_the_client_a_broken_connection() -> None:
    cycle, transport, done = lane()

    async def partial(scope: Any, receive: Any, send: Any) -> None:
        await send(start(200))
        await send(body(b"part", True))

    run(cycle.run_asgi(partial))
    assert transport.closed and not cycle.response_complete and done == []
