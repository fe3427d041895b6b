"""router/upstream/_relay.c: a read of a chunked stream goes out as it came only where the Python
path would have sent the same body, and otherwise nothing is written.

``plain_chunks`` (the C test of a read's bytes) is held to ``reference``, a plain reading of
the rule in Python, over generated reads: whole and cut chunks, extensions, sizes in any case
and with leading zeros, the last chunk, and events that hold usage or a finish reason. And
wherever ``Relay.raw`` takes a read, the SSE tap, fed that read's payload, returns it unchanged
and holds nothing after: the client gets what the Python path would have sent it."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

try:
    from router.upstream._relay import Relay, plain_chunks
except ImportError:  # not built: every test here fails, and says why (nothing else does)
    Relay = plain_chunks = None  # type: ignore[assignment,misc]
from router.upstream.stream import SseTap
from tests.support.transport import KeptTransport


@pytest.fixture(autouse=True)
def built() -> None:
    if Relay is None:
        pytest.fail("router/upstream/_relay.c is not built (make venv builds it: gcc, Python.h)")


SIZE_LINE = re.compile(rb"([0-9a-fA-F]{1,8})\r\n")


def _member_starts(payload: bytes, key: bytes, opening: bytes) -> bool:
    return re.search(re.escape(key) + b" ?" + re.escape(opening), payload) is not None


def reference(data: bytes, check: bool, strip: bool) -> bool:
    """Whole chunks, none the last, no extension; with ``check``, each payload whole events
    with no ``"usage":{`` and, when stripping, no ``"finish_reason":"`` (one space allowed)."""
    pos = 0
    if not data:
        return False
    while pos < len(data):
        line = SIZE_LINE.match(data, pos)
        if line is None:
            return False
        size = int(line.group(1), 16)
        start = line.end()
        payload = data[start : start + size]
        if size == 0 or len(payload) < size or data[start + size : start + size + 2] != b"\r\n":
            return False
        if check and (
            not payload.endswith(b"\n\n")
            or _member_starts(payload, b'"usage":', b"{")
            or (strip and _member_starts(payload, b'"finish_reason":', b'"'))
        ):
            return False
        pos = start + size + 2
    return True


def sse_event(usage: int, finish: int, space: bool) -> bytes:
    """One event as engines write it: ``usage`` 0 absent, 1 null, 2 an object; ``finish`` 0
    null, 1 a reason; ``space`` after the colons (as Python's json.dumps does)."""
    event: dict[str, Any] = {"choices": [{"delta": {"content": "hi"}}]}
    event["choices"][0]["finish_reason"] = "stop" if finish else None
    if usage:
        event["usage"] = {"prompt_tokens": 3, "completion_tokens": 5} if usage == 2 else None
    separators = (", ", ": ") if space else (",", ":")
    return b"data: " + json.dumps(event, separators=separators).encode() + b"\n\n"


events = st.builds(sse_event, st.integers(0, 2), st.integers(0, 1), st.booleans())
payloads = st.one_of(
    events,
    events,
    events,
    st.just(b"data: [DONE]\n\n"),
    st.binary(min_size=1, max_size=30),
    st.sampled_from([b"\n\n", b"x\n", b'"usage":\n\n', b'data: {"usage": {\n\n']),
)


@st.composite
def frame(draw: st.DrawFn, payload: bytes) -> bytes:
    """``payload`` as one chunk, mostly well framed, sometimes not."""
    size = len(payload)
    digits = draw(st.sampled_from(["%x", "%X", "%04x", "%010x"])) % size
    head = digits.encode()
    match draw(st.integers(0, 12)):
        case 0:
            head += b";ext=1"
        case 1:
            head = b"%x" % (size + 1)
        case 2:
            head = b" " + head
    end = b"\r\n" if draw(st.integers(0, 12)) else draw(st.sampled_from([b"\n", b"\r", b"xy"]))
    return head + b"\r\n" + payload + end


@st.composite
def reads(draw: st.DrawFn) -> bytes:
    """One socket read: whole frames, sometimes with the last chunk, sometimes cut short."""
    data = b"".join(draw(frame(p)) for p in draw(st.lists(payloads, min_size=1, max_size=4)))
    if draw(st.integers(0, 8)) == 0:
        data += b"0\r\n\r\n"
    if draw(st.integers(0, 8)) == 0:
        data = data[: draw(st.integers(0, len(data)))]
    return data


@settings(max_examples=400, deadline=None)
@given(reads(), st.booleans(), st.booleans())
@example(b"5\r\nab\n\n\r\n", True, False)  # a size past the payload
@example(b"4\r\nab\n\n\r\n0\r\n\r\n", True, False)  # the last chunk comes along
@example(b"10\r\n" + b'"usage": {}   \n\n' + b"\r\n", True, False)
def test_plain_chunks_is_the_reference_rule(data: bytes, check: bool, strip: bool) -> None:
    assert plain_chunks(data, check, strip) is reference(data, check, strip)


def relay_for(tap: SseTap | None) -> tuple[Relay, KeptTransport, SimpleNamespace]:
    transport = KeptTransport()
    client = SimpleNamespace(flow=SimpleNamespace(write_paused=False), disconnected=False)
    strip = tap is not None and tap.strips_usage
    return Relay(client.flow, client, transport, tap, strip), transport, client


def dechunk(data: bytes) -> bytes:
    out, pos = [], 0
    while (line := SIZE_LINE.match(data, pos)) is not None:
        size = int(line.group(1), 16)
        out.append(data[line.end() : line.end() + size])
        pos = line.end() + size + 2
    assert pos == len(data)
    return b"".join(out)


@settings(max_examples=300, deadline=None)
@given(reads(), st.booleans())
def test_a_read_taken_as_is_is_what_the_tap_would_have_passed(data: bytes, strip: bool) -> None:
    tap = SseTap(strip_usage=strip)
    relay, transport, _ = relay_for(tap)
    if relay.raw(data):
        assert transport.written == [data]
        payload = dechunk(data)
        assert tap.feed(payload) == payload  # unchanged, and nothing carried or held
        assert tap.flush() == b"" and tap.usage is None
    else:
        assert transport.written == []


PLAIN = b"data: " + json.dumps({"choices": [{"delta": {"content": "x"}}]}).encode() + b"\n\n"
READ = b"%x\r\n%b\r\n" % (len(PLAIN), PLAIN)


@pytest.mark.parametrize("block", ["paused", "gone", "closing"])
def test_nothing_is_written_to_a_client_that_cannot_take_it_now(block: str) -> None:
    relay, transport, client = relay_for(SseTap(strip_usage=True))
    if block == "paused":
        client.flow.write_paused = True
    elif block == "gone":
        client.disconnected = True
    else:
        transport.closed = True
    assert relay.raw(READ) is False and transport.written == []
    client.flow.write_paused = client.disconnected = transport.closed = False
    assert relay.raw(READ) is True and transport.written == [READ]


def test_a_tap_that_holds_something_takes_every_read_the_python_way() -> None:
    tap = SseTap(strip_usage=True)
    relay, transport, _ = relay_for(tap)
    assert tap.feed(PLAIN[:10]) == b""  # part of an event, carried
    assert relay.raw(READ) is False
    assert tap.feed(PLAIN[10:]) == PLAIN
    finish = sse_event(usage=0, finish=1, space=False)
    assert tap.feed(finish) == b""  # a finish event, held for the usage event after it
    assert relay.raw(READ) is False
    renaming, transport, _ = relay_for(SseTap(strip_usage=False, rename=(b"a", b"b")))
    assert renaming.raw(READ) is False and transport.written == []


def test_without_a_tap_or_past_its_limit_no_event_is_looked_at() -> None:
    usage = sse_event(usage=2, finish=1, space=False)
    read = b"%x\r\n%b\r\n" % (len(usage), usage)
    relay, transport, _ = relay_for(SseTap(strip_usage=True))
    assert relay.raw(read) is False  # the tap must see this one
    untapped, transport, _ = relay_for(None)
    assert untapped.raw(read) is True and transport.written == [read]
    tap = SseTap(strip_usage=True)
    tap.feed(b"x" * ((1 << 20) + 1))  # no event end in a MiB: the tap gave up
    gave_up, transport, _ = relay_for(tap)
    assert gave_up.raw(read) is True and transport.written == [read]


def test_a_failing_write_raises_and_only_bytes_are_taken_raw() -> None:
    class Broken(KeptTransport):
        def write(self, data: bytes) -> None:
            raise RuntimeError("write failed")

    client = SimpleNamespace(flow=SimpleNamespace(write_paused=False), disconnected=False)
    relay = Relay(client.flow, client, Broken(), None, False)
    with pytest.raises(RuntimeError, match="write failed"):
        relay.raw(READ)
    assert relay.raw(bytearray(READ)) is False  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="not called"):
        Relay.__new__(Relay).raw(READ)


def test_a_tap_it_does_not_know_sends_every_read_the_python_way() -> None:
    """An SseTap whose fields were renamed (the C side reads them by name): no raw writes,
    and no failure either (``/router/status``'s raw_reads stays flat, and shows it)."""
    client = SimpleNamespace(flow=SimpleNamespace(write_paused=False), disconnected=False)
    transport = KeptTransport()
    relay = Relay(client.flow, client, transport, SimpleNamespace(renamed=True), True)
    assert relay.raw(READ) is False and transport.written == []
