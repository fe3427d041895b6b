"""Backend URLs as the ip:port endpoints Envoy routes to, following the members as they join,
drain and leave (router/gateway/endpoints.py, over a real store and roster; in process)."""

from __future__ import annotations

import pytest

from router.gateway.endpoints import (
    EndpointError,
    Endpoints,
    EndpointTaken,
    check_configured,
    endpoint_of,
)
from router.members.roster import Roster
from router.members.store import LocalStore
from router.pools import BASELINE, SPECULATIVE, Pool

A, B, C = "http://10.0.0.1:1", "http://10.0.0.2:2", "http://10.0.0.3:3"


def test_a_url_with_an_ip_host_is_an_endpoint() -> None:
    assert endpoint_of("http://10.0.0.5:8000") == "10.0.0.5:8000"
    assert endpoint_of("http://10.0.0.5:8000/") == "10.0.0.5:8000"
    assert endpoint_of("http://10.0.0.5") == "10.0.0.5:80"
    assert endpoint_of("http://[fd00::5]:8000") == "[fd00::5]:8000"


@pytest.mark.parametrize("url", ["http://sglang-eagle3:30000", "http://10.0.0.5:8000/engine"])
def test_what_the_gateway_cannot_route_to_is_refused_with_its_reason(url: str) -> None:
    with pytest.raises(EndpointError, match=url):
        endpoint_of(url)


def test_names_are_refused_under_static_discovery_only() -> None:
    named: dict[Pool, list[str]] = {SPECULATIVE: ["http://sglang-eagle3:30000"], BASELINE: [B]}
    with pytest.raises(EndpointError, match="SPEC_ROUTER_DISCOVERY=dns") as refused:
        check_configured(named, "static")
    assert "IP address" in str(refused.value)
    check_configured(named, "dns")  # a set of addresses, each an endpoint
    # what no discovery makes routable: a path prefix (named or not), one ip:port twice
    prefixed: dict[Pool, list[str]] = {SPECULATIVE: ["http://10.0.0.5:8000/x"], BASELINE: [B]}
    with pytest.raises(EndpointError, match="path prefix"):
        check_configured(prefixed, "static")
    with pytest.raises(EndpointError, match="path prefix"):
        check_configured(prefixed, "dns")
    with pytest.raises(EndpointError, match="path prefix"):
        check_configured({SPECULATIVE: ["http://eagle3.svc:8000/x"], BASELINE: [B]}, "dns")
    with pytest.raises(EndpointError, match="same ip:port"):
        check_configured(
            {SPECULATIVE: ["http://10.0.0.1:80"], BASELINE: ["http://10.0.0.1"]}, "dns"
        )


def test_the_endpoints_follow_the_members() -> None:
    store = LocalStore(8)
    roster = Roster(store)
    store.join(SPECULATIVE, A, "static", None, 0.0)
    store.join(BASELINE, B, "static", None, 0.0)
    roster.sync()
    endpoints = Endpoints(roster.pools, roster.members)
    roster.subscribe(endpoints.applied)
    assert endpoints.all() == {A: "10.0.0.1:1", B: "10.0.0.2:2"}
    assert endpoints.backend("10.0.0.2:2") == B and endpoints.backend("10.0.0.9:9") is None
    assert endpoints.excluded(None) == frozenset()
    assert endpoints.excluded(frozenset({"10.0.0.2:2"})) == {A}
    assert endpoints.excluded(frozenset({"10.0.0.9:9"})) == {A, B}

    # an address that joins (from DNS) is an endpoint from the sync that makes it a member
    store.join(SPECULATIVE, C, "dns", "e.svc", 1.0)
    roster.sync()
    assert endpoints.backend("10.0.0.3:3") == C and endpoints.endpoint(C) == "10.0.0.3:3"
    assert endpoints.excluded(frozenset({"10.0.0.3:3"})) == {A, B}

    # draining: no hint can allow it (not routable), but its requests' records still name it
    store.drain(A, 2.0, 60.0)
    roster.sync()
    assert endpoints.urls() == [C, B]
    assert endpoints.excluded(frozenset({"10.0.0.1:1"})) == {B, C}
    assert endpoints.backend("10.0.0.1:1") == A and A in endpoints.all()

    # removed: gone both ways; the address may join again, and is an endpoint again
    store.remove(A)
    roster.sync()
    assert endpoints.backend("10.0.0.1:1") is None and A not in endpoints.all()
    store.join(BASELINE, A, "admin", None, 3.0)
    roster.sync()
    assert endpoints.backend("10.0.0.1:1") == A


def test_a_backend_that_would_join_is_checked_first() -> None:
    endpoints = Endpoints({SPECULATIVE: [A], BASELINE: [B]}, [A, B])
    endpoints.check(C)
    endpoints.check(A)  # (the same URL: the store answers that it is a member already)
    with pytest.raises(EndpointTaken, match="10.0.0.1:1 already"):
        endpoints.check("https://10.0.0.1:1")
    with pytest.raises(EndpointError, match="IP address"):
        endpoints.check("http://engine.svc:1")
    with pytest.raises(EndpointError, match="same ip:port"):
        Endpoints({SPECULATIVE: [A], BASELINE: []}, [A, "https://10.0.0.1:1"])
