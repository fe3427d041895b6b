"""Which gateway connections went away (router/gateway/connections.py), and what the EPP lets
go then (Picker.gateway_gone): plain data and a real RouterApp, no sockets."""

from __future__ import annotations

import pytest

from router.gateway.app import EppApp
from router.gateway.connections import Connections
from router.gateway.exchange import Exchange
from tests.gateway.test_exchange import CHAT, SPEC, body, epp, headers
from tests.gateway.test_exchange import ended as record
from tests.support.http import metric_value

pytestmark = pytest.mark.anyio

ONE, TWO = "ipv4:127.0.0.1:40001", "ipv4:127.0.0.1:40002"


def test_a_peer_is_gone_only_if_quiet_since_its_last_log_stream_closed() -> None:
    c = Connections()
    c.log_opened(ONE)
    c.log_opened(ONE)
    assert c.log_closed(ONE) is None  # another of its streams is open
    token = c.log_closed(ONE)
    assert token is not None
    assert c.gone(ONE, token) and not c.gone(ONE, token)  # (asked once: forgotten)
    # heard from again over ext_proc, or a new log stream: alive
    c.log_opened(ONE)
    quiet = c.log_closed(ONE)
    assert quiet is not None
    c.heard(ONE)
    assert not c.gone(ONE, quiet)
    c.log_opened(TWO)
    quiet = c.log_closed(TWO)
    assert quiet is not None
    c.log_opened(TWO)
    assert not c.gone(TWO, quiet)
    # a later closing supersedes an earlier token
    again = c.log_closed(TWO)
    assert again is not None and not c.gone(TWO, quiet) and c.gone(TWO, again)
    assert c.status() == {"log_streams": 0, "quiet_peers": 0}


async def route(app: EppApp, request_id: str, source: str) -> None:
    exchange = Exchange(app.picker, source)
    await exchange.on(headers(request_id))
    assert await exchange.on(body(CHAT.encode()))


async def test_a_gone_gateway_connection_lets_go_of_its_requests_only() -> None:
    app, _ = epp(crossover=100)
    tracker = app.router.tracker
    await route(app, "a1", ONE)
    await route(app, "a2", ONE)
    await route(app, "b1", TWO)
    assert tracker.by_backend[SPEC] == 3
    assert app.picker.gateway_gone(ONE) == 2
    assert tracker.by_backend[SPEC] == 1 and len(app.picker.book) == 1
    assert app.picker.gateway_gone(ONE) == 0
    # their records, should they come after all: no lease, counted, nothing released twice
    app.picker.ended(record("a1"))
    assert app.picker.unknown == 1 and tracker.by_backend[SPEC] == 1
    app.picker.ended(record("b1"))
    assert tracker.total == 0
    text = app.metrics_text().decode()
    assert metric_value(text, "spec_router_epp_leases_orphaned_total") == 2
    assert app.status()["gateway"]["orphaned"] == 2
