"""The pools' members as the endpoints Envoy routes to: ``ip:port``, both ways, as they change.

The gateway opens the connections, so the EPP names an address it can reach: a member's host
must be an IP address (a pod IP, one of a headless Service's addresses), not a name only the
EPP could resolve. Under ``SPEC_ROUTER_DISCOVERY=dns`` a configured URL whose host is a name is
not a member but a set of them (``router.members``): every address it resolves to is one, at
the URL's port, so the names are fine there; under ``static`` they are refused at start-up
(``check_configured``). The subset hint (``envoy.lb.subset_hint``) names endpoints the same
way.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Mapping

from router.members.member import Changes
from router.members.store import MembershipError
from router.members.targets import configured
from router.origin import Origin
from router.pools import POOLS, Pool
from router.settings import DiscoveryMode

log = logging.getLogger("spec_router.gateway")


class EndpointError(ValueError):
    """A backend URL the gateway could not be told to route to."""


class EndpointTaken(MembershipError):
    """A backend that would join at the ``ip:port`` of another member (a 409)."""

    code = "endpoint_exists"


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


def check_configured(pools: Mapping[Pool, Iterable[str]], discovery: DiscoveryMode) -> None:
    """Raise ``EndpointError`` for a configured pool URL the gateway could not route to: a path
    prefix, two URLs at one ``ip:port``, or (under static discovery) a host that is a name."""
    members, watches = configured({pool: list(pools[pool]) for pool in POOLS}, discovery)
    seen: dict[str, str] = {}
    for _, url in members:
        try:
            endpoint = endpoint_of(url)
        except EndpointError as exc:
            if Origin.parse(url).base_path:
                raise
            raise EndpointError(
                f"{exc}: name the engine by its IP address, or set SPEC_ROUTER_DISCOVERY=dns "
                "to route to every address the name resolves to (a headless Service's pods)"
            ) from None
        if seen.setdefault(endpoint, url) != url:
            raise EndpointError(f"{seen[endpoint]} and {url} name the same ip:port")
    for watch in watches:
        if watch.origin.base_path:
            raise EndpointError(
                f"{watch.url}: a path prefix cannot be routed to through the gateway"
            )


class Endpoints:
    """Member URL <-> endpoint, following the members (a roster listener: ``applied``).

    Every member has its endpoint, draining ones included (their requests' access-log records
    still name it), until it is removed; ``urls`` are the routable ones (``pools``: the lists
    the ``Decider`` reads), the only ones a subset hint can allow."""

    def __init__(self, pools: Mapping[Pool, list[str]], members: Iterable[str] = ()) -> None:
        self.pools = pools
        self._of_url: dict[str, str] = {}
        self._of_endpoint: dict[str, str] = {}
        for url in members:
            self.add(url)

    def applied(self, changes: Changes) -> None:
        """A membership change (``router.members.roster``): the removed go, the joined come."""
        for m in changes.removed:
            self.remove(m.url)
        for m in changes.joined:
            try:
                self.add(m.url)
            except EndpointError as exc:  # (the EPP checks the URLs it lets join)
                log.error("%s cannot be routed to through the gateway: %s", m.url, exc)

    def add(self, url: str) -> str:
        """Name ``url``'s endpoint; ``EndpointError`` if the gateway could not route to it or
        another member already has it."""
        endpoint = endpoint_of(url)
        other = self._of_endpoint.get(endpoint)
        if other is not None and other != url:
            raise EndpointError(f"{other} and {url} name the same ip:port")
        self._of_url[url] = endpoint
        self._of_endpoint[endpoint] = url
        return endpoint

    def remove(self, url: str) -> None:
        endpoint = self._of_url.pop(url, None)
        if endpoint is not None and self._of_endpoint.get(endpoint) == url:
            del self._of_endpoint[endpoint]

    def check(self, url: str) -> None:
        """Whether ``url`` could join: ``EndpointError`` if the gateway could not route to it,
        ``EndpointTaken`` if another member is at its ``ip:port``."""
        endpoint = endpoint_of(url)
        other = self._of_endpoint.get(endpoint)
        if other is not None and other != url:
            raise EndpointTaken(f"{other} is at {endpoint} already: one backend per ip:port")

    def urls(self) -> list[str]:
        return [url for pool in POOLS for url in self.pools[pool]]

    def endpoint(self, url: str) -> str:
        found = self._of_url.get(url)
        return found if found is not None else endpoint_of(url)

    def backend(self, endpoint: str) -> str | None:
        """The member at ``endpoint`` (None: not one of ours)."""
        return self._of_endpoint.get(endpoint)

    def all(self) -> dict[str, str]:
        """Every member's endpoint, draining ones included."""
        return dict(self._of_url)

    def excluded(self, subset: frozenset[str] | None) -> frozenset[str]:
        """The routable URLs a request with this subset hint may not go to (none without one)."""
        if subset is None:
            return frozenset()
        return frozenset(url for url in self.urls() if self.endpoint(url) not in subset)
