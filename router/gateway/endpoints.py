"""The pools' backends as the endpoints Envoy routes to: ``ip:port``, both ways.

The gateway opens the connections, so the EPP names an address it can reach: a backend URL's
host must be an IP address (a pod IP, a headless Service's address), not a name only the EPP
could resolve. The subset hint (``envoy.lb.subset_hint``) names endpoints the same way.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from router.origin import Origin


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


@dataclass(frozen=True)
class Endpoints:
    """Backend URL <-> endpoint, for every backend of both pools."""

    of_url: Mapping[str, str]
    of_endpoint: Mapping[str, str]

    @classmethod
    def of(cls, urls: Iterable[str]) -> Endpoints:
        of_url = {url: endpoint_of(url) for url in urls}
        of_endpoint = {endpoint: url for url, endpoint in of_url.items()}
        if len(of_endpoint) != len(of_url):
            raise EndpointError("two backend URLs name the same ip:port")
        return cls(of_url, of_endpoint)

    def excluded(self, subset: frozenset[str] | None) -> frozenset[str]:
        """The backend URLs a request with this subset hint may not go to (none without one)."""
        if subset is None:
            return frozenset()
        return frozenset(url for url, endpoint in self.of_url.items() if endpoint not in subset)
