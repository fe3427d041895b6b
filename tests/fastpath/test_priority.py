"""``router.fastpath.priority``: chunk writes wait while a request starts, and go out in order.

On stand-ins for the loop's timer and uvicorn's request cycle (``test_direct_send.py``'s); the
e2e tests in tests/fastpath and tests/forward run the router over sockets with it on (the
default) and hold every path: slow clients, disconnects, errors mid-stream, pipelining.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from router.fastpath.priority import Priority
from router.fastpath.uvicorn import DirectSend
from tests.fastpath.test_direct_send import cycle
from tests.support.transport import KeptTransport


class Timers:
    """The loop's ``call_later``, fired by hand."""

    def __init__(self) -> None:
        self.due: list[tuple[float, Callable[[], None], Handle]] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> Handle:
        handle = Handle()
        self.due.append((delay, callback, handle))
        return handle

    def fire(self) -> None:
        due, self.due = self.due, []
        for _, callback, handle in due:
            if not handle.cancelled:
                callback()


class Handle:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def gate(delay: float = 0.02) -> tuple[Priority, Timers]:
    timers = Timers()
    return Priority(cast(asyncio.AbstractEventLoop, timers), delay), timers


def stream(priority: Priority) -> tuple[DirectSend, Any, KeptTransport]:
    transport = KeptTransport()
    direct = DirectSend(None, cycle(transport), priority)
    sink = direct.body_sink(None, None)
    assert sink is not None
    return direct, sink, transport


def test_with_no_request_starting_each_chunk_goes_out_at_once() -> None:
    priority, timers = gate()
    _, sink, transport = stream(priority)
    assert sink(b"ab") and sink(b"c")
    assert transport.written == [b"2\r\nab\r\n", b"1\r\nc\r\n"]
    assert timers.due == []


def test_chunks_wait_while_a_request_starts_and_go_out_in_order_when_it_has() -> None:
    priority, timers = gate()
    _, sink_a, a = stream(priority)
    _, sink_b, b = stream(priority)
    priority.begin()
    assert sink_a(b"a1") and sink_b(b"b1") and sink_a(b"a2")
    assert a.written == b.written == []
    assert [delay for delay, _, _ in timers.due] == [0.02]  # one timer for all
    priority.end()
    assert a.written == [b"2\r\na1\r\n2\r\na2\r\n"]  # one write per stream
    assert b.written == [b"2\r\nb1\r\n"]
    assert timers.due[0][2].cancelled
    assert sink_a(b"a3") and a.written[-1] == b"2\r\na3\r\n"  # and at once again


def test_the_delay_bounds_the_wait_while_requests_keep_starting() -> None:
    priority, timers = gate()
    _, sink, transport = stream(priority)
    priority.begin()
    assert sink(b"x")
    timers.fire()  # the delay passed, a request still starting
    assert transport.written == [b"1\r\nx\r\n"]
    assert sink(b"y") and transport.written == [b"1\r\nx\r\n"]
    assert len(timers.due) == 1  # a new bound for the next kept chunk
    priority.end()
    assert transport.written == [b"1\r\nx\r\n", b"1\r\ny\r\n"]


def test_the_end_of_a_stream_takes_its_kept_chunks_first_in_the_same_write() -> None:
    priority, timers = gate()
    direct, sink, transport = stream(priority)
    sent: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:  # uvicorn's send, as far as it writes
        sent.append(message["body"])
        direct._cycle.transport.write(b"0\r\n\r\n")

    direct._send = send
    priority.begin()
    assert sink(b"k1") and sink(b"k2")
    asyncio.run(direct.send_all([{"type": "http.response.body", "body": b"", "more_body": False}]))
    assert transport.written == [b"2\r\nk1\r\n2\r\nk2\r\n0\r\n\r\n"]
    priority.end()  # nothing left to write for it
    timers.fire()
    assert transport.written == [b"2\r\nk1\r\n2\r\nk2\r\n0\r\n\r\n"]


def test_flush_writes_a_streams_kept_chunks_and_unwatch_drops_them() -> None:
    priority, _ = gate()
    direct, sink, transport = stream(priority)
    priority.begin()
    assert sink(b"e1")
    direct.flush()  # (before the proxy writes anything else to this client: an error event)
    assert transport.written == [b"2\r\ne1\r\n"]
    assert sink(b"e2")
    direct.unwatch()  # the request is over (the client left): nothing more to write
    priority.end()
    assert transport.written == [b"2\r\ne1\r\n"]


def test_kept_chunks_are_not_written_to_a_client_that_is_closing() -> None:
    priority, _ = gate()
    _, sink, transport = stream(priority)
    priority.begin()
    assert sink(b"z")
    transport.closed = True
    priority.end()
    assert transport.written == []


def test_a_zero_delay_gives_the_plain_sink() -> None:
    priority, timers = gate(0.0)
    _, sink, transport = stream(priority)
    priority.begin()
    assert sink(b"now") and transport.written == [b"3\r\nnow\r\n"]
    assert timers.due == []


def test_a_streams_first_chunk_never_waits() -> None:
    # its first-byte time is taken as the sink takes it (``first``): it goes out then
    priority, _ = gate()
    transport = KeptTransport()
    firsts: list[bool] = []
    sink = DirectSend(None, cycle(transport), priority).body_sink(None, lambda: firsts.append(True))
    assert sink is not None
    priority.begin()
    assert sink(b"f1") and sink(b"f2")
    assert firsts == [True]
    assert transport.written == [b"2\r\nf1\r\n"]  # the first at once, the next kept
    priority.end()
    assert transport.written == [b"2\r\nf1\r\n", b"2\r\nf2\r\n"]
