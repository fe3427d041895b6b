"""The owner of the set of members: what every writer (discovery, the admin API, the end of a
drain) changes, and what every process's roster reads.

``Store`` is the interface; ``LocalStore`` keeps the set in this process. Under ``serve
--workers N`` the set lives in the shared table instead (``router.account.shared.SharedStore``),
so that every worker routes over the same members. Each change moves the ``generation`` on:
a reader that sees a new generation reads the set again (``router.members.roster``).

The rules every store keeps: a URL is a member of one pool at a time; joining a URL that is
draining from the same pool reinstates it; joining one that is in (or still draining from) the
other pool is refused until it is gone from there; at most ``capacity`` members (draining ones
included).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from router.members.member import Member, Source
from router.pools import Pool


class MembershipError(Exception):
    """A change the rules refuse; ``status`` is the HTTP status the admin API answers with."""

    status = 409
    code = "conflict"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class AlreadyMember(MembershipError):
    code = "backend_exists"


class InOtherPool(MembershipError):
    code = "backend_in_other_pool"


class Full(MembershipError):
    code = "too_many_backends"


class NotMember(MembershipError):
    status = 404
    code = "backend_not_found"


def refuse_join(current: Member, pool: Pool) -> MembershipError | None:
    """Why ``current`` keeps its URL from joining ``pool`` (None: it may, reinstated)."""
    if current.pool != pool:
        how = "is draining from" if not current.active else "is in"
        return InOtherPool(
            f"{current.url} {how} the {current.pool} pool: a backend is in one pool at a time"
            + (" (it can join once its drain ends)" if not current.active else "")
        )
    if current.active:
        return AlreadyMember(f"{current.url} is already in the {pool} pool")
    return None


class Store(Protocol):
    @property
    def capacity(self) -> int: ...

    @property
    def generation(self) -> int: ...

    def read(self) -> tuple[int, tuple[Member, ...]]:
        """The generation and the members, in the order they joined."""
        ...

    def join(self, pool: Pool, url: str, source: Source, name: str | None, now: float) -> Member:
        """Add ``url`` to ``pool`` (or reinstate it there); raises ``MembershipError``."""
        ...

    def drain(self, url: str, now: float, deadline: float) -> Member:
        """Stop sending ``url`` new requests; raises ``NotMember``. Draining twice keeps the
        first deadline."""
        ...

    def remove(self, url: str) -> None:
        """Forget ``url`` (a drained member); nothing when it is not a member."""
        ...

    def applied(self, generation: int) -> None:
        """This process has applied ``generation`` (the shared table waits for every worker
        to have let go of a removed member's counts before it gives its place to another)."""
        ...


class LocalStore:
    """The set of members of one router process."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._members: dict[str, Member] = {}
        self._generation = 0
        self._incarnations = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def generation(self) -> int:
        return self._generation

    def read(self) -> tuple[int, tuple[Member, ...]]:
        return self._generation, tuple(self._members.values())

    def join(self, pool: Pool, url: str, source: Source, name: str | None, now: float) -> Member:
        current = self._members.get(url)
        if current is not None:
            refused = refuse_join(current, pool)
            if refused is not None:
                raise refused
            # (the one that brought it back owns it now)
            member = replace(current.reinstated(), source=source, name=name)
        else:
            if len(self._members) >= self._capacity:
                raise Full(
                    f"the router holds at most {self._capacity} backends "
                    "(SPEC_ROUTER_MAX_BACKENDS), draining ones included"
                )
            self._incarnations += 1
            member = Member(pool, url, source, name, self._incarnations, now)
        self._members[url] = member
        self._generation += 1
        return member

    def drain(self, url: str, now: float, deadline: float) -> Member:
        current = self._members.get(url)
        if current is None:
            raise NotMember(f"{url} is not a backend of either pool")
        if not current.active:
            return current
        member = self._members[url] = current.draining(now, deadline)
        self._generation += 1
        return member

    def remove(self, url: str) -> None:
        if self._members.pop(url, None) is not None:
            self._generation += 1

    def applied(self, generation: int) -> None:
        pass  # one process: nobody else to wait for
