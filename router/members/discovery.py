"""DNS discovery: each watched name resolved every interval, its answer turned into members.

One round resolves every watched name at once, folds each answer into the name's state
(``router.members.grace``: a failure keeps the last good set, an empty answer empties it only
after the grace period), then makes the store's DNS members of that name match the addresses
in force: a new address joins (``starting`` in the health poller: no traffic until healthy), a
missing one drains, one that came back while draining is reinstated. A join the store refuses
(the address is still draining from the other pool, as an engine restarted in the other mode
is until its old streams end) is tried again next round. Each change of a name's state is
logged once.

Under ``--workers`` only the leader runs this; the others follow the store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from router.members.dns import Resolver
from router.members.grace import Answer, NameState, fold
from router.members.member import Member
from router.members.store import MembershipError, Store
from router.members.targets import Watch

log = logging.getLogger("spec_router.discovery")

# (watch, its state after the round, the answer) -> None: the metrics' view of a round
Observer = Callable[[Watch, NameState, Answer], None]


class Discovery:
    def __init__(
        self,
        watches: list[Watch],
        store: Store,
        sync: Callable[[], object],
        resolver: Resolver,
        interval: float,
        grace: float,
        drain_timeout: float,
        clock: Callable[[], float] = time.monotonic,
        observe: Observer | None = None,
    ) -> None:
        self.watches = watches
        self.store = store
        self.sync = sync
        self.resolver = resolver
        self.interval = interval
        self.grace = grace
        self.drain_timeout = drain_timeout
        self.clock = clock
        self.observe = observe
        self.names: dict[Watch, NameState] = {w: NameState() for w in watches}
        self._refused: dict[str, str] = {}  # url -> why its join was refused (logged once)

    async def round(self) -> None:
        """Resolve every name once and apply the answers."""
        answers = await asyncio.gather(*(self.resolver.resolve(w.name) for w in self.watches))
        now = self.clock()
        for watch, answer in zip(self.watches, answers, strict=True):
            state, events = fold(self.names[watch], answer, now, self.grace)
            self.names[watch] = state
            for event in events:
                _log_event(watch, state, event, self.grace)
            self._apply(watch, state.addresses, now)
            if self.observe is not None:
                self.observe(watch, state, answer)
        self.sync()

    def _apply(self, watch: Watch, addresses: tuple[str, ...], now: float) -> None:
        want = [watch.member_url(a) for a in addresses]
        _, members = self.store.read()
        by_url = {m.url: m for m in members}
        for m in members:
            if _from(m, watch) and m.active and m.url not in want:
                self.store.drain(m.url, now, now + self.drain_timeout)
                log.info("%s left %s (%s pool): draining", m.url, watch.name, watch.pool)
        for url in want:
            current = by_url.get(url)
            if current is not None and current.pool == watch.pool and current.active:
                self._refused.pop(url, None)
                continue
            try:
                member = self.store.join(watch.pool, url, "dns", watch.name, now)
            except MembershipError as exc:
                if self._refused.get(url) != exc.message:
                    log.warning("%s from %s not added yet: %s", url, watch.name, exc.message)
                self._refused[url] = exc.message
                continue
            self._refused.pop(url, None)
            how = "came back" if current is not None else "joined"
            log.info("%s %s the %s pool (from %s)", member.url, how, watch.pool, watch.name)

    def status(self) -> list[dict[str, Any]]:
        """Each watched name's state, for /router/status."""
        now = self.clock()
        rows = []
        for watch, s in self.names.items():
            rows.append(
                {
                    "pool": watch.pool,
                    "url": watch.url,
                    "name": watch.name,
                    "addresses": list(s.addresses),
                    "state": _state(s),
                    "resolutions": s.resolutions,
                    "last_answer_age_s": None
                    if s.last_answer is None
                    else round(now - s.last_answer, 3),
                    "ttl_s": s.ttl,
                    "error": s.error,
                    "failing_for_s": None
                    if s.failing_since is None
                    else round(now - s.failing_since, 3),
                    "empty_answer": s.empty_reason,
                    "empty_for_s": None if s.empty_since is None else round(now - s.empty_since, 3),
                    "grace_left_s": None
                    if (left := s.grace_left(now, self.grace)) is None
                    else round(left, 3),
                    "refused": {
                        url: why
                        for url, why in self._refused.items()
                        if url in {watch.member_url(a) for a in s.addresses}
                    },
                }
            )
        return rows


def _from(member: Member, watch: Watch) -> bool:
    return member.source == "dns" and member.pool == watch.pool and member.name == watch.name


def _state(s: NameState) -> str:
    """One word for a name's state: resolved, failing (last good set kept), emptying (grace
    running), empty (answered with no address), unresolved (no answer yet)."""
    if s.failing_since is not None:
        return "failing"
    if s.empty_since is not None:
        return "emptying" if s.addresses else "empty"
    return "resolved" if s.answered else "unresolved"


def _log_event(watch: Watch, s: NameState, event: str, grace: float) -> None:
    where = f"{watch.name} ({watch.pool} pool)"
    if event == "failing":
        kept = f"keeping the last {len(s.addresses)} address(es)" if s.addresses else "no address"
        log.warning("cannot resolve %s: %s; %s until it answers", where, s.error, kept)
    elif event == "recovered":
        log.info("%s answers again", where)
    elif event == "resolved":
        log.info("%s resolves to %s", where, ", ".join(s.addresses))
    elif event == "changed":
        log.info("%s now resolves to %s", where, ", ".join(s.addresses) or "nothing")
    elif event == "emptying":
        log.warning(
            "%s answered %s: keeping its %d address(es) for %gs (SPEC_ROUTER_DISCOVERY_GRACE)",
            where,
            s.empty_reason,
            len(s.addresses),
            grace,
        )
    elif event == "emptied":
        log.warning("%s has answered %s for %gs: the pool loses it", where, s.empty_reason, grace)
    elif event == "absent":
        log.warning(
            "%s answers %s: no backend from it until it resolves (a headless Service with no "
            "ready pod answers so while its engines load; a misspelt name does too)",
            where,
            s.empty_reason,
        )
