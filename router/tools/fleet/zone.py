"""The fleet's DNS: a small authoritative server whose A records the actuator changes.

It plays the headless Services of ``deploy/k8s`` (docs/kubernetes.md): one name per pool,
each answering the addresses of the engines that serve in that mode, which the router follows
with ``SPEC_ROUTER_DISCOVERY=dns`` (``router.members.discovery``). Moving an engine between
pools is moving its address between the names: the router drains it from one pool and joins it
to the other when it is back. Real UDP on loopback, answered from a thread with dnspython's
message parsing: a known name answers its A records (NODATA when it has none, and for AAAA),
any other name NXDOMAIN.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable
from typing import Self

import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

TTL = 1


class Zone:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((host, 0))
        self._sock.settimeout(0.1)
        self.host, self.port = self._sock.getsockname()
        self._lock = threading.Lock()
        self._records: dict[str, list[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="fleet-dns")
        self._thread.start()

    @property
    def address(self) -> str:
        """As SPEC_ROUTER_DNS_SERVERS takes it."""
        return f"{self.host}:{self.port}"

    def set(self, name: str, addresses: Iterable[str]) -> None:
        """``name`` answers these A records from now on (none: NODATA)."""
        with self._lock:
            self._records[name.rstrip(".").lower()] = sorted(addresses)

    def get(self, name: str) -> list[str]:
        with self._lock:
            return list(self._records.get(name.rstrip(".").lower(), ()))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self._sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                query = dns.message.from_wire(data)
            except Exception:  # not a query we can parse: no answer, as a real server
                continue
            reply = self._respond(query)
            if reply is None:
                continue
            try:
                self._sock.sendto(reply.to_wire(), peer)
            except OSError:
                return

    def _respond(self, query: dns.message.Message) -> dns.message.Message | None:
        """The reply to send (None: send nothing); a test's server fails here on demand."""
        return self._answer(query)

    def _answer(self, query: dns.message.Message) -> dns.message.Message:
        reply = dns.message.make_response(query)
        reply.flags |= dns.flags.AA
        (question,) = query.question
        name = question.name.to_text().rstrip(".").lower()
        with self._lock:
            addresses = self._records.get(name)
        if addresses is None:
            reply.set_rcode(dns.rcode.NXDOMAIN)
        elif question.rdtype == dns.rdatatype.A and addresses:
            reply.answer.append(
                dns.rrset.from_text_list(question.name, TTL, dns.rdataclass.IN, "A", addresses)
            )
        return reply
