"""Envoy's access-log records, read into what ends a request (router/gateway/records.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from envoy.data.accesslog.v3 import accesslog_pb2 as al
from google.protobuf import struct_pb2

from router.gateway.records import USAGE_NAMESPACE, ending
from router.upstream import verdicts


def entry(
    request_id: str = "r1",
    code: int = 200,
    details: str = "via_upstream",
    flags: tuple[str, ...] = (),
    upstream: str | None = "10.0.0.5",
    port: int = 8000,
    duration: float | None = 1.25,
    first_byte: float | None = 0.004,
    usage: dict[str, float] | None = None,
) -> al.HTTPAccessLogEntry:
    e = al.HTTPAccessLogEntry()
    e.request.request_id = request_id
    if code:
        e.response.response_code.value = code
    e.response.response_code_details = details
    e.response.response_body_bytes = 1234
    common = e.common_properties
    for flag in flags:
        setattr(common.response_flags, flag, True)
    if upstream is not None:
        common.upstream_remote_address.socket_address.address = upstream
        common.upstream_remote_address.socket_address.port_value = port
    if duration is not None:
        common.duration.FromTimedelta(timedelta(seconds=duration))
    if first_byte is not None:
        common.time_to_first_upstream_rx_byte.FromTimedelta(timedelta(seconds=first_byte))
    if usage is not None:
        s = struct_pb2.Struct()
        s.update(usage)
        common.metadata.filter_metadata[USAGE_NAMESPACE].CopyFrom(s)
    return e


def test_a_normal_stream() -> None:
    end = ending(entry(usage={"prompt_tokens": 5.0, "completion_tokens": 7.0}))
    assert end.request_id == "r1" and end.status == 200 and end.via_upstream
    assert end.upstream == "10.0.0.5:8000" and end.body_bytes == 1234
    assert end.duration == pytest.approx(1.25) and end.first_upstream_byte == pytest.approx(0.004)
    assert end.usage is not None
    assert (end.usage.prompt_tokens, end.usage.completion_tokens) == (5, 7)
    assert not end.client_gone and end.failure() is None


def test_a_client_that_left() -> None:
    # mid-stream (DC): the status the client had been sent; before the first byte: none
    mid = ending(entry(flags=("downstream_connection_termination",)))
    assert mid.client_gone and mid.status == 200 and mid.failure() is None
    early = ending(
        entry(code=0, details="downstream_remote_disconnect", first_byte=None,
              flags=("downstream_connection_termination",))
    )  # fmt: skip
    assert early.client_gone and early.status == 0 and not early.via_upstream


def test_upstream_failures_as_the_proxys_error_kinds() -> None:
    refused = ending(
        entry(code=503, details="upstream_reset_before_response_started{remote_connection_failure}",
              flags=("upstream_connection_failure",), first_byte=None)
    )  # fmt: skip
    assert refused.failure() == ("connect", False) and not refused.via_upstream
    assert verdicts.after_error("connect", False).eject
    broken = ending(entry(flags=("upstream_protocol_error",)))  # reset after the headers
    assert broken.failure() == ("reset", True)
    assert verdicts.mid_response("reset").eject
    idle = ending(entry(code=504, flags=("stream_idle_timeout",)))
    assert idle.failure() == ("idle_timeout", True)
    assert not verdicts.mid_response("idle_timeout").eject  # a slow engine, not a dead one


def test_envoys_own_answers_blame_no_engine() -> None:
    # no healthy upstream, the EPP's own refusal: no failure kind, and not via the upstream
    uh = ending(entry(code=503, details="no_healthy_upstream", flags=("no_healthy_upstream",),
                      upstream=None, first_byte=None))  # fmt: skip
    assert uh.failure() is None and not uh.via_upstream and uh.upstream is None
    refused = ending(entry(code=429, details="spec_router_queue_full", upstream=None))
    assert refused.failure() is None and not refused.via_upstream


def test_odd_values_are_read_safely() -> None:
    end = ending(entry(upstream="fd00::5", usage={"completion_tokens": -3.0, "prompt_tokens": 1.5}))
    assert end.upstream == "[fd00::5]:8000"
    assert end.usage is not None and (end.usage.prompt_tokens, end.usage.completion_tokens) == (
        0,
        0,
    )
    bare = ending(al.HTTPAccessLogEntry())
    assert bare.request_id == "" and bare.status == 0 and bare.upstream is None
    assert bare.duration is None and bare.usage is None
    assert ending(entry(usage={"prompt_tokens": 3.0})).usage is None  # no completion count
