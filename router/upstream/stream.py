"""Watching response bodies as they pass: token usage, and the few rewrites the router owns.

The router counts tokens from the engine's own ``usage``. For a stream whose client left
``stream_options`` alone, the proxy asks the engine for it (``stream_options.include_usage``) and
this tap removes that one extra event again, so the client receives what the engine would have
sent it. llama.cpp puts its ``timings`` object on the last event of a stream: on the usage event
when asked for usage, else on the finish event before it. So the finish event is held until the
next event arrives, and the ``timings`` of a removed usage event go back onto it, byte for byte.
A per-pool model name is mapped back to the public one the client asked for. ``first_event``
reads a stream's first event before anything is relayed: an engine may refuse a stream inside
a 200 (SGLang).

Hot-path care: a chunk that holds whole events and nothing of interest is returned as is, after
one substring search; events are split only when a chunk carries usage or must be rewritten.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from router.jsonfast import loads_utf8
from router.upstream.client import Connection, UpstreamError

_USAGE_KEY = b'"usage":'
_FINISH_KEY = b'"finish_reason":'
_MAX_CARRY = 1 << 20
# (``SseTap.plain``: each key, its length, and the byte that opens what the tap looks for)
_USAGE = ((_USAGE_KEY, len(_USAGE_KEY), 123),)  # "usage":{
_BOTH = (*_USAGE, (_FINISH_KEY, len(_FINISH_KEY), 34))  # and "finish_reason":"
_DECODER = json.JSONDecoder()  # a "partial event" this large is not SSE as we know it: stop tapping


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


def _usage_of(obj: Any) -> Usage | None:
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    return Usage(_count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")))


MAX_COUNT = 1 << 53  # (past this an engine's count is not a count: nor is it exact as a float)


def _count(value: Any) -> int:
    """A token count as an engine reports it: an int from 0 to ``MAX_COUNT``, else 0."""
    return value if type(value) is int and 0 <= value <= MAX_COUNT else 0


def _member_starts(data: bytes, key: bytes, opening: int) -> bool:
    """Whether ``data`` has a member ``key`` (``b'"name":'``) whose value starts with the byte
    ``opening``, right after the colon or one space (``SseTap.feed`` has its own copy inlined
    for the common chunk).

    Per occurrence, one ``find`` for the key and a look at the byte after it (SGLang sends
    ``"usage":null`` and every engine ``"finish_reason":null`` in every chunk). Searching for
    each spelling of the member with ``in`` took four scans of the chunk, a large share of the
    router's own time per chunk (``bench/lab/request_work.py`` times it)."""
    size, end = len(key), len(data)
    at = data.find(key)
    while at >= 0:
        after = at + size
        first = data[after] if after < end else -1
        if first == 32:  # (one space after the colon)
            after += 1
            first = data[after] if after < end else -1
        if first == opening:
            return True
        at = data.find(key, after)
    return False


def _has_usage(data: bytes) -> bool:
    return _member_starts(data, _USAGE_KEY, 123)  # "usage":{ or "usage": {


def _has_finish(data: bytes) -> bool:
    return _member_starts(data, _FINISH_KEY, 34)  # "finish_reason":" (a reason, not null)


def _raw_member(payload: bytes, key: bytes) -> bytes | None:
    """``"key":value`` exactly as it appears in a JSON object's text (its last occurrence)."""
    at = payload.rfind(b'"' + key + b'"')
    colon = payload.find(b":", at + len(key) + 2) if at >= 0 else -1
    if colon < 0:
        return None
    try:
        rest = payload[colon + 1 :].decode()
        _, end = _DECODER.raw_decode(rest, len(rest) - len(rest.lstrip()))
    except (ValueError, UnicodeDecodeError):
        return None
    return payload[at : colon + 1] + rest[:end].encode()


def _graft(event: bytes, member: bytes) -> bytes:
    """Add ``member`` as the last member of the event's JSON object."""
    end = event.rfind(b"}")
    if end < 0 or b'"timings"' in event:
        return event
    return event[:end] + b"," + member + event[end:]


