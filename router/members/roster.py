"""One process's applied view of the members, and the "membership changed" notification.

``Roster.sync()`` reads the store when its generation moved, works out what changed
(``member.diff``) and tells every listener, in the order they subscribed, before the new set
is routable: the components that keep per-backend state (the in-flight tracker, health, the
poller, the upstream clients, the metrics, the decider) add a joining backend's state first and
release a removed one's. Then ``pools`` -- the routable (active) URLs of each pool, in the
order they joined, the lists the decider reads -- is updated in place.

A reader that needs only to know *whether* the set changed checks ``generation``; one that
precomputes per-backend data subscribes. Nothing here does I/O: the writers (discovery, the
admin API, the end of a drain) change the store and call ``sync``; under ``--workers`` the
other workers call ``sync`` before each routing decision and on a timer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from router.members.member import Changes, Member, diff
from router.members.store import Store
from router.pools import POOLS, Pool

log = logging.getLogger("spec_router.members")

Listener = Callable[[Changes], None]


class Roster:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.members: dict[str, Member] = {}
        self.generation = -1
        # the routable URLs of each pool (mutated in place: readers keep these lists)
        self.pools: dict[Pool, list[str]] = {pool: [] for pool in POOLS}
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def sync(self) -> Changes | None:
        """Apply the store's set if it changed since the last look; what changed."""
        if self.store.generation == self.generation:
            return None
        generation, members = self.store.read()
        changes = diff(self.members, members, generation)
        self.members = {m.url: m for m in members}
        self.generation = generation
        if changes:
            for listener in self._listeners:
                try:
                    listener(changes)
                except Exception:  # one component's failure must not leave the others behind
                    log.exception("applying a membership change failed")
        for pool in POOLS:
            self.pools[pool][:] = [m.url for m in members if m.pool == pool and m.active]
        self.store.applied(generation)
        return changes

    def of_pool(self, pool: Pool) -> list[Member]:
        """The pool's members, active and draining, in the order they joined."""
        return [m for m in self.members.values() if m.pool == pool]

    def get(self, url: str) -> Member | None:
        return self.members.get(url)


def drained(
    members: Iterable[Member], in_flight: Mapping[str, int], now: float, settle: float = 0.0
) -> list[str]:
    """The draining members with nothing left in flight, draining for at least ``settle``
    seconds: to be removed."""
    return [
        m.url
        for m in members
        if not m.active
        and in_flight.get(m.url, 0) == 0
        and m.drain_since is not None
        and now - m.drain_since >= settle
    ]


def overdue(members: Iterable[Member], now: float) -> list[Member]:
    """The draining members whose drain deadline has passed: their streams are cut."""
    return [
        m
        for m in members
        if not m.active and m.drain_deadline is not None and now >= m.drain_deadline
    ]
