"""The upstream client over a real loopback socket: diverting a body to a sink, and back.

The server is a scripted asyncio server in the test's own loop, so each test decides exactly
which bytes arrive in which read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import anyio
import httptools
import pytest

from router.origin import Origin
from router.upstream.client import Connection, OriginPool, Timeouts, UpstreamError
from tests.support.bulk_upstream import HEAD, chunk
from tests.support.loops import on_both_loops  # noqa: F401 (the fixture)
from tests.support.threaded import read_request
from tests.support.transport import KeptTransport

pytestmark = pytest.mark.anyio


TIMEOUTS = Timeouts(connect=2.0, first_byte=5.0, idle=5.0)
END = b"0\r\n\r\n"


@dataclass
class Script:
    """What the server writes, one entry per write, each when the test releases it.

    ``None`` ends the response (the server waits for the next request); ``b""`` closes the
    connection there and then.
    """

    writes: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)
    requests: int = 0
    closed: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
async def server() -> AsyncIterator[tuple[Script, OriginPool]]:
    script = Script()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await read_request(reader)
                script.requests += 1
                while (data := await script.writes.get()) is not None:
                    if not data:
                        return
                    writer.write(data)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            script.closed.set()
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    pool = OriginPool(
        Origin.parse(f"http://127.0.0.1:{port}"),
        max_connections=4,
        max_idle=4,
        keepalive_expiry=30.0,
    )
    try:
        yield script, pool
    finally:
        pool.close()
        srv.close()
        await srv.wait_closed()


async def request(pool: OriginPool, timeouts: Timeouts = TIMEOUTS) -> Connection:
    return await pool.request(b"POST", b"/v1/chat/completions", [], b"{}", timeouts)


PEEK = 64 * 1024  # (the proxy's: MAX_PEEK)


def peeking(
    pool: OriginPool, peek: int = PEEK, timeouts: Timeouts = TIMEOUTS
) -> asyncio.Task[Connection]:
    """A request that waits for a stream's first event, running while the test writes."""
    return asyncio.create_task(
        pool.request(b"POST", b"/v1/chat/completions", [], b"{}", timeouts, first_event_peek=peek)
    )


def collect_into(seen: list[bytes]) -> Callable[[bytes], bool]:
    """A sink that takes everything it is given."""

    def sink(data: bytes) -> bool:
        seen.append(data)
        return True

    return sink


