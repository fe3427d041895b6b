"""``DirectSend.body_sink``: the per-chunk writer under uvicorn's httptools server, on a stand-in
for uvicorn's request cycle (the e2e tests in tests/fastpath/test_fast_path_e2e.py drive the real
one over sockets)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from router.fastpath.uvicorn import DirectSend
from tests.support.transport import KeptTransport


def cycle(transport: KeptTransport, chunked: bool = True) -> Any:
    return SimpleNamespace(
        flow=SimpleNamespace(write_paused=False),
        transport=transport,
        disconnected=False,
        response_started=True,
        chunked_encoding=chunked,
        response_complete=False,
        scope={"method": "POST"},
    )


def test_the_sink_frames_feeds_and_calls_first_once() -> None:
    transport = KeptTransport()
    firsts: list[int] = []
    fed: list[bytes] = []

    def feed(data: bytes) -> bytes:
        fed.append(data)
        return data.upper() if data != b"drop" else b""

    sink = DirectSend(None, cycle(transport)).body_sink(feed, lambda: firsts.append(1))
    assert sink is not None
    assert sink(b"abc") and sink(b"de")
    assert transport.written == [b"3\r\nABC\r\n", b"2\r\nDE\r\n"]
    assert firsts == [1]  # once, before the first bytes
    assert sink(b"drop") and len(transport.written) == 2  # the tap kept it all: no empty chunk
    assert fed == [b"abc", b"de", b"drop"]


@pytest.mark.parametrize("block", ["paused", "gone", "closing"])
def test_a_client_that_cannot_take_bytes_now_gets_none_and_nothing_is_consumed(
    block: str,
) -> None:
    transport = KeptTransport()
    firsts: list[int] = []
    fed: list[bytes] = []

    def feed(data: bytes) -> bytes:
        fed.append(data)
        return data

    state = cycle(transport)
    sink = DirectSend(None, state).body_sink(feed, lambda: firsts.append(1))
    assert sink is not None
    if block == "paused":
        state.flow.write_paused = True
    elif block == "gone":
        state.disconnected = True
    else:
        transport.closed = True
    assert sink(b"abc") is False
    assert (transport.written, firsts, fed) == ([], [], [])  # not written, not fed, not first
    state.flow.write_paused = state.disconnected = transport.closed = False
    assert sink(b"abc") and transport.written == [b"3\r\nabc\r\n"] and firsts == [1]


def test_no_sink_for_a_body_that_is_not_chunked_or_not_started() -> None:
    assert DirectSend(None, cycle(KeptTransport(), chunked=False)).body_sink(None, None) is None
    unstarted = cycle(KeptTransport())
    unstarted.response_started = False
    assert DirectSend(None, unstarted).body_sink(None, None) is None
