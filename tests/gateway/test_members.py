"""The EPP over pools that change (router/gateway/app.py with router/membership.py), in process:
the admin API on the EPP's own HTTP endpoints, the endpoints following the members, no new pick
for a draining member, its leases held until Envoy's records (or let go at its drain deadline),
then the member gone. A real RouterApp with a fake clock; no sockets."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from router.gateway.app import EppApp
from router.gateway.exchange import Exchange
from router.membership import SETTLE
from router.settings import SettingsError
from tests.gateway.test_exchange import (
    BASE,
    BASE_EP,
    CHAT,
    SPEC,
    SPEC_EP,
    body,
    destination,
    epp,
    headers,
)
from tests.gateway.test_exchange import ended as record
from tests.support.http import metric_value

pytestmark = pytest.mark.anyio

TOKEN = "s3cret"
ADMIN = {"authorization": f"Bearer {TOKEN}"}
NEW, NEW_EP = "http://10.0.0.3:8003", "10.0.0.3:8003"
API = "http://epp/router/pools/speculative/backends"


async def pick(app: EppApp, request_id: str) -> str:
    exchange = Exchange(app.picker)
    await exchange.on(headers(request_id))
    return destination((await exchange.on(body(CHAT.encode())))[0])


def admin(app: EppApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), headers=ADMIN)


async def test_the_admin_api_on_the_epp_adds_and_drains_endpoints() -> None:
    app, clock = epp(admin_token=TOKEN, crossover=100, drain_timeout=60.0)
    router = app.router
    async with admin(app) as client:
        # what the gateway could not route to, or to one ip:port twice: refused, nothing joins
        named = await client.post(API, json={"url": "http://engine.svc:8003"})
        assert (named.status_code, named.json()["error"]["code"]) == (400, "invalid_url")
        assert "IP address" in named.json()["error"]["message"]
        twice = await client.post(API, json={"url": SPEC.replace("http:", "https:")})
        assert (twice.status_code, twice.json()["error"]["code"]) == (409, "endpoint_exists")
        added = await client.post(API, json={"url": NEW})
        assert added.status_code == 201, added.text
        assert added.json()["source"] == "admin"
        # an endpoint at once; no pick until its first probe says healthy
        assert app.endpoints.backend(NEW_EP) == NEW
        assert app.status()["gateway"]["endpoints"][NEW] == NEW_EP
        assert await pick(app, "r1") == SPEC_EP
        router.health.probe(NEW, True, clock())
        assert await pick(app, "r2") == NEW_EP  # (the least loaded of the pool)

        # it leaves: draining, no new pick, its lease held until Envoy's record
        gone = await client.delete(API, params={"url": NEW})
        assert (gone.status_code, gone.json()["membership"], gone.json()["in_flight"]) == (
            202,
            "draining",
            1,
        )
        for n in range(3):
            assert await pick(app, f"after-{n}") == SPEC_EP
        clock.now += 1.0
        router.membership.tick()
        assert app.endpoints.backend(NEW_EP) == NEW  # (its record is still to come)
        app.picker.ended(record("r2", upstream=NEW_EP))
        assert router.tracker.by_backend.get(NEW, 0) == 0
        clock.now += SETTLE
        router.membership.tick()
        listed = (await client.get(API)).json()["backends"]
        assert [m["url"] for m in listed] == [SPEC]
    assert app.endpoints.backend(NEW_EP) is None and NEW not in app.endpoints.all()
    for request_id in ("r1", "after-0", "after-1", "after-2"):
        app.picker.ended(record(request_id))
    assert router.tracker.total == 0 and len(app.picker.book) == 0


async def test_a_drain_that_times_out_lets_its_leases_go() -> None:
    """The gateway carries the requests: at the deadline the EPP stops counting them, the
    member goes, and their records, when they come, have no lease here."""
    app, clock = epp(admin_token=TOKEN, crossover=100, drain_timeout=30.0)
    router = app.router
    assert await pick(app, "long") == SPEC_EP
    router.membership.leave("speculative", SPEC)
    assert await pick(app, "next") == BASE_EP  # the pool is empty: the other one
    clock.now += 29.0
    router.membership.tick()
    assert router.tracker.by_backend[SPEC] == 1
    clock.now += 1.0
    router.membership.tick()  # the deadline: let go, counted as the proxy counts its cuts
    assert SPEC not in router.tracker.by_backend and SPEC not in app.endpoints.all()
    text = app.metrics_text().decode()
    assert metric_value(text, "spec_router_drain_cuts_total", pool="speculative") == 1
    app.picker.ended(record("long"))
    assert app.picker.unknown == 1
    app.picker.ended(record("next", upstream=BASE_EP))
    assert router.tracker.total == 0 and len(app.picker.book) == 0


def dns_settings(**more: Any) -> dict[str, Any]:
    return {
        "speculative_urls": ["http://eagle3.engines.test:8001"],
        "baseline_urls": [BASE],
        "discovery": "dns",
        "dns_servers": ["127.0.0.1:9"],
        **more,
    }


def test_names_are_pools_under_dns_discovery_and_refused_under_static() -> None:
    app, _ = epp(**dns_settings())
    # nothing resolved yet (the first round runs as it starts): the name is a set, not a member
    assert app.endpoints.all() == {BASE: BASE_EP}
    watched = [w.name for w in app.router.membership.discovery.watches]  # type: ignore[union-attr]
    assert watched == ["eagle3.engines.test"]
    with pytest.raises(SettingsError, match="SPEC_ROUTER_DISCOVERY=dns"):
        epp(**dns_settings(discovery="static"))
    with pytest.raises(SettingsError, match="path prefix"):
        epp(**dns_settings(speculative_urls=["http://eagle3.engines.test:8001/v"]))
