"""Resolving a pool's DNS name into addresses: one ``Answer`` per name and round.

Two resolvers, as nginx has them: with ``SPEC_ROUTER_DNS_SERVERS`` (``host:port,...``, like
nginx's ``resolver``) only those servers are asked, through dnspython (A and AAAA queries, no
cache, no search domains: give fully qualified names, as nginx needs); without it, the system
resolver (``getaddrinfo``), so a name resolves exactly as for every other program in the pod:
``/etc/hosts``, ``resolv.conf``'s search domains and ``ndots`` (Kubernetes' short Service
names), nsswitch. Both tell an empty answer (NXDOMAIN, or NODATA) from a failure (timeout,
SERVFAIL, no server reachable): ``router.members.grace`` treats them differently. getaddrinfo
gives no TTL: the answer's TTL is shown only from dnspython; either way the name is asked again
every ``SPEC_ROUTER_DISCOVERY_INTERVAL``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from typing import Protocol

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.rdatatype
import dns.resolver

from router.members.grace import Answer, Empty, Failed, Resolved

# getaddrinfo's "this name has no address": NXDOMAIN, or NODATA (glibc's EAI_NODATA)
_ABSENT = {socket.EAI_NONAME} | {getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


class Resolver(Protocol):
    async def resolve(self, name: str) -> Answer: ...


def ordered(addresses: Iterable[str]) -> tuple[str, ...]:
    """Each address once, IPv4 first, in numeric order (so a set compares and shows stably)."""
    ips = {ipaddress.ip_address(a) for a in addresses}
    return tuple(str(ip) for ip in sorted(ips, key=lambda ip: (ip.version, int(ip))))


class SystemResolver:
    """``getaddrinfo`` in the loop's executor, within ``lifetime`` seconds."""

    def __init__(self, lifetime: float) -> None:
        self.lifetime = lifetime

    async def resolve(self, name: str) -> Answer:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.lifetime):
                infos = await loop.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except TimeoutError:
            return Failed(f"{name}: the system resolver did not answer within {self.lifetime:g}s")
        except socket.gaierror as exc:
            if exc.errno in _ABSENT:
                return Empty("NXDOMAIN" if exc.errno == socket.EAI_NONAME else "NODATA")
            return Failed(f"{name}: {exc.strerror or exc}")
        except OSError as exc:
            return Failed(f"{name}: {exc}")
        # (an IPv6 link-local address carries its scope: %eth0 is not part of a URL's host)
        found = ordered(str(info[4][0]).split("%", 1)[0] for info in infos)
        return Resolved(found) if found else Empty("NODATA")


class ServerResolver:
    """A and AAAA queries to the given servers only (dnspython), within ``lifetime``."""

    def __init__(self, servers: list[tuple[str, int]], lifetime: float) -> None:
        self.servers = servers
        self.lifetime = lifetime
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [dns.nameserver.Do53Nameserver(h, p) for h, p in servers]
        resolver.cache = None
        resolver.lifetime = lifetime
        resolver.timeout = lifetime
        self._resolver = resolver

    async def resolve(self, name: str) -> Answer:
        qname = name if name.endswith(".") else name + "."
        answers = await asyncio.gather(
            self._query(qname, dns.rdatatype.A), self._query(qname, dns.rdatatype.AAAA)
        )
        addresses: list[str] = []
        ttls: list[int] = []
        for answer in answers:
            if isinstance(answer, Failed | Empty) and not (
                isinstance(answer, Empty) and answer.reason == "NODATA"
            ):
                return answer  # NXDOMAIN, or a failure: the name's answer as a whole
            if isinstance(answer, Resolved):
                addresses += answer.addresses
                if answer.ttl is not None:
                    ttls.append(answer.ttl)
        if not addresses:
            return Empty("NODATA")
        return Resolved(ordered(addresses), min(ttls) if ttls else None)

    async def _query(self, qname: str, rdtype: dns.rdatatype.RdataType) -> Answer:
        kind = dns.rdatatype.to_text(rdtype)
        servers = ",".join(f"{h}:{p}" for h, p in self.servers)
        try:
            answer = await self._resolver.resolve(
                qname, rdtype, raise_on_no_answer=False, search=False
            )
        except dns.resolver.NXDOMAIN:
            return Empty("NXDOMAIN")
        except dns.resolver.LifetimeTimeout:
            return Failed(f"{qname} {kind}: no answer from {servers} within {self.lifetime:g}s")
        except dns.resolver.NoNameservers as exc:  # SERVFAIL, REFUSED, or every server failed
            return Failed(f"{qname} {kind}: {exc}")
        except dns.exception.DNSException as exc:
            return Failed(f"{qname} {kind}: {type(exc).__name__}: {exc}")
        rrset = answer.rrset
        if rrset is None:
            return Empty("NODATA")
        return Resolved(tuple(str(rr.address) for rr in rrset), int(rrset.ttl))


def resolver_for(servers: list[tuple[str, int]], interval: float) -> Resolver:
    """The servers' resolver, else the system's; a resolution lasts at most ``interval``
    (bounded to 1..5 s), so a round never outlives the next."""
    lifetime = min(max(interval, 1.0), 5.0)
    return ServerResolver(servers, lifetime) if servers else SystemResolver(lifetime)
