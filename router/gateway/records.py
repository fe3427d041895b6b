"""Envoy's access-log record of one request: when it ended, and how.

Envoy's gRPC access log (``envoy.access_loggers.http_grpc`` on the connection manager) sends one
``HTTPAccessLogEntry`` per downstream request once its last byte went out or it died, 1-10 ms
after (with ``buffer_size_bytes: 0``): that, not the ext_proc stream (which Envoy closes at the
response headers), is when a request's lease ends. ``ending`` reads an entry into plain values;
``failure`` says what an ending means for the backend, in the proxy's own error kinds
(``router.upstream.client.ErrorKind``), so the same verdicts apply.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.gateway.messages import Message
from router.upstream.client import ErrorKind
from router.upstream.stream import Usage

# The namespace ``envoy.filters.http.sse_to_metadata`` writes the stream's token usage under
# (deploy/envoy/envoy.yaml); the access log carries it in ``common_properties.metadata``.
USAGE_NAMESPACE = "spec_router.usage"

# Envoy's response flags that end a request by a failure on the upstream side, as the proxy's
# error kinds. UH (no healthy upstream) and UO (overflow) are Envoy's own state, not an
# engine's: they count as refusals without blaming the backend.
_UPSTREAM_FLAGS: dict[str, ErrorKind] = {
    "upstream_connection_failure": "connect",  # UF
    "upstream_remote_reset": "reset",  # UR
    "upstream_connection_termination": "reset",  # UC
    "upstream_protocol_error": "reset",  # UPE
    "upstream_request_timeout": "total_timeout",  # UT (the route's timeout)
    "upstream_max_stream_duration_reached": "total_timeout",  # UMSDR
    "stream_idle_timeout": "idle_timeout",  # SI
}
_CLIENT_FLAGS = ("downstream_connection_termination", "downstream_remote_reset")  # DC, DR


@dataclass(frozen=True, slots=True)
class Ending:
    """What an access-log record says about its request."""

    request_id: str
    status: int  # 0: no response started (the client left first, say)
    via_upstream: bool  # the status came from the engine, not from Envoy or the EPP
    flags: frozenset[str]
    upstream: str | None  # ip:port that served it (None: no upstream was reached)
    duration: float | None  # seconds, downstream start to end
    first_upstream_byte: float | None  # seconds from the start: the engine's response headers
    body_bytes: int
    usage: Usage | None  # from sse_to_metadata, when the engine sent usage in its stream

    @property
    def client_gone(self) -> bool:
        return any(flag in self.flags for flag in _CLIENT_FLAGS)

    def failure(self) -> tuple[ErrorKind, bool] | None:
        """The upstream failure that ended it, if any: (kind, response started)."""
        kind = next((k for f, k in _UPSTREAM_FLAGS.items() if f in self.flags), None)
        if kind is None:
            return None
        return kind, self.first_upstream_byte is not None


_FLAG_NAMES: tuple[str, ...] | None = None


def _flags(message: Message) -> frozenset[str]:
    global _FLAG_NAMES
    if _FLAG_NAMES is None:
        _FLAG_NAMES = tuple(
            f.name for f in message.DESCRIPTOR.fields if f.name != "unauthorized_details"
        )
    return frozenset(name for name in _FLAG_NAMES if getattr(message, name))


def _seconds(duration: Message) -> float | None:
    if not duration.ByteSize():
        return None
    return float(duration.seconds) + float(duration.nanos) / 1e9


def _usage(common: Message) -> Usage | None:
    spaces = common.metadata.filter_metadata
    if USAGE_NAMESPACE not in spaces:
        return None
    fields = spaces[USAGE_NAMESPACE].fields
    prompt, completion = fields.get("prompt_tokens"), fields.get("completion_tokens")
    if completion is None:
        return None
    return Usage(
        _count(prompt.number_value) if prompt is not None else 0,
        _count(completion.number_value),
    )


def _count(value: float) -> int:
    return int(value) if 0 <= value < 2**53 and value == int(value) else 0


def ending(entry: Message) -> Ending:
    """An ``HTTPAccessLogEntry`` as plain values."""
    common = entry.common_properties
    response = entry.response
    upstream = common.upstream_remote_address.socket_address
    host = upstream.address
    if host and ":" in host:
        host = f"[{host}]"
    return Ending(
        request_id=entry.request.request_id,
        status=response.response_code.value,
        via_upstream=response.response_code_details == "via_upstream",
        flags=_flags(common.response_flags),
        upstream=f"{host}:{upstream.port_value}" if host else None,
        duration=_seconds(common.duration),
        first_upstream_byte=_seconds(common.time_to_first_upstream_rx_byte),
        body_bytes=response.response_body_bytes,
        usage=_usage(common),
    )
