"""The actuator: follows the router's plan (``GET /router/plan``) on the fleet's engines.

What an operator's tooling would do on a GPU fleet, done here on sims (the sequence the plan
document describes, ``router/planning``):

1. a switch appears ``advised`` with an id not acted on: the engine leaves its pool's DNS name
   (the router drains it: its requests in flight finish);
2. once the router no longer lists it in that pool (drained and removed) and its planner has
   seen it go (the switch is past ``advised``: else the engine could come back under the same
   URL in the other pool before the planner saw it leave, and the planner would lose the
   switch), the engine stops and starts in the other mode, loading for that mode's restart
   time, and its address joins the other pool's name (the router counts it loading until its
   first good probe);
3. the switch ends when the router sees it healthy there.

``step`` is the pure part: from the plan, the engines as the actuator holds them and the
router's members, the moves to make now. One switch at a time, as the planner advises.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

from router.pools import BASELINE, POOLS, SPECULATIVE, Pool

Phase = Literal["serving", "leaving", "loading"]


class Slot(NamedTuple):
    """An engine as the actuator holds it."""

    url: str
    mode: Pool  # the mode it serves in (serving, loading) or leaves (leaving)
    phase: Phase
    into: Pool | None = None  # leaving: the mode it is going to
    switch_id: str | None = None  # leaving: the switch it left for
    since: float = 0.0  # when it entered this phase (the caller's clock)


class Leave(NamedTuple):
    """Take engine ``url`` out of ``source``'s name: the router drains it."""

    url: str
    source: Pool
    into: Pool
    switch_id: str


class Restart(NamedTuple):
    """Stop engine ``url``, start it in ``into`` (loading), add it to ``into``'s name."""

    url: str
    into: Pool


class Landed(NamedTuple):
    """Engine ``url`` serves in ``mode``: the switch is done."""

    url: str
    mode: Pool


Move = Leave | Restart | Landed


def switch_id(switch: Mapping[str, Any]) -> str:
    """A switch's identity: its ``id`` (the document's), else its engine and when advised."""
    if switch.get("id") is not None:
        return str(switch["id"])
    return f"{switch.get('engine')}@{switch.get('advised_at')}"


def seen_leaving(plan: Mapping[str, Any] | None, s: Slot) -> bool:
    """Whether the planner has followed ``s``'s switch past ``advised`` (or no longer follows
    it: withdrawn, given up, or no planner)."""
    sw = plan.get("switch") if plan is not None else None
    if not isinstance(sw, Mapping) or switch_id(sw) != s.switch_id:
        return True
    return sw.get("phase") != "advised"


def step(
    plan: Mapping[str, Any] | None,
    slots: Sequence[Slot],
    members: Mapping[Pool, Mapping[str, Mapping[str, Any]]],
    healthy: Mapping[str, bool],
    acted: frozenset[str],
    now: float = 0.0,
    patience: float = math.inf,
) -> list[Move]:
    """The moves to make now.

    ``members``: each pool's members by URL as the router lists them; ``healthy``: whether
    each loading engine answers ready; ``acted``: switch ids already acted on. An engine that
    left waits for the planner to see it go for at most ``patience`` (``now``'s clock)."""
    moves: list[Move] = []
    busy = False
    for s in slots:
        if s.phase == "leaving":
            busy = True
            assert s.into is not None
            gone = s.url not in members.get(s.mode, {})
            if gone and (seen_leaving(plan, s) or now - s.since >= patience):
                moves.append(Restart(s.url, s.into))
        elif s.phase == "loading":
            busy = True
            if s.url in members.get(s.mode, {}) and healthy.get(s.url, False):
                moves.append(Landed(s.url, s.mode))
    if busy or plan is None:
        return moves
    sw = plan.get("switch")
    if not isinstance(sw, Mapping) or sw.get("phase") != "advised":
        return moves
    sid = switch_id(sw)
    source, into = sw.get("from"), sw.get("into")
    if sid in acted or source not in POOLS or into not in POOLS or source == into:
        return moves
    by_url = {s.url: s for s in slots}
    chosen = by_url.get(str(sw.get("engine")))
    if chosen is None or chosen.phase != "serving" or chosen.mode != source:
        # the planner named an engine we cannot move as asked: take any serving one of the
        # source pool, as a scaler picks its own pod (the router follows whichever drains)
        chosen = next((s for s in slots if s.phase == "serving" and s.mode == source), None)
    if chosen is not None:
        moves.append(Leave(chosen.url, source, into, sid))
    return moves


def split(slots: Sequence[Slot]) -> dict[Pool, int]:
    """Engines serving per mode (a switching engine counts in neither)."""
    out: dict[Pool, int] = {SPECULATIVE: 0, BASELINE: 0}
    for s in slots:
        if s.phase == "serving":
            out[s.mode] += 1
    return out
