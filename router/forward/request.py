"""What the proxy reads from a client request: only what routing and accounting need.

No pydantic on the hot path: the body is decoded once with the stdlib's C JSON decoder and a
handful of fields are picked out. ``upstream_body`` re-encodes only when the body must change
(a per-pool model name, or a usage chunk the router asks for on the client's behalf).
"""

from __future__ import annotations

import hmac
import json
import math
from dataclasses import dataclass
from typing import Any

from router.errors import BadRequest, NotFound
from router.jsonfast import loads

# Paths whose body names a model (or gets the pool's default one).
MODEL_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/rerank",
        "/v1/score",
        "/v1/moderations",
    }
)

# Engine endpoints under /v1 that change the engine rather than ask it (vLLM's runtime LoRA
# loading): never forwarded. Outside /v1 nothing is (vLLM's /pause, /abort_requests,
# /update_weights, /tokenize, SGLang's /flush_cache ... answer 404 from the router).
ENGINE_ADMIN_PATHS = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})

# Hop-by-hop headers (RFC 9110 7.6.1) and those the proxy sets itself.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_REQUEST_DROP = HOP_BY_HOP | {b"host", b"content-length", b"expect"}


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """The routing-relevant facts of one request."""

    model: str | None = None
    stream: bool = False
    # a stream whose client did not touch ``stream_options`` (or only declined usage): the
    # router may ask for usage and remove that event again (see ``usage_addable``)
    add_usage: bool = False
    # no ``model`` (or an empty one) on a path that takes one: both engines serve it (SGLang
    # as "default", vLLM as its first served name); the router names the pool's model
    fill_model: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    parsed: dict[str, Any] | None = None
    # the prompt's size: characters of its text, or tokens when it was sent as token ids
    prompt_chars: int = 0
    prompt_tokens: int | None = None

    @property
    def sampling(self) -> bool:
        """Sampled rather than greedy: a temperature above 0, or none (the OpenAI default, 1)."""
        return self.temperature is None or self.temperature > 0


EMPTY = RequestInfo()


def has_api_key(headers: list[tuple[bytes, bytes]], keys: list[bytes]) -> bool:
    """Whether the request presents one of ``keys`` (``Authorization: Bearer`` or ``x-api-key``)."""
    given = next((v for k, v in headers if k == b"authorization"), b"")
    token = given[7:].strip() if given[:7].lower() == b"bearer " else b""
    if not token:
        token = next((v for k, v in headers if k == b"x-api-key"), b"")
    ok = False
    for key in keys:  # compare with every key: the time taken reveals nothing
        ok |= hmac.compare_digest(token, key)
    return ok


def check_path(path: str) -> None:
    """Refuse a /v1 path that could reach elsewhere on an engine that normalises paths: dot
    segments (also percent-encoded: ``path`` is decoded), backslashes, control characters, and
    the engine's own admin endpoints (checklist case 14)."""
    if path in ENGINE_ADMIN_PATHS:
        raise NotFound(f"{path} is not served through the router")
    if "." in path or "\\" in path or not path.isprintable():
        segments = path.split("/")
        if "." in segments or ".." in segments or "\\" in path or not path.isprintable():
            message = "the path has dot segments, backslashes or control characters"
            raise BadRequest(message, "invalid_path")


def _is_json(content_type: bytes | None) -> bool:
    if not content_type:
        return True
    ctype = content_type.split(b";", 1)[0].strip().lower()
    return ctype == b"application/json" or ctype.endswith(b"+json")


def _text(body: bytes) -> str:
    """``body.decode("utf-8-sig")``: UTF-8 after an optional BOM; the plain decode is faster."""
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return body.decode("utf-8-sig")  # (raises, with its positions counted after a BOM)
    return text[1:] if text[:1] == "\ufeff" else text


def inspect(path: str, body: bytes, content_type: bytes | None) -> RequestInfo:
    """Pick the routing fields out of a request body; raise ``BadRequest`` when it is unusable."""
    needs_model = path in MODEL_PATHS
    if not body:
        if needs_model:
            raise BadRequest("request body is empty; expected a JSON object", "invalid_json")
        return EMPTY
    if not needs_model and not _is_json(content_type):
        return EMPTY  # e.g. multipart audio uploads: forwarded untouched
    try:
        obj = loads(_text(body))  # (a str skips json's encoding sniffing)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", "invalid_json") from None
    except RecursionError:  # (e.g. 100,000 nested arrays: the C decoder recurses per level)
        raise BadRequest("request body is nested too deeply", "invalid_json") from None
    if not isinstance(obj, dict):
        raise BadRequest("request body must be a JSON object", "invalid_json")
    model = obj.get("model")
    if needs_model and model is not None and not isinstance(model, str):
        raise BadRequest("model must be a string", "invalid_model")
    stream = obj.get("stream") is True
    max_tokens = obj.get("max_completion_tokens", obj.get("max_tokens"))
    temperature = obj.get("temperature")
    chars, tokens = prompt_size(obj)
    return RequestInfo(
        model=model if isinstance(model, str) and model else None,
        fill_model=needs_model and not model,
        stream=stream,
        add_usage=stream and usage_addable(obj.get("stream_options", None)),
        max_tokens=max_tokens if type(max_tokens) is int else None,
        temperature=_number(temperature),
        parsed=obj,
        prompt_chars=chars,
        prompt_tokens=tokens,
    )


