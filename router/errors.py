"""The router's exceptions and their OpenAI-shaped answers.

Every error a client can see from the router itself is ``{"error": {"message", "type", "code"}}``
with a fitting status; errors from an engine pass through untouched.
"""

from __future__ import annotations

import json


def error_body(message: str, type_: str, code: str | int | None) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": type_, "param": None, "code": code}},
        separators=(",", ":"),
    ).encode()


def sse_error_event(message: str, type_: str, code: str | int | None) -> bytes:
    """The event vLLM and SGLang send when a stream fails after it started."""
    return b"data: " + error_body(message, type_, code) + b"\n\n"


class RouterError(Exception):
    status = 500
    type_ = "server_error"
    code = "internal_error"

    def __init__(self, message: str, *, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or []

    def body(self) -> bytes:
        return error_body(self.message, self.type_, self.code)


class BadRequest(RouterError):
    status = 400
    type_ = "invalid_request_error"

    def __init__(self, message: str, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.code = code


class NotFound(RouterError):
    status = 404
    type_ = "invalid_request_error"
    code = "not_found"


class PayloadTooLarge(RouterError):
    status = 413
    type_ = "invalid_request_error"
    code = "body_too_large"


class RequestTimeout(RouterError):
    """The request was not received whole in time (slowloris): the connection is closed after."""

    status = 408
    type_ = "invalid_request_error"
    code = "request_timeout"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers=[(b"connection", b"close")])


class Unauthorized(RouterError):
    status = 401
    type_ = "authentication_error"
    code = "invalid_api_key"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers=[(b"www-authenticate", b"Bearer")])


class NoBackend(RouterError):
    """No pool can take the request right now."""

    status = 503
    type_ = "server_error"
    code = "no_backend_available"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message, headers=[(b"retry-after", str(retry_after).encode())])


class QueueFull(RouterError):
    """The router's own queue (QUEUE_SIZE) is full."""

    status = 429
    type_ = "rate_limit_error"
    code = "queue_full"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message, headers=[(b"retry-after", str(retry_after).encode())])


class UpstreamUnavailable(RouterError):
    status = 502
    type_ = "server_error"
    code = "upstream_unavailable"


class UpstreamTimeout(RouterError):
    status = 504
    type_ = "server_error"
    code = "upstream_timeout"
