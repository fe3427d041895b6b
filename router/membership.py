"""What a change of the members does to this router process, and the changes it makes itself.

``Membership`` is the roster's first listener (``router.members.roster``): a backend that
joins gets its in-flight counts, a ``starting`` health state (no traffic until a probe finds it
healthy), a poller loop (which also reads the engine's mode), its metric series and, once the
router serves, its upstream client; one that starts draining gets no new request (the roster
took it out of the routable lists) and its idle connections closed; one that is removed lets
go of all of that. The decider is told of joins and removals.

It also makes the changes that are not discovery's (``router.members.discovery``): the admin
API's joins and leaves, and the drain's end (``tick``): the streams of a member whose drain
deadline passed are cut (``OriginPool.cut``: they end as on an upstream failure), and a
draining member with nothing left in flight is removed. Under ``--workers`` every worker cuts
its own streams, and only the leader removes members and discovers; the others follow the
store (``sync``: before each routing decision, and on the tick).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from router.account.inflight import InflightTracker
from router.account.metrics import RouterMetrics
from router.forward.decider import Decider
from router.health.mode import mode_mismatch
from router.health.poller import HealthPoller
from router.health.state import HealthRegistry
from router.members.discovery import Discovery
from router.members.member import Changes, Member
from router.members.roster import Roster, drained, overdue
from router.members.store import MembershipError, NotMember, Store
from router.origin import Origin
from router.pools import Pool
from router.settings import MAX_URL_BYTES, Settings, refuse_api_path
from router.upstream.client import OriginPool

log = logging.getLogger("spec_router.members")

# Seconds between two looks at the draining members (and, under --workers, at the set).
TICK = 0.1
# A draining member is removed once nothing has been in flight there for this long: under
# --workers, a worker that routed just before it saw the drain has counted its request by then.
SETTLE = 2 * TICK


class NotOwned(MembershipError):
    code = "backend_discovered"


class Membership:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        roster: Roster,
        tracker: InflightTracker,
        health: HealthRegistry,
        poller: HealthPoller,
        metrics: RouterMetrics,
        decider: Decider,
        clients: dict[str, OriginPool],
        clock: Callable[[], float] = time.monotonic,
        owner: bool = True,
        discovery: Discovery | None = None,
        shared_status: Path | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.roster = roster
        self.tracker = tracker
        self.health = health
        self.poller = poller
        self.metrics = metrics
        self.decider = decider
        self.clients = clients
        self.clock = clock
        self.owner = owner  # removes drained members (the process, or the leader)
        self.discovery = discovery
        # under --workers: where the leader leaves its discovery status for the others
        self.shared_status = shared_status
        # made once the router serves (router.lifecycle); until then no client is opened
        self.open_client: Callable[[str], OriginPool] | None = None
        # (url, why) -> how many requests still running there were ended, at a drain's
        # deadline: the proxy's upstream client cuts its exchanges; the EPP, which carries no
        # bytes, lets go of its leases there (router.gateway.app)
        self.cut_streams: Callable[[str, str], int] = self._cut_client
        self._cut: set[tuple[str, int]] = set()  # (url, incarnation) whose streams were cut
        # runs the finished requests' accounting still queued (router.forward.ended) before a
        # backend is let go of: its outcomes read its in-flight entry and count on its metric
        # series, both removed with it (RouterApp sets it to its own ``settle``)
        self.settle: Callable[[], None] = lambda: None
        roster.subscribe(self.applied)

    # -- the listener -----------------------------------------------------------------------
    def applied(self, changes: Changes) -> None:
        now = self.clock()
        if changes.removed:
            self.settle()
        for m in changes.removed:
            self._release(m)
        for m in changes.joined:
            self.tracker.add(m.pool, m.url)
            self.health.add(m.url, now)
            self.metrics.add_backend(m.pool, m.url)
            self.poller.add(m.url, m.pool, self.settings.pool_authorization(m.pool))
            if self.open_client is not None:
                self.clients[m.url] = self.open_client(m.url)
        self.decider.members_changed(
            [m.url for m in changes.joined], [m.url for m in changes.removed]
        )
        for m in changes.draining:
            client = self.clients.get(m.url)
            if client is not None:
                client.close_idle()

    def _release(self, m: Member) -> None:
        self.poller.remove(m.url)
        client = self.clients.pop(m.url, None)
        if client is not None:
            client.close()
        self.health.remove(m.url)
        self.metrics.remove_backend(m.pool, m.url)
        self.tracker.remove(m.url)
        self._cut = {cut for cut in self._cut if cut[0] != m.url}

    # -- the operator (admin API) ------------------------------------------------------------
    def join(self, pool: Pool, url: str) -> Member:
        """Add ``url`` to ``pool`` (``POST /router/pools/{pool}/backends``)."""
        url = checked_url(url)
        member = self.store.join(pool, url, "admin", None, self.clock())
        self.roster.sync()
        log.info("%s joined the %s pool (admin API)", member.url, pool)
        return member

    def leave(self, pool: Pool, url: str) -> Member:
        """Drain ``url`` out of ``pool`` (``DELETE /router/pools/{pool}/backends``)."""
        self.roster.sync()
        current = self.roster.get(url.rstrip("/"))
        if current is None or current.pool != pool:
            raise NotMember(f"{url} is not a backend of the {pool} pool")
        if current.source == "dns":
            raise NotOwned(
                f"{current.url} comes from the DNS name {current.name}: it leaves when the "
                "name stops answering with it"
            )
        now = self.clock()
        member = self.store.drain(current.url, now, now + self.settings.drain_timeout)
        self.roster.sync()
        if current.active:
            log.info(
                "%s leaves the %s pool (admin API): draining, for at most %gs",
                current.url,
                pool,
                self.settings.drain_timeout,
            )
        return member

    # -- the timer ---------------------------------------------------------------------------
    def tick(self) -> None:
        """Follow the store; cut what is overdue; remove what drained (the owner)."""
        self.roster.sync()
        now = self.clock()
        members = list(self.roster.members.values())
        for m in overdue(members, now):
            if (m.url, m.incarnation) in self._cut:
                continue
            self._cut.add((m.url, m.incarnation))
            n = self.cut_streams(m.url, "it left its pool and its drain timed out")
            if n:
                self.metrics.drain_cut(m.pool, n)
                log.warning(
                    "%s: drain timeout (%gs) passed: cut %d request(s) still running there",
                    m.url,
                    self.settings.drain_timeout,
                    n,
                )
        if not self.owner:
            return
        done = drained(members, self.tracker.by_backend, now, SETTLE)
        for url in done:
            self.store.remove(url)
            log.info("%s drained: removed", url)
        if done:
            self.roster.sync()

    def _cut_client(self, url: str, why: str) -> int:
        client = self.clients.get(url)
        return 0 if client is None else client.cut(why)

    async def discover(self) -> None:
        """One discovery round (the owner's), and its status left for the other workers."""
        if self.discovery is None:
            return
        await self.discovery.round()
        self._share_status()

    def _share_status(self) -> None:
        path = self.shared_status
        if path is None or self.discovery is None:
            return
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(self.discovery.status()))
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cannot share the discovery status: %s", exc)

    # -- views --------------------------------------------------------------------------------
    def names(self) -> list[dict[str, Any]]:
        """The watched names' discovery state (the leader's, under --workers)."""
        if self.discovery is not None:
            return self.discovery.status()
        if self.shared_status is not None:
            try:
                rows: list[dict[str, Any]] = json.loads(self.shared_status.read_text())
                return rows
            except (OSError, ValueError):
                return []
        return []

    def status(self) -> dict[str, Any]:
        return {
            "discovery": self.settings.discovery,
            "interval_s": self.settings.discovery_interval,
            "grace_s": self.settings.discovery_grace,
            "drain_timeout_s": self.settings.drain_timeout,
            "generation": self.roster.generation,
            "capacity": self.store.capacity,
            "members": len(self.roster.members),
            "names": self.names(),
        }

    def backend(self, url: str, now: float) -> dict[str, Any]:
        """The membership part of one backend's entry in /router/status."""
        m = self.roster.members[url]
        reading = self.poller.modes.get(url)
        return {
            "pool": m.pool,
            "source": m.source,
            "name": m.name,
            "membership": m.state,
            "member_for_s": round(now - m.joined, 3),
            "draining_for_s": None if m.drain_since is None else round(now - m.drain_since, 3),
            "drain_deadline_in_s": None
            if m.drain_deadline is None
            else round(m.drain_deadline - now, 3),
            "engine_mode": None
            if reading is None
            else {
                "mode": reading.mode,
                "evidence": reading.evidence,
                "mismatch": mode_mismatch(m.pool, reading),
            },
        }


def member_document(m: Member, now: float, in_flight: Mapping[str, int]) -> dict[str, Any]:
    """A member as the admin API answers with it."""
    return {
        "pool": m.pool,
        "url": m.url,
        "source": m.source,
        "name": m.name,
        "membership": m.state,
        "in_flight": in_flight.get(m.url, 0),
        "drain_deadline_in_s": None
        if m.drain_deadline is None
        else round(m.drain_deadline - now, 3),
    }


def checked_url(url: str) -> str:
    """A backend URL as the admin API takes it (raises ``ValueError`` naming what is wrong):
    as the settings take one, a path holding ``/v1`` is refused with the fix."""
    origin = Origin.parse(url)  # an http(s) URL with a host
    refuse_api_path(url, origin.base_path.decode())
    if len(origin.url.encode()) > MAX_URL_BYTES:
        raise ValueError(f"a backend URL is at most {MAX_URL_BYTES} bytes")
    return origin.url
