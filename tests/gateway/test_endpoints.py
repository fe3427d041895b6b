"""Backend URLs as the ip:port endpoints Envoy routes to (router/gateway/endpoints.py)."""

from __future__ import annotations

import pytest

from router.gateway.endpoints import EndpointError, Endpoints, endpoint_of
from router.pools import BASELINE, SPECULATIVE, Pool


def test_a_url_with_an_ip_host_is_an_endpoint() -> None:
    assert endpoint_of("http://10.0.0.5:8000") == "10.0.0.5:8000"
    assert endpoint_of("http://10.0.0.5:8000/") == "10.0.0.5:8000"
    assert endpoint_of("http://10.0.0.5") == "10.0.0.5:80"
    assert endpoint_of("http://[fd00::5]:8000") == "[fd00::5]:8000"


@pytest.mark.parametrize("url", ["http://sglang-eagle3:30000", "http://10.0.0.5:8000/engine"])
def test_what_the_gateway_cannot_route_to_is_refused_with_its_reason(url: str) -> None:
    with pytest.raises(EndpointError, match=url):
        endpoint_of(url)


def test_the_subset_hint_excludes_every_backend_it_does_not_name() -> None:
    pools: dict[Pool, list[str]] = {
        SPECULATIVE: ["http://10.0.0.1:1"],
        BASELINE: ["http://10.0.0.2:2"],
    }
    endpoints = Endpoints(pools)
    assert endpoints.all() == {"http://10.0.0.1:1": "10.0.0.1:1", "http://10.0.0.2:2": "10.0.0.2:2"}
    assert endpoints.backend("10.0.0.2:2") == "http://10.0.0.2:2"
    assert endpoints.backend("10.0.0.9:9") is None
    assert endpoints.excluded(None) == frozenset()
    assert endpoints.excluded(frozenset({"10.0.0.2:2"})) == {"http://10.0.0.1:1"}
    assert endpoints.excluded(frozenset()) == {"http://10.0.0.1:1", "http://10.0.0.2:2"}
    assert endpoints.excluded(frozenset({"10.0.0.9:9"})) == {
        "http://10.0.0.1:1",
        "http://10.0.0.2:2",
    }
    # a backend that joins a pool later is an endpoint as soon as it is there
    pools[BASELINE].append("http://10.0.0.3:3")
    assert endpoints.excluded(frozenset({"10.0.0.3:3"})) == {
        "http://10.0.0.1:1",
        "http://10.0.0.2:2",
    }
    assert endpoints.backend("10.0.0.3:3") == "http://10.0.0.3:3"
    with pytest.raises(EndpointError, match="same ip:port"):
        Endpoints({SPECULATIVE: ["http://10.0.0.1:80"], BASELINE: ["http://10.0.0.1"]})
