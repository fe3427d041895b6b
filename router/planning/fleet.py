"""The engines as the planner sees them, from the router's members. Pure.

The router knows its members (``router.members``): each backend's pool, whether it is active
or draining, its health (``starting`` until its first good probe, which for an engine that
refuses connections while it loads means *loading*), and what it has in flight. The planner
wants each engine's mode and status (``router.plan.EngineState``): up, loading (capacity on its
way, inference-sim #1109), draining into the other mode, or down.

A member of a pool is an engine in that pool's mode. A drain alone does not say where the
engine is going: an operator's or the DNS's drain is an engine leaving. So a drain counts as
a switch only while a ``Switch`` the planner advised expects one from that pool; the switch is
then followed through the members -- the engine drains (``draining``), is removed (``left``),
and an engine joins the other pool (``landed``: the same URL coming back, or a new pod's), which
is loading until healthy. Between its removal and that join the engine is nowhere in the
members: it counts as loading into the new mode.

``targets`` is the plan's next step per pool, sequenced so that two pools over one GPU budget
never ask for more than the budget (dynamo #12428): a switch first lowers its source pool by
one; the other pool is raised only once that engine has left. GPUs of the budget that no engine
holds count as engines that are down (``free_slots``); starting one raises its pool at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from router.plan import EngineState
from router.pools import BASELINE, POOLS, Pool


class MemberView(NamedTuple):
    """One member as the planner reads it."""

    url: str
    pool: Pool
    active: bool  # else draining
    health: str  # starting | healthy | unhealthy
    since: float  # when its health state began (monotonic)
    joined: float
    refused: bool  # it failed a probe since it joined: loading, not merely unprobed yet
    inflight: int = 0


class Switch(NamedTuple):
    """A switch the planner advised: engine ``engine`` from ``source`` into ``mode``."""

    engine: str
    source: Pool
    mode: Pool
    advised: float
    draining: str | None = None  # the member of ``source`` that left for it
    left: float | None = None  # when that member was removed from the router's members
    landed: str | None = None  # the member of ``mode`` that came up for it
    id: int = 0  # the planner's number for it (stable while it is re-advised)

    @property
    def phase(self) -> str:
        if self.landed is not None:
            return "loading"
        if self.left is not None:
            return "restarting"
        if self.draining is not None:
            return "draining"
        return "advised"


class Landing(NamedTuple):
    """A switch that ended: the engine serves in ``mode`` after ``seconds`` out of service."""

    mode: Pool
    seconds: float


def follow(
    sw: Switch, members: Sequence[MemberView], now: float
) -> tuple[Switch | None, Landing | None]:
    """The switch after a look at the members: its next step when one happened, ``None`` with
    the landing once its engine serves in the new mode."""
    by_url = {m.url: m for m in members}
    if sw.draining is None:
        gone = sw.engine not in by_url
        mine = by_url.get(sw.engine)
        if mine is not None and mine.pool == sw.source and not mine.active:
            sw = sw._replace(draining=mine.url)
        else:
            other_drain = next((m for m in members if m.pool == sw.source and not m.active), None)
            if other_drain is not None:  # (a scaler picks its own pod)
                sw = sw._replace(draining=other_drain.url)
            elif gone:  # drained and removed between two looks
                sw = sw._replace(draining=sw.engine, left=now)
    if sw.draining is not None and sw.left is None:
        m = by_url.get(sw.draining)
        if m is None or m.pool != sw.source:
            sw = sw._replace(left=now)
    if sw.left is not None and sw.landed is None:
        came = [m for m in members if m.pool == sw.mode and m.active and m.joined >= sw.left]
        back = by_url.get(sw.draining or sw.engine)
        if back is not None and back.pool == sw.mode and back.active:
            came.append(back)  # (a start of an engine that was down: it comes up in place)
        if came:
            sw = sw._replace(landed=min(came, key=lambda m: m.joined).url)
    if sw.landed is not None:
        m = by_url.get(sw.landed)
        if m is not None and m.health == "healthy":
            assert sw.left is not None
            return None, Landing(sw.mode, max(0.0, m.since - sw.left))
    return sw, None


def census(
    members: Sequence[MemberView],
    sw: Switch | None,
    restart: Callable[[Pool], float],
    now: float,
) -> list[EngineState]:
    """The engines for ``router.plan.plan`` (see the module's docstring)."""
    out = []
    for m in members:
        if not m.active:
            if sw is not None and sw.draining == m.url:
                out.append(EngineState(m.url, sw.mode, "draining", restart(sw.mode), m.inflight))
            continue  # leaving for a reason of its own
        if m.health == "healthy":
            out.append(EngineState(m.url, m.pool, "up", 0.0, m.inflight))
        elif m.health == "starting":
            start = sw.left if sw is not None and sw.landed == m.url and sw.left else m.joined
            eta = max(0.0, restart(m.pool) - (now - start))
            out.append(EngineState(m.url, m.pool, "loading", eta, m.inflight))
        else:
            out.append(EngineState(m.url, m.pool, "down", 0.0, m.inflight))
    if sw is not None and sw.left is not None and sw.landed is None:
        name = sw.draining or sw.engine
        if all(e.name != name for e in out):
            eta = max(0.0, restart(sw.mode) - (now - sw.left))
            out.append(EngineState(name, sw.mode, "loading", eta, 0))
    return out


SLOT = "gpu-slot-"  # the name of a GPU the budget allows and no engine holds


def free_slots(fleet: Sequence[EngineState], budget: int | None) -> list[EngineState]:
    """The GPUs of the budget that no engine holds (seen up, loading, draining or down), as
    engines that are down: the planner may start one in either mode. Without them, an engine
    that vanished from the members (a pod deleted, a planner restarted mid-switch) would leave
    its GPU idle for good."""
    if budget is None or len(fleet) >= budget:
        return []
    return [EngineState(f"{SLOT}{i + 1}", BASELINE, "down") for i in range(budget - len(fleet))]


def started(engine: str, mode: Pool, now: float, id: int) -> Switch:
    """A switch that starts an engine that is down (or a free GPU): nothing to drain, so it
    begins where a switch's engine has left (``restarting``), its pool raised at once."""
    return Switch(engine, mode, mode, now, draining=engine, left=now, id=id)


def targets(members: Sequence[MemberView], sw: Switch | None) -> dict[Pool, int]:
    """Engines each pool should run now: the members that are not leaving, with the switch
    in progress sequenced (its source pool lowered first; the other raised once the engine
    has left, until the engine that comes up for it is a member)."""
    out = {pool: sum(m.pool == pool and m.active for m in members) for pool in POOLS}
    if sw is None:
        return out
    if sw.draining is None:
        out[sw.source] = max(0, out[sw.source] - 1)  # (a draining one is not active already)
    elif sw.left is not None and sw.landed is None:
        out[sw.mode] += 1
    return out


def running(members: Sequence[MemberView]) -> dict[Pool, int]:
    """Engines per pool that are up or loading (what the targets are compared with)."""
    return {
        pool: sum(m.pool == pool and m.active and m.health != "unhealthy" for m in members)
        for pool in POOLS
    }


def median(values: Sequence[float]) -> float:
    xs = sorted(values)
    if not xs:
        return math.nan
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
