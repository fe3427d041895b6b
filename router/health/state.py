"""Backend health: a pure state machine per backend, and the registry that holds the states.

States: ``starting`` (never seen healthy; refusals and 503s mean "still loading" until
``startup_grace`` runs out), ``healthy``, ``unhealthy`` (``fall`` consecutive failed probes;
back to healthy after ``rise`` consecutive good ones). A backend is never dropped for good.

Passive detection from real traffic ejects a backend at once for a back-off that doubles on
repeated ejections (``eject_base`` .. ``eject_max``) and resets once it serves again. A backend
that becomes usable again is ramped in: its weight grows from 0.1 to 1 over ``ramp_seconds``,
so it is not hit by the whole queue at once.

Every function takes ``now`` explicitly; the poller and proxy supply the clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal

MIN_WEIGHT = 0.1
# How often a reader that caches weights takes a ramp's progress in (seconds of its clock).
RAMP_STEP = 0.1


class State(StrEnum):
    STARTING = "starting"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


@dataclass(frozen=True, slots=True)
class HealthConfig:
    startup_grace: float = 900.0
    fall: int = 3
    rise: int = 2
    eject_base: float = 1.0
    eject_max: float = 60.0
    ramp_seconds: float = 10.0


@dataclass(frozen=True, slots=True)
class BackendHealth:
    since: float  # when the router started watching, or the state last changed
    state: State = State.STARTING
    successes: int = 0  # consecutive good probes
    failures: int = 0  # consecutive failed probes
    checks: int = 0
    last_check: float | None = None
    last_error: str | None = None
    ejected_until: float = 0.0
    ejections: int = 0  # consecutive ejections: the back-off exponent
    ramp_from: float | None = None  # when it (re)became usable
    ever_healthy: bool = False  # seen healthy at least once since the router started


def probe(
    h: BackendHealth, ok: bool, now: float, cfg: HealthConfig, error: str | None = None
) -> BackendHealth:
    """Fold one active health probe into the state."""
    h = replace(h, checks=h.checks + 1, last_check=now, last_error=None if ok else error)
    if ok:
        h = replace(h, successes=h.successes + 1, failures=0)
        if h.state is State.STARTING or (h.state is State.UNHEALTHY and h.successes >= cfg.rise):
            # A starting engine that answers is ready: loading is a one-way door.
            return replace(h, state=State.HEALTHY, since=now, ramp_from=now, ever_healthy=True)
        return h
    h = replace(h, failures=h.failures + 1, successes=0)
    if h.state is State.STARTING:
        if now - h.since >= cfg.startup_grace:
            return replace(h, state=State.UNHEALTHY, since=now)
        return h
    if h.state is State.HEALTHY and h.failures >= cfg.fall:
        return replace(h, state=State.UNHEALTHY, since=now)
    return h


def eject(h: BackendHealth, now: float, cfg: HealthConfig, error: str) -> BackendHealth:
    """A refused connection, reset or 5xx seen on real traffic: out at once, for a back-off."""
    if now < h.ejected_until:
        return h  # already out: concurrent failures of one outage count once
    backoff = min(cfg.eject_max, cfg.eject_base * (2.0 ** min(h.ejections, 30)))
    until = now + backoff
    return replace(
        h, ejected_until=until, ejections=h.ejections + 1, last_error=error, ramp_from=until
    )


def served(h: BackendHealth, now: float) -> BackendHealth:
    """A good answer on real traffic after an ejection: the back-off starts over."""
    if h.ejections and now >= h.ejected_until:
        return replace(h, ejections=0)
    return h


def usable(h: BackendHealth, now: float) -> bool:
    return h.state is State.HEALTHY and now >= h.ejected_until


def weight(h: BackendHealth, now: float, cfg: HealthConfig) -> float:
    if h.ramp_from is None or cfg.ramp_seconds <= 0:
        return 1.0
    elapsed = now - h.ramp_from
    if elapsed >= cfg.ramp_seconds:
        return 1.0
    return max(MIN_WEIGHT, elapsed / cfg.ramp_seconds)


# How a pool stands: every backend usable, some, or none.
PoolStatus = Literal["ok", "degraded", "down"]


def pool_status(states: Sequence[BackendHealth], now: float) -> PoolStatus:
    """``ok`` when every backend is usable, ``down`` when none is (or the pool has none, say
    its DNS name does not resolve yet), else ``degraded``."""
    usable_now = sum(usable(h, now) for h in states)
    if states and usable_now == len(states):
        return "ok"
    return "degraded" if usable_now else "down"


def pool_problem(
    pool: str, urls: Sequence[str], states: Sequence[BackendHealth], now: float
) -> str | None:
    """One line on what keeps ``pool`` from being whole, or None when every backend is usable.
    A pool none of whose backends was ever healthy says so: it is not merely starting up."""
    if not states:
        return f"{pool} pool: no backend"
    out = [(url, h) for url, h in zip(urls, states, strict=True) if not usable(h, now)]
    if not out:
        return None
    never = [url for url, h in out if not h.ever_healthy]
    what = (
        "no usable backend"
        if len(out) == len(states)
        else f"{len(out)} of {len(states)} backends not usable"
    )
    parts = []
    if never:
        parts.append(f"never healthy: {', '.join(never)}")
    others = [url for url, h in out if h.ever_healthy]
    if others:
        parts.append(f"down or ejected: {', '.join(others)}")
    return f"{pool} pool: {what} ({'; '.join(parts)})"


class HealthRegistry:
    """The current health of every backend; replaced value by value, read by the router."""

    def __init__(self, urls: list[str], cfg: HealthConfig, now: float) -> None:
        self.cfg = cfg
        self.states: dict[str, BackendHealth] = {url: BackendHealth(since=now) for url in urls}
        # moves whenever a state is replaced: a reader that caches what it derived from the
        # states (the decider's usable backends) knows when to look again
        self.version = 0

    def add(self, url: str, now: float) -> None:
        """A backend that joined: ``starting``, as at start-up (no traffic until healthy)."""
        self.states[url] = BackendHealth(since=now)
        self.version += 1

    def remove(self, url: str) -> None:
        self.states.pop(url, None)
        self.version += 1

    def probe(self, url: str, ok: bool, now: float, error: str | None = None) -> None:
        if url not in self.states:
            return  # it left while the probe was out
        self.states[url] = probe(self.states[url], ok, now, self.cfg, error)
        self.version += 1

    def eject(self, url: str, now: float, error: str) -> None:
        if url in self.states:
            self.states[url] = eject(self.states[url], now, self.cfg, error)
            self.version += 1

    def served(self, url: str, now: float) -> None:
        h = self.states.get(url)
        if h is not None and h.ejections:
            self.states[url] = served(h, now)
            self.version += 1

    def changes_at(self, url: str, now: float) -> float:
        """When ``usable`` or ``weight`` of ``url`` will next change by the clock alone (an
        ejection's end, a ramp's progress: ``RAMP_STEP`` at a time), if nothing else happens;
        inf: not by the clock."""
        h = self.states[url]
        if now < h.ejected_until:
            return h.ejected_until
        if h.ramp_from is not None and self.cfg.ramp_seconds > 0:
            end = h.ramp_from + self.cfg.ramp_seconds
            if now < end:
                return min(end, max(now, h.ramp_from) + RAMP_STEP)
        return math.inf

    def usable(self, url: str, now: float) -> bool:
        return usable(self.states[url], now)

    def weight(self, url: str, now: float) -> float:
        return weight(self.states[url], now, self.cfg)
