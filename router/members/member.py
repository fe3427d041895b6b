"""A pool's member backend, as a plain value, and how two sets of members differ. Pure.

A member is one backend URL in one pool. It is ``active`` (routable, subject to its health) or
``draining`` (it left: no new request goes there, the ones in flight run to their end or to
the drain deadline, then it is removed). Each join gets a new ``incarnation``: an address that
left and was removed comes back as a new member that starts fresh (new health state, counts,
connections), while one that comes back *before* its drain ended is reinstated as it was
(nothing of it was released yet).

``diff`` is how a process moves its components from one set to the next (``roster``): what
joined, what started draining, what was reinstated, what was removed. A URL whose incarnation
changed between two looks left and came back: it is removed and joined.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final, Literal

from router.pools import Pool

MemberState = Literal["active", "draining"]
ACTIVE: Final = "active"
DRAINING: Final = "draining"
# Where a member came from: the configured URLs, the admin API, or a DNS name's answer.
Source = Literal["static", "admin", "dns"]
SOURCES: Final[tuple[Source, ...]] = ("static", "admin", "dns")


@dataclass(frozen=True, slots=True)
class Member:
    pool: Pool
    url: str
    source: Source
    name: str | None  # the DNS name it was discovered from (else None)
    incarnation: int  # new for every join
    joined: float  # monotonic seconds
    state: MemberState = ACTIVE
    drain_since: float | None = None
    drain_deadline: float | None = None  # when its streams still running are cut

    @property
    def active(self) -> bool:
        return self.state == ACTIVE

    def draining(self, now: float, deadline: float) -> Member:
        return replace(self, state=DRAINING, drain_since=now, drain_deadline=deadline)

    def reinstated(self) -> Member:
        return replace(self, state=ACTIVE, drain_since=None, drain_deadline=None)


@dataclass(frozen=True, slots=True)
class Changes:
    """What changed between two sets of members (``diff``)."""

    generation: int
    joined: tuple[Member, ...] = ()  # new: start fresh, then routable
    draining: tuple[Member, ...] = ()  # active -> draining: no new request
    reinstated: tuple[Member, ...] = ()  # draining -> active again
    removed: tuple[Member, ...] = ()  # gone: release everything it held

    def __bool__(self) -> bool:
        return bool(self.joined or self.draining or self.reinstated or self.removed)


def diff(before: Mapping[str, Member], after: Iterable[Member], generation: int = 0) -> Changes:
    """How ``after`` differs from ``before`` (URL -> member), in that order of application."""
    joined: list[Member] = []
    draining: list[Member] = []
    reinstated: list[Member] = []
    removed: list[Member] = []
    seen: set[str] = set()
    for new in after:
        seen.add(new.url)
        old = before.get(new.url)
        if old is None:
            joined.append(new)
        elif old.incarnation != new.incarnation or old.pool != new.pool:
            removed.append(old)  # it left and came back between two looks: fresh
            joined.append(new)
        elif old.active and not new.active:
            draining.append(new)
        elif not old.active and new.active:
            reinstated.append(new)
    removed += [old for url, old in before.items() if url not in seen]
    return Changes(generation, tuple(joined), tuple(draining), tuple(reinstated), tuple(removed))