async def until(check: Callable[[], object]) -> None:
    """Yield to the loop until ``check()`` holds (the server's writes arrive in callbacks)."""
    for _ in range(10_000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def test_a_diverted_body_goes_to_the_sink_one_call_per_read_and_the_end_to_read(
    server: tuple[Script, OriginPool],
) -> None:
    script, pool = server
    await script.writes.put(HEAD + chunk(b"first"))
    conn = await request(pool)
    assert conn.has_body  # the first chunk came with the headers
    assert await conn.read() == b"first"
    seen: list[bytes] = []
    conn.divert(collect_into(seen))
    await script.writes.put(chunk(b"a") + chunk(b"b"))  # two chunks, one read
    await until(lambda: seen)
    assert seen == [b"ab"]
    await script.writes.put(chunk(b"c"))
    await until(lambda: len(seen) == 2)
    await script.writes.put(chunk(b"last") + END)
    await script.writes.put(None)
    # the bytes that arrive with the end are left for read(), to go out with the end
    assert await conn.read() == b"last"
    assert conn.finished
    assert await conn.read() == b""
    assert seen == [b"ab", b"c"]
    conn.release()
    assert pool.idle_connections == 1  # read to the end: kept for the next request


async def first_chunk_read(script: Script, pool: OriginPool) -> Connection:
    """A stream whose head came with its first chunk, that chunk read."""
    await script.writes.put(HEAD + chunk(b"first"))
    conn = await request(pool)
    assert await conn.read() == b"first"
    return conn


async def diverted(
    script: Script, pool: OriginPool
) -> tuple[Connection, KeptTransport, SimpleNamespace]:
    """A stream whose first chunk was read, then diverted to a sink that frames each call's
    bytes as a chunk on a client transport. Returns the connection, the client transport, and
    its flow (``write_paused`` makes the sink decline)."""
    conn = await first_chunk_read(script, pool)
    client, flow = KeptTransport(), SimpleNamespace(write_paused=False)

    def sink(data: bytes) -> bool:
        if flow.write_paused:
            return False
        client.write(chunk(data))
        return True

    conn.divert(sink)
    return conn, client, flow


async def test_bytes_after_the_last_chunk_never_reach_the_client(
    server: tuple[Script, OriginPool],
) -> None:
    """What an engine writes after the last chunk is the parser's to refuse (the connection is
    dropped), not the sink's to send ahead of the end."""
    script, pool = server
    conn, client, _ = await diverted(script, pool)
    await script.writes.put(chunk(b"a\n\n"))
    await until(lambda: client.written)
    await script.writes.put(chunk(b"b\n\n"))
    await until(lambda: len(client.written) == 2)
    await script.writes.put(chunk(b"last\n\n") + END)
    await until(lambda: conn.has_body)  # the end came: its bytes wait for read()
    await script.writes.put(chunk(b"junk after the end\n\n"))
    await until(lambda: pool.open_connections == 0)  # the parser refused it: dropped
    assert b"junk" not in b"".join(client.written)
    assert await conn.read() == b"last\n\n"  # the response itself was whole
    assert await conn.read() == b""
    conn.release()
    assert pool.idle_connections == 0


def grown(written: list[bytes], before: int) -> bool:
    return len(written) > before


def dechunk(data: bytes) -> bytes:
    parser = httptools.HttpResponseParser(parts := Parts())
    parser.feed_data(HEAD + data + END)
    return b"".join(parts)


class Parts(list[bytes]):
    def on_body(self, body: bytes) -> None:
        self.append(body)


async def test_a_declining_sink_hands_the_rest_back_to_read_without_loss(
    server: tuple[Script, OriginPool],
) -> None:
    script, pool = server
    await script.writes.put(HEAD)
    conn = await request(pool)
    assert not conn.has_body
    taken: list[bytes] = []
    offered: list[bytes] = []

    def sink(data: bytes) -> bool:
        offered.append(data)
        if len(offered) == 2:
            return False  # the client is slow: nothing of this call is consumed
        taken.append(data)
        return True

    conn.divert(sink)
    await script.writes.put(chunk(b"one"))
    await until(lambda: offered)
    await script.writes.put(chunk(b"two"))
    assert await conn.read() == b"two"  # declined: read() wakes with those bytes
    await script.writes.put(chunk(b"three"))
    assert await conn.read() == b"three"  # and the sink is not asked again
    await script.writes.put(END)
    await script.writes.put(None)
    assert await conn.read() == b""
    assert taken == [b"one"]
    assert offered == [b"one", b"two"]
    conn.release()
    assert pool.idle_connections == 1


async def answered_again(script: Script, pool: OriginPool, body: bytes) -> Connection:
    """The next exchange, answered whole with ``body`` (and released): the connection's
    parser was left where it should be."""
    await script.writes.put(HEAD + chunk(body) + END)
    await script.writes.put(None)
    conn = await request(pool)
    assert await conn.read_all() == body
    conn.release()
    return conn


async def test_whole_chunks_pass_as_they_came_and_the_parser_keeps_its_place(
    server: tuple[Script, OriginPool],
) -> None:
    """``divert``'s ``whole``: a read that is exactly one whole chunk, written as
    ``chunk_sink`` would frame it, goes to it as it came without the parser, once the parser
    is known to be at a chunk's end; any other read (several chunks, a split one, an
    extension, another spelling of the size) goes through the parser to the sink. Nothing is
    lost or seen twice, the end is seen, and the connection serves its next exchange."""
    script, pool = server
    conn = await first_chunk_read(script, pool)
    got: list[tuple[str, bytes]] = []

    def sink(data: bytes) -> bool:
        got.append(("sink", data))
        return True

    def whole(data: bytes, start: int, end: int) -> bool:
        assert data == chunk(data[start:end])
        got.append(("whole", data[start:end]))
        return True

    conn.divert(sink, whole)
    reads = [
        (chunk(b"a"), ("sink", b"a")),  # (where the parser stands is learnt from a read)
        (chunk(b"bb"), ("whole", b"bb")),
        (chunk(b"c") + chunk(b"d"), ("sink", b"cd")),  # two chunks in one read
        (chunk(b"e"), ("whole", b"e")),
        (b"5\r\nhel", ("sink", b"hel")),  # a chunk split over reads
        (b"lo\r\n", ("sink", b"lo")),
        (chunk(b"f"), ("whole", b"f")),
        (b"3;x=y\r\nabc\r\n", ("sink", b"abc")),  # an extension
        (b"A\r\n0123456789\r\n", ("sink", b"0123456789")),  # upper-case size
        (b"03\r\nxyz\r\n", ("sink", b"xyz")),  # a leading zero
        (chunk(b"g\r\n"), ("whole", b"g\r\n")),  # a payload ending like a chunk
    ]
    for data, expected in reads:
        before = len(got)
        await script.writes.put(data)
        await until(lambda: len(got) > before)  # noqa: B023
        assert got[-1] == expected, (data, got[-1])
    await script.writes.put(chunk(b"last") + END)
    await script.writes.put(None)
    assert await conn.read() == b"last"  # the end, seen: the bytes with it wait for read()
    assert conn.finished
    assert await conn.read() == b""
    conn.release()
    assert pool.idle_connections == 1
    assert (await answered_again(script, pool, b"again")).reused
    assert pool.idle_connections == 1


async def test_a_whole_chunk_declined_goes_to_the_sink_and_a_failing_one_fails_the_relay(
    server: tuple[Script, OriginPool],
) -> None:
    script, pool = server
    conn = await first_chunk_read(script, pool)
    seen: list[bytes] = []
    offered: list[bytes] = []

    def whole(data: bytes, start: int, end: int) -> bool:
        offered.append(data[start:end])
        if data[start:end] == b"boom":
            raise RuntimeError("boom")
        return False  # (e.g. the tap must see it): the parser's way

    conn.divert(collect_into(seen), whole)
    for i, data in enumerate((b"a", b"b", b"c")):
        await script.writes.put(chunk(data))
        await until(lambda: len(seen) > i)  # noqa: B023
    assert seen == [b"a", b"b", b"c"]
    assert offered == [b"b", b"c"]  # (the first read tells where the parser stands)
    await script.writes.put(chunk(b"boom"))
    with pytest.raises(UpstreamError) as failed:
        await conn.read()
    assert failed.value.kind == "relay"
    conn.release()
    await script.writes.put(None)
    with anyio.fail_after(5):
        await script.closed.wait()
    assert pool.open_connections == 0


async def test_a_failing_sink_fails_the_response_and_drops_the_connection(
    server: tuple[Script, OriginPool],
) -> None:
    script, pool = server
    await script.writes.put(HEAD)
    conn = await request(pool)

    def sink(data: bytes) -> bool:
        raise RuntimeError("boom")

    conn.divert(sink)
    await script.writes.put(chunk(b"x"))
    with pytest.raises(UpstreamError) as failed:
        await conn.read()
    assert failed.value.kind == "relay"
    assert failed.value.response_started
    conn.release()
    await script.writes.put(None)  # the server goes back to reading: it finds the end
    with anyio.fail_after(5):
        await script.closed.wait()  # the engine sees the connection close: it stops generating
    assert pool.open_connections == 0
    assert pool.idle_connections == 0


async def test_an_upstream_reset_while_diverted_reaches_read(
    server: tuple[Script, OriginPool],
) -> None:
    script, pool = server
    await script.writes.put(HEAD)
    conn = await request(pool)
    seen: list[bytes] = []
    conn.divert(collect_into(seen))
    await script.writes.put(chunk(b"x"))
    await until(lambda: seen)
    await script.writes.put(b"")  # the server closes mid-body
    with pytest.raises(UpstreamError) as failed:
        await conn.read()
    assert failed.value.kind == "reset"
    conn.release()
    assert pool.open_connections == 0


BIG = b"x" * (300 * 1024)  # more than HIGH_WATER: the connection stops reading


async def backed_up(script: Script, pool: OriginPool, backlogged: list[bool]) -> Connection:
    """A stream (idle timeout 0.2 s) whose engine sent ``BIG`` and whose reader has not read
    it: the connection stopped reading. Each backlog report appends to ``backlogged``."""
    await script.writes.put(HEAD)
    held_back = asyncio.Event()
    conn = await request(pool, Timeouts(connect=2.0, first_byte=5.0, idle=0.2))

    def on_backlog() -> None:
        backlogged.append(True)
        held_back.set()

    conn.on_backlog = on_backlog
    await script.writes.put(chunk(BIG))  # (only now: the callback is in place before it comes)
    with anyio.fail_after(10):  # (300 KiB over loopback: however long a busy machine takes)
        await held_back.wait()
    return conn


async def read_big(conn: Connection) -> bytes:
    received = b""
    while len(received) < len(BIG):
        received += await conn.read()
    return received


async def test_a_stream_held_back_for_a_slow_reader_is_not_timed_out_as_idle(
    server: tuple[Script, OriginPool],
) -> None:
    script, pool = server
    backlogged: list[bool] = []
    conn = await backed_up(script, pool, backlogged)
    # The reader (a slow client) takes three idle timeouts to come back: that silence is the
    # router's own, so the engine is not cut off for it. (Waiting is the point of this test.)
    await anyio.sleep(0.6)
    assert await read_big(conn) == BIG
    await script.writes.put(END)
    await script.writes.put(None)
    assert await conn.read() == b""
    assert backlogged == [True]
    conn.release()
    assert pool.idle_connections == 1


async def test_after_a_slow_reader_catches_up_the_engine_gets_a_whole_idle_timeout(
    server: tuple[Script, OriginPool],
) -> None:
    # While reading is paused the timer moves the engine's last activity on only when it
    # fires; reading again must start the engine's idle time afresh, not from that look, up to
    # a whole idle timeout old (found by review: the next byte, 0.15 s after the reader caught
    # up, was cut off as idle at 0.2 s).
    script, pool = server
    conn = await backed_up(script, pool, [])
    await anyio.sleep(0.5)  # the reader is away for 2.5 idle timeouts (the time is the point)
    assert await read_big(conn) == BIG
    await anyio.sleep(0.15)  # the engine's next byte: inside one idle timeout of the catch-up
    await script.writes.put(chunk(b"next") + END)
    await script.writes.put(None)
    assert await conn.read() == b"next"
    assert await conn.read() == b""
    conn.release()


async def test_a_chunked_bodys_trailers_are_not_taken_for_the_responses_headers(
    server: tuple[Script, OriginPool],
) -> None:
    script, pool = server
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: content-type\r\n\r\n"
    await script.writes.put(head + chunk(b"a") + b"0\r\ncontent-type: text/event-stream\r\n\r\n")
    await script.writes.put(None)
    conn = await request(pool)
    body = b""
    while data := await conn.read():
        body += data
    assert body == b"a"
    assert [name for name, _ in conn.headers] == [b"transfer-encoding", b"trailer"]
    assert not conn.event_stream
    conn.release()


EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n"


@pytest.mark.parametrize("apart", [False, True], ids=["one read", "two reads"])
async def test_an_interim_response_is_not_taken_for_the_answer(
    server: tuple[Script, OriginPool], apart: bool
) -> None:
    # httptools reports a 1xx as a message of its own. In one read, the final response's
    # headers were dropped as if trailers (found by review); in two, the 103 was taken for the
    # answer and the next request on the connection got this one's body.
    script, pool = server
    answer = HEAD + chunk(b"data: one\n\n") + END
    if apart:
        await script.writes.put(EARLY_HINTS)
        await script.writes.put(answer)
    else:
        await script.writes.put(EARLY_HINTS + answer)
    await script.writes.put(None)
    conn = await request(pool)
    assert conn.status == 200 and conn.event_stream
    assert (b"content-type", b"text/event-stream") in conn.headers
    assert b"link" not in dict(conn.headers)
    body = b""
    while data := await conn.read():
        body += data
    assert body == b"data: one\n\n"
    conn.release()
    await answered_again(script, pool, b"data: two\n\n")
    assert script.requests == 2


async def test_a_reused_connection_closed_before_any_byte_is_retried_once_on_a_fresh_one(
    server: tuple[Script, OriginPool],
) -> None:
    script, pool = server
    await script.writes.put(HEAD + END)
    await script.writes.put(None)
    first = await request(pool)
    assert await first.read() == b""
    first.release()
    assert pool.idle_connections == 1
    await script.writes.put(b"")  # the server drops the kept-alive connection as it is reused
    await script.writes.put(HEAD + END)  # and answers the same request on a fresh one
    await script.writes.put(None)
    again = await request(pool)
    assert again.status == 200 and await again.read() == b""
    again.release()
    assert script.requests == 3  # sent twice: the server closed the first copy unanswered


async def test_a_reused_connection_that_times_out_is_not_sent_again(
    server: tuple[Script, OriginPool],
) -> None:
    script, pool = server
    await script.writes.put(HEAD + END)
    await script.writes.put(None)
    first = await request(pool)
    assert await first.read() == b""
    first.release()
    assert pool.idle_connections == 1
    # The engine got the request and is working on it (queued, or a long non-stream): no
    # byte comes within the first-byte timeout. That is not a stale connection.
    with pytest.raises(UpstreamError) as failed:
        await request(pool, Timeouts(connect=2.0, first_byte=0.2, idle=5.0))
    assert failed.value.kind == "first_byte_timeout"
    assert script.requests == 2  # the timed-out request was sent once
    assert pool.open_connections == 0


async def test_a_kept_connections_earlier_deadline_does_not_cut_its_next_exchange_short(
    server: tuple[Script, OriginPool],
) -> None:
    # The connection keeps one timer across its exchanges, moved lazily: the first exchange's
    # first-byte deadline (0.3 s in) is still pending when the second is sent at 0.2 s; the
    # second's answer comes at 0.4 s, past the first's deadline and inside its own (0.5 s).
    script, pool = server
    timeouts = Timeouts(connect=2.0, first_byte=0.3, idle=5.0)
    await script.writes.put(HEAD + END)
    await script.writes.put(None)
    first = await request(pool, timeouts)
    assert await first.read() == b""
    first.release()
    await anyio.sleep(0.2)  # (the time passing is the point)
    second = asyncio.create_task(request(pool, timeouts))
    await anyio.sleep(0.2)
    assert not second.done()
    await script.writes.put(HEAD + chunk(b"late") + END)
    conn = await second
    assert await conn.read() == b"late"
    assert await conn.read() == b""
    conn.release()
    await script.writes.put(None)
    assert script.requests == 2 and pool.idle_connections == 1
    # and the deadline still holds for a third exchange on the same connection
    with pytest.raises(UpstreamError) as failed:
        await request(pool, timeouts)
    assert failed.value.kind == "first_byte_timeout"


async def test_the_first_byte_timer_runs_until_the_first_body_byte(
    server: tuple[Script, OriginPool],
) -> None:
    # vLLM's stream headers come before queueing: the silence after them is the queue's
    script, pool = server
    await script.writes.put(HEAD)
    conn = await request(pool, Timeouts(connect=2.0, first_byte=5.0, idle=0.1))
    await anyio.sleep(0.3)  # three idle timeouts without a body byte (waiting is the point)
    await script.writes.put(chunk(b"first"))
    assert await conn.read() == b"first"
    # from the first body byte on, the idle timeout applies
    with pytest.raises(UpstreamError) as failed:
        await conn.read()
    assert failed.value.kind == "idle_timeout"
    conn.release()
    await script.writes.put(None)


async def test_a_total_timeout_bounds_the_whole_answer(server: tuple[Script, OriginPool]) -> None:
    script, pool = server
    await script.writes.put(HEAD + chunk(b"a"))
    conn = await request(pool, Timeouts(connect=2.0, first_byte=30.0, idle=30.0, total=0.3))
    assert await conn.read() == b"a"
    with pytest.raises(UpstreamError) as failed:
        await conn.read()
    assert failed.value.kind == "total_timeout" and "whole answer" in str(failed.value)
    conn.release()
    await script.writes.put(None)


async def turns(n: int = 20) -> None:
    """Let the loop run ``n`` turns (a woken task would finish in one or two)."""
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.mark.parametrize("peek", [0, 64 * 1024])
async def test_a_stream_waits_for_its_first_event_in_one_wake_when_asked(
    server: tuple[Script, OriginPool], peek: int
) -> None:
    """Engines send a stream's head when they take the request and its first event after the
    prefill. Asked to peek (the proxy does for streams), the request returns once the first
    event is whole, so the proxy's task is woken once for both; not asked, at the head."""
    script, pool = server
    task = peeking(pool, peek)
    await script.writes.put(HEAD)
    await until(lambda: any(c.status == 200 for c in pool._open))
    await script.writes.put(chunk(b'data: {"a"'))
    await until(lambda: any(c.has_body for c in pool._open))
    await turns()
    assert task.done() is (peek == 0)  # half an event: a peeking request still waits
    await script.writes.put(chunk(b":1}\n\n"))
    conn = await task
    await until(lambda: conn.has_body and b"\n\n" in b"".join(conn._body))
    assert await conn.read() == b'data: {"a":1}\n\n'
    conn.release()
    await script.writes.put(None)


async def test_a_peeking_request_returns_at_the_head_of_an_answer_that_is_not_a_stream(
    server: tuple[Script, OriginPool],
) -> None:
    script, pool = server
    task = peeking(pool)
    await script.writes.put(  # (typed as an event stream: the status alone decides)
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/event-stream\r\n"
        b"content-length: 4\r\n\r\n"
    )
    conn = await task  # the verdict needs no body
    assert conn.status == 503 and not conn.has_body
    await script.writes.put(b"busy")
    assert await conn.read_all() == b"busy"
    conn.release()
    await script.writes.put(None)


async def test_a_stream_that_breaks_before_its_first_event_is_reported_by_read(
    server: tuple[Script, OriginPool],
) -> None:
    """After the head, a failure is the reader's to see, peeking or not, as it was before the
    peek (the proxy's first_event puts bytes read back for _relay to report the break, and
    takes a close with no body byte at all for a refusal)."""
    script, pool = server
    task = peeking(pool)
    await script.writes.put(HEAD + chunk(b"data: {"))
    await until(lambda: any(c.has_body for c in pool._open))
    await script.writes.put(b"")  # the engine closes the connection mid-event
    conn = await task
    assert await conn.read() == b"data: {"
    with pytest.raises(UpstreamError) as failed:
        await conn.read()
    assert failed.value.kind == "reset" and failed.value.response_started
    conn.release()


async def test_a_first_event_whose_blank_line_spans_two_reads_ends_the_wait(
    server: tuple[Script, OriginPool],
) -> None:
    script, pool = server
    task = peeking(pool)
    await script.writes.put(HEAD + chunk(b'data: {"a":1}'))
    await until(lambda: any(c.has_body for c in pool._open))
    await script.writes.put(chunk(b"\n"))  # a lone newline after no newline: not a blank line
    await until(lambda: any(len(c._body) == 2 for c in pool._open))
    await turns()
    assert not task.done()
    await script.writes.put(chunk(b"\n"))
    await until(task.done)  # woken by the blank line's second half, not by a timeout
    conn = task.result()
    assert len(conn._body) == 3
    assert await conn.read() == b'data: {"a":1}\n\n'
    conn.release()
    await script.writes.put(None)


async def test_a_first_event_larger_than_the_peek_wakes_at_the_peek(
    server: tuple[Script, OriginPool],
) -> None:
    script, pool = server
    task = peeking(pool, 16)
    await script.writes.put(HEAD + chunk(b"data: " + b"x" * 8))
    await until(lambda: any(c.has_body for c in pool._open))
    await turns()
    assert not task.done()  # 14 bytes, no blank line yet
    await script.writes.put(chunk(b"y" * 8))
    await until(task.done)  # past the peek: the reader looks for itself
    conn = task.result()
    conn.close()


async def test_a_held_stream_keeps_its_first_byte_and_idle_timers(
    server: tuple[Script, OriginPool],
) -> None:
    """The first-byte timeout covers the time to the first body byte, not to the first whole
    event: from that byte on, the idle timeout applies, held or not."""
    script, pool = server
    timeouts = Timeouts(connect=2.0, first_byte=0.2, idle=5.0)
    task = peeking(pool, timeouts=timeouts)
    await script.writes.put(HEAD + chunk(b'data: {"a"'))
    await anyio.sleep(0.4)  # twice the first-byte timeout, within the idle one (the point)
    await script.writes.put(chunk(b":1}\n\n"))
    conn = await task
    await until(lambda: conn.has_body and b"\n\n" in b"".join(conn._body))
    assert await conn.read() == b'data: {"a":1}\n\n'
    conn.close()


async def test_a_request_cancelled_while_held_closes_its_connection(
    server: tuple[Script, OriginPool],
) -> None:
    script, pool = server
    task = peeking(pool)
    await script.writes.put(HEAD)
    await until(lambda: any(c.status == 200 for c in pool._open))
    (held,) = pool._open
    task.cancel()  # the client left during the prefill
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pool.open_connections == 0 and pool.idle_connections == 0
    await until(lambda: held._transport is None)  # aborted: the engine sees the close
    await script.writes.put(None)


async def test_a_held_stream_that_backs_up_wakes_its_reader(
    server: tuple[Script, OriginPool],
) -> None:
    """Past the high-water mark the connection stops reading: held on, it would wait for ever."""
    script, pool = server
    task = peeking(pool, 1 << 20)
    await script.writes.put(HEAD + chunk(b"x" * (300 * 1024)))  # no blank line, under the peek
    await until(task.done)
    conn = task.result()
    assert len(await conn.read()) == 300 * 1024
    conn.close()


async def test_connects_under_way_count_against_max_connections(
    server: tuple[Script, OriginPool],
) -> None:
    """A wave decided in one loop turn (the callback path's ``has_room``, then
    ``connect_soon``) opens no more than ``max_connections`` (4 here; it opened all 10,
    review-s13 M1); a request waiting for a slot has the next one freed (no connect from the
    callbacks jumps it); a failed connect frees its slot."""
    script, pool = server
    tasks = [pool.connect_soon(TIMEOUTS.connect) for _ in range(10) if pool.has_room]
    assert len(tasks) == 4
    assert (pool.connecting, pool.open_connections) == (4, 0)
    conns = await asyncio.gather(*tasks)
    assert (pool.connecting, pool.open_connections, pool.has_room) == (0, 4, False)
    waiting = asyncio.create_task(request(pool))
    await until(lambda: pool._slot_waiters)
    conns[0].close()
    pool.forget(conns[0])
    assert not pool.has_room  # (the waiting request's slot)
    script.writes.put_nowait(HEAD + chunk(b"{}") + END)
    script.writes.put_nowait(None)
    answered = await waiting
    assert answered.status == 200
    assert pool.open_connections == 4 and not pool.has_room
    answered.release()  # (not read to its end: aborted, its slot freed)
    assert pool.has_room
    for conn in conns[1:]:
        conn.close()
        pool.forget(conn)
    refused = OriginPool(
        Origin.parse("http://127.0.0.1:1"), max_connections=1, max_idle=1, keepalive_expiry=1
    )
    failed = refused.connect_soon(TIMEOUTS.connect)
    assert not refused.has_room
    with pytest.raises(UpstreamError):
        await failed
    assert (refused.connecting, refused.open_connections, refused.has_room) == (0, 0, True)
