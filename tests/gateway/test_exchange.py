"""One request through the EPP in process: Envoy's ext_proc messages in, the answers out, the
lease held until Envoy's access-log record of the request, or the max age (router/gateway/
exchange.py and picker.py, on a real RouterApp with a fake clock; no sockets)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from google.protobuf import json_format, struct_pb2
from prometheus_client import CollectorRegistry

from router.gateway import messages
from router.gateway.app import EppApp, EppConfig
from router.gateway.exchange import Exchange
from router.gateway.records import Ending
from router.settings import Settings, SettingsError
from tests.support.http import metric_value

pytestmark = pytest.mark.anyio

SPEC, BASE = "http://10.0.0.1:8001", "http://10.0.0.2:8002"
SPEC_EP, BASE_EP = "10.0.0.1:8001", "10.0.0.2:8002"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def epp(**settings: Any) -> tuple[EppApp, Clock]:
    clock = Clock()
    values: dict[str, Any] = {
        "speculative_urls": [SPEC],
        "baseline_urls": [BASE],
        "policy": "spillover",
        "crossover": 1,
        "learn": False,
        "explore_share": 0.0,
        "ramp_seconds": 0.0,
        **settings,
    }
    app = EppApp(Settings(**values), EppConfig(lease_max_age=60), CollectorRegistry(), clock)
    for url in (SPEC, BASE):  # both engines answered their first health probe
        app.router.health.probe(url, True, clock())
    return app, clock


def headers(request_id: str = "r1", path: str = "/v1/chat/completions", **more: str) -> Any:
    values = {":path": path, ":method": "POST", "x-request-id": request_id, **more}
    return ep.ProcessingRequest(
        request_headers=ep.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[
                    base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()
                ]
            )
        )
    )


def body(data: bytes, end: bool = True, subset: list[str] | None = None) -> Any:
    message = ep.ProcessingRequest(request_body=ep.HttpBody(body=data, end_of_stream=end))
    if subset is not None:
        hint = struct_pb2.Struct()
        hint.update({messages.SUBSET_KEY: subset})
        message.metadata_context.filter_metadata[messages.SUBSET_NAMESPACE].CopyFrom(hint)
    return message


CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})


def destination(answer: Any) -> str:
    sets = answer.request_headers.response.header_mutation.set_headers
    (value,) = [h.header.raw_value for h in sets if h.header.key == messages.DESTINATION]
    lb = json_format.MessageToDict(answer.dynamic_metadata)["envoy.lb"]
    assert lb[messages.DESTINATION] == value.decode()
    return str(value.decode())


def ended(request_id: str, status: int = 200, **kw: Any) -> Ending:
    values: dict[str, Any] = {
        "via_upstream": True, "flags": frozenset(), "upstream": SPEC_EP, "duration": 1.0,
        "first_upstream_byte": 0.01, "body_bytes": 100, "usage": None, **kw,
    }  # fmt: skip
    return Ending(request_id, status, **values)


async def test_the_answers_come_once_the_body_is_whole_and_the_lease_until_the_record() -> None:
    app, clock = epp()
    exchange = Exchange(app.picker)
    assert await exchange.on(headers()) == []
    half = len(CHAT) // 2
    assert await exchange.on(body(CHAT[:half].encode(), end=False)) == []
    answers = await exchange.on(body(CHAT[half:].encode()))
    route, *back = answers
    assert destination(route) == SPEC_EP
    assert b"".join(m.request_body.response.body_mutation.streamed_response.body for m in back) == (
        CHAT.encode()
    )
    tracker = app.router.tracker
    assert tracker.by_backend[SPEC] == 1 and len(app.picker.book) == 1
    (pool,) = await exchange.on(ep.ProcessingRequest(response_headers=ep.HttpHeaders()))
    added = {
        h.header.key: h.header.raw_value
        for h in pool.response_headers.response.header_mutation.set_headers
    }
    assert added == {
        "x-spec-router-pool": b"speculative",
        "x-spec-router-reason": b"below_crossover",
    }
    # the ext_proc stream is over, the request is not: the lease holds until Envoy's record
    assert tracker.by_backend[SPEC] == 1
    clock.now += 2.0
    app.picker.ended(ended("r1"))
    assert tracker.by_backend[SPEC] == 0 and len(app.picker.book) == 0
    text = app.metrics_text().decode()
    assert metric_value(text, "spec_router_requests_total", pool="speculative", code="200") == 1
    assert metric_value(text, "spec_router_request_duration_seconds_sum") == pytest.approx(2.0)
    assert metric_value(text, "spec_router_epp_access_log_records_total", lease="released") == 1
    # a record of a request this EPP never routed: counted, changes nothing
    app.picker.ended(ended("r-other"))
    assert app.picker.unknown == 1 and tracker.total == 0


async def test_spillover_above_the_crossover_and_the_subset_hint() -> None:
    app, _ = epp()
    first, second, hinted = Exchange(app.picker), Exchange(app.picker), Exchange(app.picker)
    await first.on(headers("a"))
    assert destination((await first.on(body(CHAT.encode())))[0]) == SPEC_EP
    await second.on(headers("b"))
    assert destination((await second.on(body(CHAT.encode())))[0]) == BASE_EP
    # the hint allows only the speculative engine, although it is above the crossover
    await hinted.on(headers("c"))
    assert destination((await hinted.on(body(CHAT.encode(), subset=[SPEC_EP])))[0]) == SPEC_EP
    # a hint with none of ours: 503 at once, nothing taken
    refused = Exchange(app.picker)
    await refused.on(headers("d"))
    (answer,) = await refused.on(body(CHAT.encode(), subset=["10.9.9.9:1"]))
    assert answer.immediate_response.status.code == 503 and refused.finished
    assert app.router.tracker.total == 3
    for request_id in "abc":
        app.picker.ended(ended(request_id))
    assert app.router.tracker.total == 0


async def test_refusals_take_nothing_and_are_observed() -> None:
    app, _ = epp(api_keys=["k"], max_body_bytes=1024)
    keyed = {"authorization": "Bearer k"}
    cases = [
        (headers("1"), body(b"{not json"), 401),
        (headers("2", **keyed), body(b"{not json"), 400),
        (headers("3", path="/v1/load_lora_adapter", **keyed), body(b"{}"), 404),
    ]
    for head, part, status in cases:
        exchange = Exchange(app.picker)
        assert await exchange.on(head) == []
        (answer,) = await exchange.on(part)
        assert answer.immediate_response.status.code == status
    # too large: refused as the chunks arrive, before the end of the body
    exchange = Exchange(app.picker)
    await exchange.on(headers("4", **keyed))
    assert await exchange.on(body(b"x" * 1000, end=False)) == []
    (answer,) = await exchange.on(body(b"x" * 100, end=False))
    assert answer.immediate_response.status.code == 413 and exchange.finished
    assert app.router.tracker.total == 0 and len(app.picker.book) == 0
    text = app.metrics_text().decode()
    for code in ("400", "401", "404", "413"):
        assert metric_value(text, "spec_router_requests_total", code=code) == 1


async def test_the_router_key_is_removed_and_a_pool_key_replaces_it() -> None:
    app, _ = epp(api_keys=["k"], baseline_api_key="pool-secret", crossover=0)
    exchange = Exchange(app.picker)
    await exchange.on(headers("1", authorization="Bearer k"))
    route = (await exchange.on(body(CHAT.encode())))[0]
    sets = {
        h.header.key: h.header.raw_value
        for h in route.request_headers.response.header_mutation.set_headers
    }
    assert destination(route) == BASE_EP and sets["authorization"] == b"Bearer pool-secret"
    app2, _ = epp(api_keys=["k"])
    exchange = Exchange(app2.picker)
    await exchange.on(headers("1", authorization="Bearer k"))
    route = (await exchange.on(body(CHAT.encode())))[0]
    assert list(route.request_headers.response.header_mutation.remove_headers) == ["authorization"]


async def test_a_get_is_decided_at_its_headers_and_trailers_are_answered() -> None:
    app, _ = epp()
    get = Exchange(app.picker)
    head = headers("g", path="/v1/models")
    head.request_headers.end_of_stream = True
    (route,) = await get.on(head)
    assert destination(route) == SPEC_EP
    with_trailers = Exchange(app.picker)
    await with_trailers.on(headers("t"))
    assert await with_trailers.on(body(CHAT.encode(), end=False)) == []
    answers = await with_trailers.on(ep.ProcessingRequest(request_trailers=ep.HttpTrailers()))
    assert answers[-1].HasField("request_trailers")
    assert not any(
        m.request_body.response.body_mutation.streamed_response.end_of_stream for m in answers[1:-1]
    )


async def test_what_envoy_reports_judges_the_backend_and_counts_a_client_gone() -> None:
    app, clock = epp(engine_abort_lag=2.0)
    for request_id in ("refused", "left"):
        exchange = Exchange(app.picker)
        await exchange.on(headers(request_id))
        await exchange.on(body(CHAT.encode()))
    # a refused connection takes the engine out (passive health), as in the proxy
    app.picker.ended(
        ended("refused", 503, via_upstream=False, flags=frozenset({"upstream_connection_failure"}),
              first_upstream_byte=None)
    )  # fmt: skip
    assert not app.router.health.usable(SPEC, clock())
    # a client gone mid-stream: released, and counted as a disconnect
    app.picker.ended(
        ended("left", upstream=BASE_EP, flags=frozenset({"downstream_connection_termination"}))
    )
    assert app.router.tracker.total == 0
    text = app.metrics_text().decode()
    assert metric_value(text, "spec_router_client_disconnects_total", pool="baseline") == 1
    assert (
        metric_value(text, "spec_router_upstream_errors_total", backend=SPEC, kind="connect") == 1
    )


async def test_a_lease_whose_record_never_comes_is_let_go_at_the_max_age() -> None:
    app, clock = epp()
    exchange = Exchange(app.picker)
    await exchange.on(headers("lost"))
    await exchange.on(body(CHAT.encode()))
    clock.now += 59
    assert app.picker.expire(60) == 0 and app.router.tracker.total == 1
    clock.now += 2
    assert app.picker.expire(60) == 1 and app.router.tracker.total == 0
    assert metric_value(app.metrics_text().decode(), "spec_router_epp_leases_expired_total") == 1
    # its record, late after all: nothing left to release
    app.picker.ended(ended("lost"))
    assert app.router.tracker.total == 0 and app.picker.unknown == 1


def test_settings_the_epp_cannot_honour_are_refused_at_start() -> None:
    with pytest.raises(SettingsError, match="MODEL_MAP"):
        epp(speculative_model_map={"m": "m-eagle"})
    with pytest.raises(SettingsError, match="IP address"):
        epp(speculative_urls=["http://engine:8000"])
