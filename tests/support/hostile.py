"""Hypothesis strategies for everything a client controls: bodies, headers, methods, paths.

Bodies are bytes, because the interesting ones are not what ``json.dumps`` would write: NaN and
Infinity literals, numbers with thousands of digits, duplicate keys, lone surrogates, nesting
deeper than any decoder's recursion limit, and request-shaped objects whose fields have the
wrong types. Requests for raw sockets are bytes too, with CR, LF and NUL where they must not be,
several or contradictory Content-Length and Transfer-Encoding headers, and absolute-form,
dot-segment and percent-encoded targets.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

# -- JSON -------------------------------------------------------------------------------------

_NUMBERS = st.one_of(
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(1, 5000).map(lambda n: "1" + "0" * n),  # beyond float, beyond int digit limits
    st.sampled_from(["1e400", "-1e400", "1E-400", "-0", "0.0e0", "NaN", "Infinity", "-Infinity"]),
)
_ESCAPES = st.sampled_from(["\\ud800", "\\udfff", "\\ud83d\\ude00", "\\u0000", "\\\\", '\\"'])


@st.composite
def _string_literal(draw: st.DrawFn) -> str:
    """A JSON string literal, possibly with escapes json.dumps never writes (lone surrogates)."""
    encoded = st.text(max_size=8).map(lambda text: json.dumps(text)[1:-1])
    return '"' + "".join(draw(st.lists(st.one_of(encoded, _ESCAPES), max_size=4))) + '"'


def _literal(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


_SCALARS = st.one_of(st.none(), st.booleans(), _NUMBERS.map(_literal), _string_literal()).map(
    lambda v: v if isinstance(v, str) else json.dumps(v)
)


def _object(members: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f"{k}:{v}" for k, v in members) + "}"


JSON_TEXT = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5).map(lambda items: "[" + ",".join(items) + "]"),
        st.lists(st.tuples(_string_literal(), inner), max_size=5).map(_object),
    ),
    max_leaves=20,
)

# What a field may hold when it has the wrong type (or the right one).
ANY_VALUE = st.one_of(
    JSON_TEXT,
    st.sampled_from(['"sim"', '""', "true", "0", "-1", "[]", "{}", "null", '"\\ud800"']),
)
_MESSAGES = st.one_of(
    ANY_VALUE,
    st.just('[{"role":"user","content":"hi"}]'),
    st.lists(
        st.fixed_dictionaries({"role": ANY_VALUE, "content": ANY_VALUE}).map(
            lambda m: _object([('"role"', m["role"]), ('"content"', m["content"])])
        ),
        max_size=3,
    ).map(lambda items: "[" + ",".join(items) + "]"),
)
_FIELDS: dict[str, st.SearchStrategy[str]] = {
    '"model"': st.one_of(st.just('"sim"'), ANY_VALUE),
    '"messages"': _MESSAGES,
    '"prompt"': st.one_of(st.just('"hi"'), ANY_VALUE),
    '"stream"': st.one_of(st.sampled_from(["true", "false"]), ANY_VALUE),
    '"stream_options"': st.one_of(st.just('{"include_usage":true}'), ANY_VALUE),
    '"max_tokens"': st.one_of(st.integers(-2, 6).map(str), ANY_VALUE),
    '"temperature"': st.one_of(st.sampled_from(["0", "0.7", "1e400"]), ANY_VALUE),
}


@st.composite
def request_object(draw: st.DrawFn) -> bytes:
    """A request-shaped object: each field absent, well typed or not, sometimes twice."""
    members = []
    for key, values in _FIELDS.items():
        for _ in range(draw(st.integers(0, 2))):  # 2: a duplicate key
            members.append((key, draw(values)))
    members = draw(st.permutations(members))
    return _object(members).encode("utf-8", "surrogatepass")


@st.composite
def nesting(draw: st.DrawFn) -> bytes:
    """Arrays or objects nested up to 200,000 deep, balanced or not, bare or inside a request."""
    depth = draw(st.sampled_from([1, 100, 1000, 10_000, 100_000, 200_000]))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    inner = (
        opener * depth
        + ("1" if opener != "[" else "")
        + closer * draw(st.sampled_from([depth, depth - 1, 0]))
    )
    if draw(st.booleans()):
        inner = '{"model":"sim","messages":' + inner + "}"
    return inner.encode()


@st.composite
def near_valid_request(draw: st.DrawFn) -> bytes:
    """A valid request with one field wrong (or doubled): most of these reach an engine."""
    fields = {
        '"model"': '"sim"',
        '"messages"': '[{"role":"user","content":"hi"}]',
        '"max_tokens"': str(draw(st.integers(1, 4))),
        '"stream"': draw(st.sampled_from(["true", "false"])),
    }
    if draw(st.booleans()):
        fields['"stream_options"'] = '{"include_usage":true}'
    members = list(fields.items())
    key = draw(st.sampled_from([*_FIELDS]))
    value = draw(_FIELDS[key])
    if draw(st.booleans()):
        members = [(k, v) for k, v in members if k != key]
    members.append((key, value))
    return _object(draw(st.permutations(members))).encode("utf-8", "surrogatepass")


BODIES = st.one_of(
    st.binary(max_size=512),
    JSON_TEXT.map(lambda text: text.encode("utf-8", "surrogatepass")),
    request_object(),
    near_valid_request(),
    near_valid_request(),
    nesting(),
)

# -- requests for raw sockets -----------------------------------------------------------------

_BAD_BYTES = st.sampled_from([b"\r", b"\n", b"\x00", b"\r\n", b"\x7f", b"\xff", b" ", b"\t"])
TOKENS = st.sampled_from([b"x-a", b"x-request-id", b"user-agent", b"accept", b"x-slo-ttft-ms"])


def _sometimes(draw: st.DrawFn) -> bool:
    """One hostile feature in four is on: enough requests stay parseable to reach the proxy."""
    return draw(st.integers(0, 3)) == 0


_PRINTABLE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12)
HEADER_VALUES = _PRINTABLE.map(str.encode)


GOOD_TARGETS = st.sampled_from([b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings"])
TARGETS = st.one_of(
    st.sampled_from(
        [
            b"/v1/chat/completions",
            b"/v1/completions",
            b"/v1/../sim/config",
            b"/v1/%2e%2e/sim/config",
            b"/v1/%2E%2E%2Fsim%2Fconfig",
            b"/v1/chat/completions/..",
            b"/v1/chat%2Fcompletions",
            b"/v1//chat/completions",
            b"/v1/chat/completions?x=%00",
            b"/v1/%00",
            b"/v1/%ZZ",
            b"/v1/\xff",
            b"//v1/chat/completions",
            b"/sim/config",
            b"/pause",
            b"/abort_requests",
            b"/update_weights",
            b"/tokenize",
            b"/server_info",
            b"/router/table",
            b"*",
            b"http://127.0.0.1:1/sim/config",
            b"http://evil.example/v1/chat/completions",
            b"v1/chat/completions",
            b"/" + b"a" * 9000,
        ]
    ),
    st.binary(min_size=1, max_size=40).map(lambda b: b"/v1/" + b),
)
METHODS = st.one_of(
    st.sampled_from([b"POST", b"GET", b"PUT", b"DELETE", b"HEAD", b"OPTIONS", b"TRACE"]),
    st.sampled_from([b"CONNECT", b"post", b"P0ST", b"", b"GET POST", b"\x00"]),
)
_FRAMING = st.sampled_from(
    [
        "length",  # one correct Content-Length
        "length_twice",  # the same Content-Length twice
        "length_conflict",  # two that disagree
        "length_bogus",  # not a number
        "length_short",  # says less than follows
        "chunked",
        "chunked_and_length",  # both: request smuggling's favourite
        "chunked_bad",  # a chunk size that is not hex
        "te_obfuscated",  # "Transfer-Encoding: xchunked", " chunked", "chunked, identity"
        "none",
    ]
)


VALID_BODY = b'{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'


@st.composite
def raw_request(draw: st.DrawFn) -> bytes:
    method = draw(METHODS) if _sometimes(draw) else b"POST"
    target = draw(TARGETS) if _sometimes(draw) else draw(GOOD_TARGETS)
    version = b"HTTP/1.1"
    if _sometimes(draw):
        version = draw(st.sampled_from([b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1x", b"HTTP/0.9"]))
    body = draw(st.one_of(st.just(VALID_BODY), BODIES))
    headers = [(b"host", b"127.0.0.1"), (b"connection", b"close")]
    headers += draw(st.lists(st.tuples(TOKENS, HEADER_VALUES), max_size=4))
    if _sometimes(draw):  # CR, LF, NUL ... in one header's value
        value = draw(HEADER_VALUES)
        cut = draw(st.integers(0, len(value)))
        headers.append((draw(TOKENS), value[:cut] + draw(_BAD_BYTES) + value[cut:]))
    if _sometimes(draw):  # any name at all
        headers.append((draw(st.binary(min_size=1, max_size=10)), draw(HEADER_VALUES)))
    if _sometimes(draw):  # many headers, around the limit of 100
        headers += [(b"x-n%d" % i, b"v") for i in range(draw(st.sampled_from([90, 101, 2000])))]
    if _sometimes(draw):  # huge headers, around the limit of 64 KiB
        headers.append((b"x-huge", b"h" * draw(st.sampled_from([100, 9000, 70000]))))
    framing = draw(_FRAMING) if _sometimes(draw) else draw(st.sampled_from(["length", "chunked"]))
    payload = body
    if framing == "length":
        headers.append((b"content-length", b"%d" % len(body)))
    elif framing == "length_twice":
        headers += [(b"content-length", b"%d" % len(body))] * 2
    elif framing == "length_conflict":
        headers += [
            (b"content-length", b"%d" % len(body)),
            (b"content-length", b"%d" % (len(body) + 1)),
        ]
    elif framing == "length_bogus":
        headers.append(
            (b"content-length", draw(st.sampled_from([b"-1", b"+5", b"0x10", b"1 2", b"9" * 30])))
        )
    elif framing == "length_short":
        headers.append((b"content-length", b"%d" % (len(body) // 2)))
    elif framing in ("chunked", "chunked_and_length", "chunked_bad"):
        headers.append((b"transfer-encoding", b"chunked"))
        size = b"zz" if framing == "chunked_bad" else b"%x" % len(body)
        payload = (size + b"\r\n" + body + b"\r\n" if body else b"") + b"0\r\n\r\n"
        if framing == "chunked_and_length":
            headers.append((b"content-length", b"%d" % len(body)))
    elif framing == "te_obfuscated":
        te = draw(
            st.sampled_from(
                [b"xchunked", b" chunked", b"chunked, identity", b"identity", b"Chunked"]
            )
        )
        headers.append((b"transfer-encoding", te))
        headers.append((b"content-length", b"%d" % len(body)))
    lines = [method + b" " + target + b" " + version]
    lines += [name + b": " + value for name, value in draw(st.permutations(headers))]
    return b"\r\n".join(lines) + b"\r\n\r\n" + payload
