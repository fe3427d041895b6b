"""The ext_proc messages the EPP builds and reads (router/gateway/messages.py), in process."""

from __future__ import annotations

import json
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from google.protobuf import json_format, struct_pb2

from router.errors import NoBackend, QueueFull, Unauthorized
from router.gateway import messages
from router.gateway.messages import CHUNK, DESTINATION


def test_route_to_names_the_endpoint_in_a_header_and_in_envoy_lb_metadata() -> None:
    answer = messages.route_to("10.0.0.5:8000", [(b"authorization", b"Bearer pool")], ["x-api-key"])
    common = answer.request_headers.response
    assert common.clear_route_cache  # (ignored by Envoy without a header mutation: it has one)
    sets = {h.header.key: h for h in common.header_mutation.set_headers}
    assert sets[DESTINATION].header.raw_value == b"10.0.0.5:8000"
    assert sets["authorization"].header.raw_value == b"Bearer pool"
    # overwrite: the default would append to a client-sent value
    assert all(
        h.append_action == base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
        for h in sets.values()
    )
    assert list(common.header_mutation.remove_headers) == ["x-api-key"]
    lb = json_format.MessageToDict(answer.dynamic_metadata)
    assert lb == {"envoy.lb": {DESTINATION: "10.0.0.5:8000"}}


def test_the_body_goes_back_in_chunks_of_at_most_62_kb() -> None:
    body = bytes(range(256)) * 1000  # 256,000 bytes
    chunks = [
        m.request_body.response.body_mutation.streamed_response for m in messages.body_back(body)
    ]
    assert [len(c.body) for c in chunks] == [CHUNK] * 4 + [256_000 - 4 * CHUNK]
    assert b"".join(c.body for c in chunks) == body
    assert [c.end_of_stream for c in chunks] == [False] * 4 + [True]
    # trailers follow: no chunk ends the stream
    assert not any(
        m.request_body.response.body_mutation.streamed_response.end_of_stream
        for m in messages.body_back(body, end=False)
    )
    # an empty body: one empty chunk that ends it
    (empty,) = messages.body_back(b"")
    part = empty.request_body.response.body_mutation.streamed_response
    assert part.body == b"" and part.end_of_stream
    # exactly one chunk's worth
    assert len(messages.body_back(b"x" * CHUNK)) == 1


def test_a_refusal_is_an_immediate_response_in_the_openai_shape() -> None:
    for error, status in (
        (QueueFull("the router's queue is full", 3), 429),
        (NoBackend("no backend", 2), 503),
        (Unauthorized("invalid or missing API key"), 401),
    ):
        answer = messages.refuse(error).immediate_response
        assert answer.status.code == status
        headers = {h.header.key: h.header.raw_value for h in answer.headers.set_headers}
        assert headers["content-type"] == b"application/json"
        for name, value in error.headers:
            assert headers[name.decode()] == value
        body = json.loads(answer.body)["error"]
        assert body["code"] == error.code and body["message"] == error.message
        assert answer.details == f"spec_router_{error.code}"


def test_headers_are_read_from_raw_values_lower_cased() -> None:
    part = ep.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[
                base_pb2.HeaderValue(key=":path", raw_value=b"/v1/chat/completions?x=1"),
                base_pb2.HeaderValue(key="X-Request-Id", raw_value=b"abc"),
                base_pb2.HeaderValue(key="x-old", value="v"),
            ]
        )
    )
    assert messages.headers_of(part) == [
        (b":path", b"/v1/chat/completions?x=1"),
        (b"x-request-id", b"abc"),
        (b"x-old", b"v"),
    ]


def with_hint(value: Any, key: str = messages.SUBSET_KEY) -> Any:
    request = ep.ProcessingRequest(request_headers=ep.HttpHeaders())
    if value is not None:
        hint = struct_pb2.Struct()
        hint.update({key: value})
        request.metadata_context.filter_metadata[messages.SUBSET_NAMESPACE].CopyFrom(hint)
    return request


def test_the_subset_hint_as_a_list_or_a_comma_separated_string() -> None:
    assert messages.subset_of(ep.ProcessingRequest()) is None
    assert messages.subset_of(with_hint(None)) is None
    assert messages.subset_of(with_hint(["a:1"], key="other")) is None
    both = frozenset({"10.0.0.1:80", "10.0.0.2:80"})
    assert messages.subset_of(with_hint(["10.0.0.1:80", "10.0.0.2:80"])) == both
    assert messages.subset_of(with_hint("10.0.0.1:80, 10.0.0.2:80")) == both
    # an empty list is a hint that allows nothing (the EPP answers 503); non-strings are ignored
    assert messages.subset_of(with_hint([])) == frozenset()
    assert messages.subset_of(with_hint([1, "10.0.0.1:80", None])) == frozenset({"10.0.0.1:80"})


def test_response_headers_get_the_routers_own() -> None:
    answer = messages.response_headers_back([(b"x-spec-router-pool", b"baseline")])
    (header,) = answer.response_headers.response.header_mutation.set_headers
    assert (header.header.key, header.header.raw_value) == ("x-spec-router-pool", b"baseline")