class SseTap:
    """Pass an SSE body through, noting usage; optionally drop the usage-only event."""

    __slots__ = ("usage", "_strip", "_rename", "_carry", "_held", "_gave_up")

    def __init__(self, strip_usage: bool, rename: tuple[bytes, bytes] | None = None) -> None:
        self.usage: Usage | None = None
        self._strip = strip_usage
        self._rename = rename
        self._carry = b""  # an incomplete event
        self._held = b""  # (stripping) a finish event, until the event after it is seen
        self._gave_up = False

    @property
    def strips_usage(self) -> bool:
        """It removes the usage event the router asked for (and holds finish events for it)."""
        return self._strip

    def feed(self, data: bytes) -> bytes:
        if self._gave_up:
            return data
        if not (self._carry or self._held or self._rename) and data[-2:] == b"\n\n":
            # The common case, whole events with nothing to see, for every chunk of every
            # stream (vLLM sends no "usage" member in a chunk, SGLang a null one; every engine
            # a null "finish_reason"): _member_starts inlined for both keys, as it runs for
            # every chunk, with no call but the finds. (Indexing past a key is safe: keys hold
            # no newline and the data ends in one, so a key and one space are followed by at
            # least one byte.) bench/lab/chunk_path.py times it.
            at = data.find(_USAGE_KEY)
            while at >= 0:
                after = data[at + 8]
                if after == 32:  # (one space after the colon)
                    after = data[at + 9]
                if after == 123:  # "usage":{ -- a usage object: the whole way
                    break
                at = data.find(_USAGE_KEY, at + 8)
            else:
                if not self._strip:
                    return data
                at = data.find(_FINISH_KEY)
                while at >= 0:
                    after = data[at + 16]
                    if after == 32:
                        after = data[at + 17]
                    if after == 34:  # "finish_reason":"stop" -- held for a usage event
                        break
                    at = data.find(_FINISH_KEY, at + 16)
                else:
                    return data
        data = self._carry + data
        cut = data.rfind(b"\n\n")
        if cut < 0:
            if len(data) > _MAX_CARRY:
                self._gave_up = True
                self._carry = b""
                return self._release() + data
            self._carry = data
            return b""
        complete, self._carry = data[: cut + 2], data[cut + 2 :]
        return self._process(complete)

    def plain(self, data: bytes, start: int, end: int) -> bool:
        """Whether ``feed(data[start:end])`` would give those bytes back unchanged and note
        nothing (whole events, no usage object, and when stripping no finish reason: the
        common chunk), without slicing them out (``router.fastpath.responder.chunk_whole``).
        The bytes around them hold no quote and no colon (a chunk's framing: its size line
        and the line end after it), so that no key the tap looks for starts or ends there."""
        if self._gave_up:
            return True
        # (``endswith`` with bounds, not ``data[end - 2 : end]``: compiled, mypyc's slice of
        # bytes fails where its start passes its end, as it does here for an ``end`` below 2)
        if self._carry or self._held or self._rename or not data.endswith(b"\n\n", 0, end):
            return False
        # (as ``feed``'s common case: a key found inside ends before the final newlines; the
        # whole of ``data`` is searched, a find with bounds costing more: see the doc)
        for key, size, opening in _BOTH if self._strip else _USAGE:
            at = data.find(key)
            while at >= 0:
                after = data[at + size]
                if after == 32:  # (one space after the colon)
                    after = data[at + size + 1]
                if after == opening:
                    return False
                at = data.find(key, at + size)
        return True

    def flush(self) -> bytes:
        rest, self._carry = self._carry, b""
        return self._process(rest, final=True) if rest or self._held else b""

    def _release(self) -> bytes:
        held, self._held = self._held, b""
        return held

    def _process(self, data: bytes, final: bool = False) -> bytes:
        if self._rename:
            data = data.replace(*self._rename)
        data = self._release() + data
        if not _has_usage(data) and not (self._strip and not final and _has_finish(data)):
            return data
        events = data.split(b"\n\n")
        tail = events.pop()  # b"" unless this is the unterminated rest at the end
        out: list[bytes] = []
        for event in events:
            if _USAGE_KEY in event and _has_usage(event):  # (``in`` first: no call for most)
                payload = event.split(b"data:", 1)[-1].strip()
                try:
                    obj = loads_utf8(payload)
                except ValueError:
                    obj = None
                usage = _usage_of(obj)
                if usage is not None:
                    self.usage = usage
                    if self._strip and isinstance(obj, dict) and obj.get("choices") == []:
                        timings = _raw_member(payload, b"timings") if "timings" in obj else None
                        if timings is not None and out and _has_finish(out[-1]):
                            out[-1] = _graft(out[-1], timings)
                        continue
            out.append(event)
        if self._strip and not final and out and _has_finish(out[-1]):
            if not _has_usage(out[-1]):  # a usage event may follow: wait for it
                self._held = out.pop() + b"\n\n"
        return b"\n\n".join(out) + b"\n\n" + tail if out else tail