def usage_addable(options: Any) -> bool:
    """Whether the router may ask for usage on a stream with these ``stream_options`` and
    strip that event again, so that the client still gets what the engine would send it.

    Only without options, or with exactly ``{"include_usage": false}``. Anything else is the
    client's: ``{}`` already asks for usage on vLLM 0.11 (``include_usage`` defaults to true
    there) and not on vLLM 0.34 or SGLang; ``continuous_usage_stats`` puts usage in every
    chunk, once ``include_usage`` is on (vLLM). Such options pass untouched, and the router
    counts the usage if the engine sends it (docs/engines.md, section 9)."""
    return options is None or (isinstance(options, dict) and options == {"include_usage": False})


def _number(value: Any) -> float | None:
    """A JSON number as a float (an integer too large for one is infinite); None otherwise."""
    if not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _text_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):  # content parts: count the text ones
        return sum(
            len(part["text"])
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return 0


def prompt_size(obj: dict[str, Any]) -> tuple[int, int | None]:
    """(characters of prompt text, prompt tokens if it was sent as token ids): what routing
    needs to estimate the prefill, from chat ``messages``, a completions ``prompt`` (text, a
    list of texts, or token ids) or a responses-style ``input``."""
    messages = obj.get("messages")
    if isinstance(messages, list):
        return sum(_text_chars(m.get("content")) for m in messages if isinstance(m, dict)), None
    prompt = obj.get("prompt", obj.get("input"))
    if isinstance(prompt, str):
        return len(prompt), None
    if isinstance(prompt, list) and prompt:
        if all(type(t) is int for t in prompt):
            return 0, len(prompt)
        if isinstance(prompt[0], list) and all(type(t) is int for t in prompt[0]):
            return 0, sum(len(p) for p in prompt if isinstance(p, list))
        return sum(_text_chars(p) for p in prompt), None
    return 0, None


def upstream_body(
    info: RequestInfo,
    body: bytes,
    model_map: dict[str, str],
    ask_usage: bool,
    default_model: str | None = None,
) -> bytes:
    """The body to send to a pool: renamed (or named, ``default_model``) model and/or usage
    requested, else unchanged."""
    obj = info.parsed
    if obj is None:
        return body
    rename = info.model is not None and info.model in model_map
    name = info.fill_model and default_model is not None
    add_usage = ask_usage and info.add_usage
    if not rename and not add_usage and not name:
        return body
    if add_usage and not rename and not name and obj and "stream_options" not in obj:
        # The common case, spliced into the bytes: re-encoding a long prompt costs more than
        # the rest of the request's handling (bench/results/overhead.md).
        end = body.rstrip().rfind(b"}")
        if end > 0:
            return body[:end] + b',"stream_options":{"include_usage":true}}'
    obj = dict(obj)
    if rename:
        assert info.model is not None
        obj["model"] = model_map[info.model]
    elif name:
        obj["model"] = default_model
    if add_usage:  # (an explicit true: {} means true on vLLM 0.11, false elsewhere)
        obj["stream_options"] = {"include_usage": True}
    return _encode(obj)


def _encode(obj: dict[str, Any]) -> bytes:
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        # A lone surrogate (``"\\ud800"`` is valid JSON, not valid UTF-8): escaped, it reaches the
        # engine as the client wrote it, and the engine decides what it means.
        return json.dumps(obj, separators=(",", ":")).encode()


def connection_named(raw: list[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """The header names a ``Connection`` header lists: hop-by-hop too (RFC 9110 7.6.1)."""
    named = [value for name, value in raw if name == b"connection"]
    if not named:
        return frozenset()
    return frozenset(t.strip().lower() for value in named for t in value.split(b",") if t.strip())


def forward_headers(
    raw: list[tuple[bytes, bytes]],
    client_ip: str | None,
    authorization: bytes | None,
    drop_authorization: bool,
    trust_forwarded: bool = False,
) -> list[tuple[bytes, bytes]]:
    """End-to-end request headers for the upstream, with X-Forwarded-For appended.

    ``authorization``: the pool's own key replaces the client's; ``drop_authorization``: the
    client's key is the router's own (API_KEYS) and must not leak to the engine.
    ``trust_forwarded``: the client is a trusted proxy (TRUSTED_PROXIES), whose X-Forwarded-For
    is kept and appended to; anyone else's is replaced by their address (a client must not
    choose the address the engine logs or rate-limits by). ``TE: trailers`` is kept (as Go's
    ReverseProxy does): it is the one TE value that says something end to end.
    """
    drop = _REQUEST_DROP
    named = connection_named(raw)
    if named:
        drop = drop | named
    out: list[tuple[bytes, bytes]] = []
    forwarded: bytes | None = None
    trailers = False
    for name, value in raw:
        if name in drop:
            if name == b"te" and b"trailers" in value.lower():
                trailers = True
            continue
        if name == b"x-forwarded-for":
            if trust_forwarded:
                forwarded = value if forwarded is None else forwarded + b", " + value
            continue
        if name == b"authorization" and (authorization is not None or drop_authorization):
            continue
        out.append((name, value))
    if trailers:
        out.append((b"te", b"trailers"))
    if client_ip:
        ip = client_ip.encode()
        forwarded = ip if forwarded is None else forwarded + b", " + ip
    if forwarded is not None:
        out.append((b"x-forwarded-for", forwarded))
    if authorization is not None:
        out.append((b"authorization", authorization))
    return out


def response_headers(
    raw: list[tuple[bytes, bytes]], keep_length: bool
) -> list[tuple[bytes, bytes]]:
    """End-to-end response headers; content-length only when the body passes unchanged."""
    drop = HOP_BY_HOP
    named = connection_named(raw)
    if named - HOP_BY_HOP:  # (usually just "keep-alive" or "close")
        drop = drop | named
    return [
        (name, value)
        for name, value in raw
        if name not in drop and (keep_length or name != b"content-length")
    ]
