"""The pools' backends as the endpoints Envoy routes to: ``ip:port``, both ways.

The gateway opens the connections, so the EPP names an address it can reach: a backend URL's
host must be an IP address (a pod IP, a headless Service's address), not a name only the EPP
could resolve. The subset hint (``envoy.lb.subset_hint``) names endpoints the same way.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from router.origin import Origin
from router.pools import POOLS, Pool


class EndpointError(ValueError):
    """A backend URL the gateway could not be told to route to."""


def endpoint_of(url: str) -> str:
    """``http://10.0.0.5:8000`` -> ``10.0.0.5:8000`` (``[::1]:8000`` for IPv6)."""
    origin = Origin.parse(url)
    try:
        address = ipaddress.ip_address(origin.host)
    except ValueError:
        raise EndpointError(
            f"{url}: the gateway routes to ip:port, so a backend's host must be an IP address"
        ) from None
    if origin.base_path:
        raise EndpointError(f"{url}: a path prefix cannot be routed to through the gateway")
    host = f"[{address}]" if address.version == 6 else str(address)
    return f"{host}:{origin.port}"


class Endpoints:
    """Backend URL <-> endpoint, over the pools as they are now.

    It reads the pools' lists when asked (the same lists the ``Decider`` reads), so a backend
    added to a pool is routable as soon as the Decider can pick it; each URL's endpoint is
    worked out once."""

    def __init__(self, pools: Mapping[Pool, list[str]]) -> None:
        self.pools = pools
        self._of_url: dict[str, str] = {}
        self._of_endpoint: dict[str, str] = {}
        self.check()

    def urls(self) -> list[str]:
        return [url for pool in POOLS for url in self.pools[pool]]

    def check(self) -> None:
        """Raise ``EndpointError`` for a backend the gateway could not be told to route to."""
        seen: dict[str, str] = {}
        for url in self.urls():
            endpoint = self.endpoint(url)
            if seen.setdefault(endpoint, url) != url:
                raise EndpointError(f"{seen[endpoint]} and {url} name the same ip:port")

    def endpoint(self, url: str) -> str:
        found = self._of_url.get(url)
        if found is None:
            found = self._of_url[url] = endpoint_of(url)
            self._of_endpoint[found] = url
        return found

    def backend(self, endpoint: str) -> str | None:
        """The backend URL at ``endpoint`` (None: not one of ours)."""
        return self._of_endpoint.get(endpoint)

    def all(self) -> dict[str, str]:
        return {url: self.endpoint(url) for url in self.urls()}

    def excluded(self, subset: frozenset[str] | None) -> frozenset[str]:
        """The backend URLs a request with this subset hint may not go to (none without one)."""
        if subset is None:
            return frozenset()
        return frozenset(url for url in self.urls() if self.endpoint(url) not in subset)
