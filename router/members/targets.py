"""Where the members come from, read from the configured pool URLs. Pure.

Under ``SPEC_ROUTER_DISCOVERY=static`` every configured URL is a member. Under ``dns`` the host
name of each URL is a set (``Watch``): every A/AAAA record of it is one member, at that URL's
scheme, port and path (``member_url``), as a headless Service lists its ready pods; a URL whose
host is already an address is a member as it stands.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from router.origin import Origin
from router.pools import POOLS, Pool
from router.settings import DiscoveryMode


@dataclass(frozen=True, slots=True)
class Watch:
    """One pool URL whose host name is resolved into members."""

    pool: Pool
    url: str  # as configured, e.g. http://sglang-eagle3.llm.svc.cluster.local:30000
    origin: Origin

    @property
    def name(self) -> str:
        return self.origin.host

    def member_url(self, address: str) -> str:
        return member_url(self.origin, address)


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def member_url(template: Origin, address: str) -> str:
    """The URL of the backend at ``address``: the template's scheme, port and path."""
    scheme = "https" if template.tls else "http"
    host = f"[{address}]" if ":" in address else address
    return f"{scheme}://{host}:{template.port}{template.base_path.decode()}"


def configured(
    pools: Mapping[Pool, list[str]], mode: DiscoveryMode
) -> tuple[list[tuple[Pool, str]], list[Watch]]:
    """The members the configuration names outright, and the names to resolve."""
    members: list[tuple[Pool, str]] = []
    watches: list[Watch] = []
    for pool in POOLS:
        for url in pools[pool]:
            origin = Origin.parse(url)
            if mode == "dns" and not is_address(origin.host):
                watches.append(Watch(pool, url, origin))
            else:
                members.append((pool, url))
    return members, watches
