"""router.jsonfast answers every input as json.loads does: the same object, or the
same error (type and message)."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from router.jsonfast import loads, loads_utf8

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
space = st.sampled_from(["", " ", "\n", "\t \r\n", "\u00a0"])


@st.composite
def documents(draw: st.DrawFn) -> bytes:
    """JSON text as a client or an engine might send it, and near misses of it: surrounding
    space, extra data, a BOM, a cut, another encoding, or any bytes at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=40))
    text = draw(space) + json.dumps(draw(values), ensure_ascii=draw(st.booleans())) + draw(space)
    match draw(st.integers(0, 6)):
        case 0:
            text += draw(st.sampled_from(["x", "{}", "]", ","]))
        case 1:
            text = text[: draw(st.integers(0, len(text)))]
        case 2:
            text = "\ufeff" + text
    encoding = draw(st.sampled_from(["utf-8", "utf-8", "utf-8", "utf-16", "utf-32-le"]))
    return text.encode(encoding, "surrogatepass")


def outcome(parse: Any, data: Any) -> tuple[str, Any]:
    try:
        value = parse(data)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "ok", json.dumps(value, sort_keys=True)  # (NaN compares equal as text)


@settings(max_examples=400, deadline=None)
@given(documents())
@example(b"\xef\xbb\xbf{}")  # a UTF-8 BOM: json.loads takes it from bytes, not from text
@example(b"\x00{\x00}")  # UTF-16 without a BOM, which json.loads sniffs
@example(b'{"a": 1} x')
@example(b"NaN")
def test_loads_utf8_answers_as_json_loads(data: bytes) -> None:
    assert outcome(loads_utf8, data) == outcome(json.loads, data)
    try:
        text = data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return
    assert outcome(loads, text) == outcome(json.loads, text)


def test_the_scanner_path_returns_what_json_loads_does() -> None:
    body = b'  {"model": "m", "n": [1, 2.5, -0.0, 1e400], "s": "\\u00e9\\ud83d\\ude00"}\n'
    got = loads_utf8(body)
    assert got == json.loads(body) and math.isinf(got["n"][3])
