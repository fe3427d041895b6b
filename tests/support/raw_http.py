"""HTTP/1.1 over a raw socket, for requests no well-behaved client would send.

``exchange`` writes bytes exactly as given and reads back at most one response, parsed with
httptools; the connection is closed afterwards. Also the checks every hostile-input test makes
of an answer: a 5xx from the router itself (not an engine's, passed through) is a failure, and
every error the router writes is in the OpenAI shape.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field

import httptools

from tests.support.http import router_status, wait_for


@dataclass
class RawResponse:
    status: int = 0
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""
    complete: bool = False
    started: bool = False

    # httptools callbacks
    def on_headers_complete(self) -> None:
        self.started = True

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


def exchange(url: str, data: bytes, timeout: float = 5.0) -> RawResponse | None:
    """Send ``data``; the response, or None if the router closed without one."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    response = RawResponse()
    parser = httptools.HttpResponseParser(response)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except OSError:  # the router closed early (after answering a bad head, say)
            pass
        deadline = time.monotonic() + timeout
        while not response.complete and time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            parser.feed_data(chunk)
        if not response.started:
            return None
        response.status = parser.get_status_code()
    return response


def check_answer(status: int, routed: bool, body: bytes) -> None:
    """No 5xx from the router itself; its errors in the OpenAI shape. ``routed``: the answer is
    an engine's, passed through (it carries ``x-spec-router-pool``), and may be anything."""
    if routed:
        return
    assert status < 500, (status, body[:300])
    if status >= 400:
        check_error_shape(body)


def check_error_shape(body: bytes) -> None:
    """``{"error": {"message", "type", "param", "code"}}``, as the router writes every error."""
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and isinstance(error["code"], str)


def check_clean(router_url: str) -> None:
    """Nothing in flight, no upstream connection busy: every path released what it took."""

    def clean() -> bool:
        status = router_status(router_url)
        busy = sum(
            b["connections"]["busy"] for p in status["pools"].values() for b in p["backends"]
        )
        return bool(status["in_flight"]["total"] == 0 and busy == 0)

    wait_for(clean, timeout=5)