class BodyTap:
    """Keep (a bounded amount of) a non-streaming JSON body to read its usage at the end."""

    __slots__ = ("_parts", "_size", "_limit")

    def __init__(self, limit: int = 8 << 20) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self._limit = limit

    def feed(self, data: bytes) -> bytes:
        if self._size <= self._limit:
            self._parts.append(data)
            self._size += len(data)
        return data

    @property
    def usage(self) -> Usage | None:
        if not self._parts or self._size > self._limit:
            return None
        body = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        # Decode only the usage object (engines put it last), not the whole answer.
        at = body.rfind(b'"usage"')
        if at < 0:
            return None
        colon = body.find(b":", at + 7)
        try:
            text = body[colon + 1 :].decode()
            obj, _ = _DECODER.raw_decode(text, len(text) - len(text.lstrip()))
        except (ValueError, UnicodeDecodeError):
            return None
        return _usage_of({"usage": obj})


# The first event of a stream an engine refused after answering 200 (SGLang 0.5.23 under
# --max-queued-requests: ``data: {"error": {..., "code": 503}}`` and ``[DONE]``).
_ERROR_EVENT = (b'data: {"error":', b'data:{"error":', b'data: {"error" :')
MAX_PEEK = 64 * 1024


def first_event_refusal(data: bytes) -> tuple[int, str] | None:
    """``(status, message)`` when the first SSE event in ``data`` is an engine's error with
    a 429 or 503 code -- a refusal, not one request's failure -- else None."""
    event = data.split(b"\n\n", 1)[0].strip()
    if not event.startswith(_ERROR_EVENT):
        return None
    try:
        error = json.loads(event[5:]).get("error")
    except (ValueError, AttributeError):
        return None
    code = error.get("code") if isinstance(error, dict) else None
    if code not in (429, 503):
        return None
    message = error.get("message")
    return int(code), message if isinstance(message, str) else ""


async def first_event(conn: Connection) -> tuple[str | None, int | None]:
    """Read a stream up to its first event and put it back: ``(message, status)`` of an
    engine's in-stream refusal (SGLang 0.5.23's answer to a full queue), else ``(None,
    None)``. Raises ``UpstreamError`` (kind ``reset``, as nothing was answered) when the
    stream ends or breaks before one whole event (SGLang 0.5.3's answer to a full queue)."""
    data = b""
    try:
        while b"\n\n" not in data and len(data) < MAX_PEEK:
            chunk = await conn.read()
            if not chunk:
                break
            data += chunk
    except UpstreamError as exc:
        if data:
            conn.unread(data)  # broken after some bytes: _relay's to report, as it does
            return None, None
        if exc.kind != "reset":
            raise  # a timeout: the engine may still be working on it
        raise UpstreamError("reset", f"{exc} before the stream's first event") from None
    if not data:
        raise UpstreamError("reset", "the stream ended before its first event")
    conn.unread(data)
    refusal = first_event_refusal(data)
    return (None, None) if refusal is None else (refusal[1] or "refused", refusal[0])
