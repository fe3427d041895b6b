"""A small authoritative DNS server for tests: A records the test changes while it runs.

Real UDP on a loopback address (``127.0.0.x:ephemeral``), answered from a thread with
dnspython's message parsing: a known name answers its A records (NODATA when it has none, and
for AAAA), an unknown name NXDOMAIN. ``fail`` makes it answer SERVFAIL, ``drop`` makes it
answer nothing (the resolver times out).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable
from typing import Literal

import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

Mode = Literal["answer", "fail", "drop"]
TTL = 1


class DnsServer:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((host, 0))
        self._sock.settimeout(0.1)
        self.host, self.port = self._sock.getsockname()
        self._lock = threading.Lock()
        self._zone: dict[str, list[str]] = {}
        self.mode: Mode = "answer"
        self.queries = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        """As SPEC_ROUTER_DNS_SERVERS takes it."""
        return f"{self.host}:{self.port}"

    def set(self, name: str, addresses: Iterable[str]) -> None:
        """``name`` answers these A records from now on (none: NODATA)."""
        with self._lock:
            self._zone[name.rstrip(".").lower()] = list(addresses)

    def delete(self, name: str) -> None:
        """``name`` answers NXDOMAIN from now on."""
        with self._lock:
            self._zone.pop(name.rstrip(".").lower(), None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def __enter__(self) -> DnsServer:
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
            except Exception:
                continue
            self.queries += 1
            if self.mode == "drop":
                continue
            reply = self._answer(query)
            try:
                self._sock.sendto(reply.to_wire(), peer)
            except OSError:
                return

    def _answer(self, query: dns.message.Message) -> dns.message.Message:
        reply = dns.message.make_response(query)
        reply.flags |= dns.flags.AA
        if self.mode == "fail":
            reply.set_rcode(dns.rcode.SERVFAIL)
            return reply
        (question,) = query.question
        name = question.name.to_text().rstrip(".").lower()
        with self._lock:
            addresses = self._zone.get(name)
        if addresses is None:
            reply.set_rcode(dns.rcode.NXDOMAIN)
        elif question.rdtype == dns.rdatatype.A and addresses:
            reply.answer.append(
                dns.rrset.from_text_list(question.name, TTL, dns.rdataclass.IN, "A", addresses)
            )
        return reply
