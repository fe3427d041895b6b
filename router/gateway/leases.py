"""The requests the EPP routed whose end Envoy has not reported yet, by request id.

Envoy keeps the client's ``x-request-id`` (or makes one) and logs the same id in its access-log
record, so the id is the key from a decision to its end. Ids are the client's to choose, so two
requests may share one: each id keeps its requests in the order they were routed, and a record
ends the oldest. A record that never comes (its access-log stream broke, or it went to another
EPP replica) is bounded by ``expired``: a lease older than the longest a request may take is
let go, and counted. So are the requests still on a backend whose drain timed out
(``on_backend``): the gateway carries them, the EPP stops counting them; and those a gateway
connection that went away had asked for (``from_source``): their records will not come.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from router.account.inflight import Lease
from router.account.outcome import Outcome


@dataclass(slots=True)
class Held:
    """One routed request: its lease on the counts, its record, when it was routed, and the
    gateway connection that asked (its gRPC peer; "" if unknown)."""

    lease: Lease
    out: Outcome
    since: float
    source: str = ""


class LeaseBook:
    def __init__(self) -> None:
        self._by_id: dict[str, deque[Held]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Held]:
        for held in self._by_id.values():
            yield from held

    def open(self, request_id: str, held: Held) -> None:
        self._by_id.setdefault(request_id, deque()).append(held)
        self._size += 1

    def close(self, request_id: str) -> Held | None:
        """The oldest request routed under ``request_id``, taken out; None if none is held."""
        queue = self._by_id.get(request_id)
        if not queue:
            return None
        held = queue.popleft()
        if not queue:
            del self._by_id[request_id]
        self._size -= 1
        return held

    def on_backend(self, backend: str) -> list[Held]:
        """Take out every request held on ``backend``."""
        return self._take(lambda held: held.lease.backend == backend)

    def from_source(self, source: str) -> list[Held]:
        """Take out every request the gateway connection ``source`` asked for."""
        return self._take(lambda held: held.source == source)

    def _take(self, match: Callable[[Held], bool]) -> list[Held]:
        gone: list[Held] = []
        for request_id in list(self._by_id):
            queue = self._by_id[request_id]
            kept = deque(held for held in queue if not match(held))
            if len(kept) == len(queue):
                continue
            gone += [held for held in queue if match(held)]
            if kept:
                self._by_id[request_id] = kept
            else:
                del self._by_id[request_id]
        self._size -= len(gone)
        return gone

    def expired(self, before: float) -> list[Held]:
        """Take out every request routed before ``before``."""
        gone: list[Held] = []
        for request_id in list(self._by_id):
            queue = self._by_id[request_id]
            while queue and queue[0].since < before:
                gone.append(queue.popleft())
            if not queue:
                del self._by_id[request_id]
        self._size -= len(gone)
        return gone
