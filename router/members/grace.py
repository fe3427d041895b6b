"""What one DNS name's answers do to the set of addresses in force. Pure.

- An answer with addresses is the new set at once (a set that shrinks shrinks at once: those
  addresses drain).
- A failed resolution (a timeout, SERVFAIL, no server reachable) changes nothing: the last good
  set stays in force for as long as the failure lasts, and the name is shown as failing.
- An empty answer (NXDOMAIN, or NODATA: the name exists with no A/AAAA record) empties the set
  only once empty answers have lasted ``grace`` seconds (``SPEC_ROUTER_DISCOVERY_GRACE``), so a
  moment's bad answer does not drain a whole pool. A name that never had an address stays
  empty (a headless Service with no ready pod answers so).

``fold`` returns the new state and what happened, for the one log line each change deserves.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

# What a change of a name's state says (logged once each); None: nothing new.
Event = Literal["resolved", "changed", "failing", "recovered", "emptying", "emptied", "absent"]


@dataclass(frozen=True, slots=True)
class Resolved:
    addresses: tuple[str, ...]  # sorted, at least one
    ttl: int | None = None  # the answer's TTL (shown; the interval decides when to ask again)


@dataclass(frozen=True, slots=True)
class Empty:
    reason: str  # "NXDOMAIN" or "NODATA"


@dataclass(frozen=True, slots=True)
class Failed:
    error: str


Answer = Resolved | Empty | Failed


def result_of(answer: Answer) -> str:
    """An answer's kind, as the metrics label it: resolved, empty or failed."""
    if isinstance(answer, Resolved):
        return "resolved"
    return "empty" if isinstance(answer, Empty) else "failed"


@dataclass(frozen=True, slots=True)
class NameState:
    """One name's discovery state: the addresses in force and how its answers have gone."""

    addresses: tuple[str, ...] = ()  # in force (the last good answer, or empty)
    answered: bool = False  # any answer at all (addresses or empty) since start
    ever_resolved: bool = False  # ever answered with addresses
    last_answer: float | None = None  # when the server last answered (addresses or empty)
    empty_since: float | None = None  # empty answers since then (NXDOMAIN / NODATA)
    empty_reason: str | None = None
    failing_since: float | None = None  # failed resolutions since then
    error: str | None = None  # the last failure's message
    ttl: int | None = None
    resolutions: int = 0

    @property
    def failing(self) -> bool:
        return self.failing_since is not None

    def grace_left(self, now: float, grace: float) -> float | None:
        """Seconds until empty answers empty the set (None: not counting down)."""
        if self.empty_since is None or not self.addresses:
            return None
        return max(0.0, grace - (now - self.empty_since))


def fold(
    state: NameState, answer: Answer, now: float, grace: float
) -> tuple[NameState, tuple[Event, ...]]:
    """The name's state after ``answer`` (at ``now``), and what to log about it."""
    state = replace(state, resolutions=state.resolutions + 1)
    was_failing = state.failing
    if isinstance(answer, Failed):
        failing = replace(state, failing_since=state.failing_since or now, error=answer.error)
        return failing, () if was_failing else ("failing",)
    events: list[Event] = ["recovered"] if was_failing else []
    state = replace(state, failing_since=None, error=None, answered=True, last_answer=now)
    if isinstance(answer, Resolved):
        if not state.ever_resolved:
            events.append("resolved")
        elif answer.addresses != state.addresses:
            events.append("changed")
        new = replace(
            state,
            addresses=answer.addresses,
            ever_resolved=True,
            empty_since=None,
            empty_reason=None,
            ttl=answer.ttl,
        )
        return new, tuple(events)
    # an empty answer (NXDOMAIN / NODATA)
    first = state.empty_since is None
    since = now if first else state.empty_since
    new = replace(state, empty_since=since, empty_reason=answer.reason)
    if not state.addresses:
        if first and not state.ever_resolved:
            events.append("absent")
        return new, tuple(events)
    assert since is not None
    if now - since >= grace:
        events.append("emptied")
        return replace(new, addresses=()), tuple(events)
    if first:
        events.append("emptying")
    return new, tuple(events)
