"""A small authoritative DNS server for tests: A records the test changes while it runs.

The fleet's zone (``router.tools.fleet.zone``: real UDP on a loopback address, a known name
answers its A records, NODATA when it has none and for AAAA, an unknown name NXDOMAIN), plus
what tests need of a failing server: ``fail`` makes it answer SERVFAIL, ``drop`` makes it
answer nothing (the resolver times out); ``queries`` counts what it was asked.
"""

from __future__ import annotations

from typing import Literal

import dns.flags
import dns.message
import dns.rcode

from router.tools.fleet.zone import Zone

Mode = Literal["answer", "fail", "drop"]


class DnsServer(Zone):
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.mode: Mode = "answer"
        self.queries = 0
        super().__init__(host)

    def delete(self, name: str) -> None:
        """``name`` answers NXDOMAIN from now on."""
        with self._lock:
            self._records.pop(name.rstrip(".").lower(), None)

    def _respond(self, query: dns.message.Message) -> dns.message.Message | None:
        self.queries += 1
        if self.mode == "drop":
            return None
        if self.mode == "fail":
            reply = dns.message.make_response(query)
            reply.flags |= dns.flags.AA
            reply.set_rcode(dns.rcode.SERVFAIL)
            return reply
        return self._answer(query)
