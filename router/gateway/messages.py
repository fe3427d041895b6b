"""Envoy's ext_proc messages, to and from plain values: the only module that builds them.

What the EPP sends back for a routed request, in order (the endpoint picker protocol,
kubernetes-sigs/gateway-api-inference-extension ``docs/proposals/004-endpoint-picker-protocol``):
the request-headers response naming the endpoint in ``x-gateway-destination-endpoint`` and under
``envoy.lb`` dynamic metadata (with ``clear_route_cache``: Envoy ignores that flag without a
header mutation), then the body back in chunks of at most ``CHUNK`` bytes, the last with
``end_of_stream`` (unless trailers follow). A refusal is one ``ImmediateResponse`` instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.type.v3 import http_status_pb2
from google.protobuf import json_format

from router.errors import RouterError

# llm-d's BodyByteLimit (pkg/common/envoy/chunking.go): "certain envoy implementations set a max
# limit of 64Kb per streamed chunk"; Envoy's processing_mode.proto recommends <= 64 KiB.
CHUNK = 62_000
DESTINATION = "x-gateway-destination-endpoint"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"

Headers = list[tuple[bytes, bytes]]
# Envoy's messages are generated code without type stubs: they cross this module as ``Message``.
Message = Any


def headers_of(message: Message) -> Headers:
    """A ``HttpHeaders`` message's headers as the proxy reads them (ASGI's shape: lower-case
    names, bytes). Envoy fills ``raw_value``, not ``value``."""
    return [
        (h.key.lower().encode("latin-1"), h.raw_value or h.value.encode("latin-1"))
        for h in message.headers.headers
    ]


def subset_of(message: Message) -> frozenset[str] | None:
    """The data plane's subset hint on a ``ProcessingRequest``: the endpoints the EPP may pick
    from; None when there is none (any endpoint). A list of strings (``set_metadata``, control
    planes) or one comma-separated string (``header_to_metadata`` makes only strings)."""
    if not message.HasField("metadata_context"):
        return None
    spaces = message.metadata_context.filter_metadata
    if SUBSET_NAMESPACE not in spaces:
        return None
    hint = json_format.MessageToDict(spaces[SUBSET_NAMESPACE])
    if SUBSET_KEY not in hint:
        return None
    return parse_subset(hint[SUBSET_KEY])


def parse_subset(value: object) -> frozenset[str]:
    """``ip:port`` endpoints from a hint's value; anything but strings is ignored (as llm-d)."""
    items = value if isinstance(value, list) else [value]
    return frozenset(
        part.strip()
        for item in items
        if isinstance(item, str)
        for part in item.split(",")
        if part.strip()
    )


def _set(name: str, value: bytes) -> Message:
    # Overwrite: the default (APPEND_IF_EXISTS_OR_ADD) would add to a client-sent value.
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=name, raw_value=value),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def route_to(
    endpoint: str, set_headers: Sequence[tuple[bytes, bytes]] = (), remove: Sequence[str] = ()
) -> Message:
    """The request-headers response that sends the request to ``endpoint`` (``ip:port``), with
    more request headers to set (the pool's own key) or remove (the router's key)."""
    mutation = ep.HeaderMutation(
        set_headers=[_set(DESTINATION, endpoint.encode())]
        + [_set(k.decode("latin-1"), v) for k, v in set_headers],
        remove_headers=list(remove),
    )
    common = ep.CommonResponse(clear_route_cache=True, header_mutation=mutation)
    response = ep.ProcessingResponse(request_headers=ep.HeadersResponse(response=common))
    response.dynamic_metadata.update({LB_NAMESPACE: {DESTINATION: endpoint}})
    return response


def body_back(body: bytes, end: bool = True) -> list[Message]:
    """The body handed back in chunks of at most ``CHUNK`` bytes (an empty body: one empty
    chunk); ``end``: the last one ends the stream (False when trailers follow)."""
    chunks = [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)] or [b""]
    last = len(chunks) - 1
    return [
        ep.ProcessingResponse(
            request_body=ep.BodyResponse(
                response=ep.CommonResponse(
                    body_mutation=ep.BodyMutation(
                        streamed_response=ep.StreamedBodyResponse(
                            body=chunk, end_of_stream=end and i == last
                        )
                    )
                )
            )
        )
        for i, chunk in enumerate(chunks)
    ]


def trailers_back() -> Message:
    return ep.ProcessingResponse(request_trailers=ep.TrailersResponse())


def body_unchanged() -> Message:
    """A response body chunk passed on as it is (only if Envoy is set to send them)."""
    return ep.ProcessingResponse(response_body=ep.BodyResponse())


def response_trailers_back() -> Message:
    return ep.ProcessingResponse(response_trailers=ep.TrailersResponse())


def response_headers_back(add: Iterable[tuple[bytes, bytes]] = ()) -> Message:
    """The answer to the response headers: the router's own headers added to the response."""
    mutation = ep.HeaderMutation(set_headers=[_set(k.decode("latin-1"), v) for k, v in add])
    return ep.ProcessingResponse(
        response_headers=ep.HeadersResponse(response=ep.CommonResponse(header_mutation=mutation))
    )


def refuse(error: RouterError) -> Message:
    """The router's own answer in the OpenAI error shape, with its headers (Retry-After,
    WWW-Authenticate); Envoy sends it and closes the ext_proc stream. ``details`` shows up as
    the access log's ``response_code_details``."""
    headers = [(b"content-type", b"application/json"), *error.headers]
    return ep.ProcessingResponse(
        immediate_response=ep.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=error.status),
            headers=ep.HeaderMutation(set_headers=[_set(k.decode(), v) for k, v in headers]),
            body=error.body(),
            details=f"spec_router_{error.code}",
        )
    )
