"""What the live page (``GET /router/ui``) shows, as one compact document. Pure.

Laid out from ``/router/status`` (so the page and the status agree by construction), the
keeper's curves and the recent window's series: per pool and backend, in flight against the
crossover, the engines' own counts, health; the policy and load signal; the share and reasons of
the last minutes with TTFT/TPOT percentiles; the curves with each backend's operating point;
and, when the fleet planner is on, its plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from router.pools import POOLS, SPECULATIVE


def interpolate(points: Sequence[Sequence[float]], x: float) -> float | None:
    """``y`` at ``x`` on the piecewise-linear curve through ``points`` (held flat past the
    ends: a marker for the page, not a prediction)."""
    if not points:
        return None
    if x <= points[0][0]:
        return float(points[0][1])
    for (x0, y0, *_), (x1, y1, *_) in zip(points, points[1:], strict=False):
        if x <= x1:
            return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0))
    return float(points[-1][1])


def _backend(b: Mapping[str, Any]) -> dict[str, Any]:
    engine = b.get("engine") or {}
    return {
        "url": b["url"],
        "state": b["state"],
        "usable": b["usable"],
        "in_flight": b["in_flight"],
        "load": b["load"],
        "weight": b["weight"],
        "running": engine.get("running"),
        "queued": engine.get("queued"),
        "accept_length": engine.get("spec_accept_length"),
        "ejected_for_s": b["ejected_for_s"],
        "ejections": b["ejections"],
        "failures": b["consecutive_failures"],
        "last_error": b["last_error"],
    }


def _round_points(points: Sequence[Sequence[float]]) -> list[list[float]]:
    return [[p[0], round(float(p[1]), 3), *p[2:]] for p in points]


def curves_document(
    curves: Mapping[str, Any], pools: Mapping[str, Any], crossover: int | None
) -> dict[str, Any]:
    """Start and learned curves per pool, and each backend's operating point on them: its load
    now, at the decode speed its pool's learned curve (else the start one) gives there."""
    start = curves.get("start") or {}
    learned = curves.get("learned") or {}
    operating: dict[str, list[dict[str, Any]]] = {}
    for pool in POOLS:
        curve = learned.get(pool) if len(learned.get(pool) or ()) >= 2 else start.get(pool)
        operating[pool] = []
        for b in pools[pool]["backends"]:
            tps = interpolate(curve or (), max(1.0, float(b["load"])))
            operating[pool].append(
                {"url": b["url"], "load": b["load"], "tps": None if tps is None else round(tps, 3)}
            )
    return {
        "start": {pool: _round_points(start.get(pool) or ()) for pool in POOLS} if start else None,
        "start_source": curves.get("start_source"),
        "learned": {pool: _round_points(learned.get(pool) or ()) for pool in POOLS},
        "operating": operating,
        "crossover": crossover,
        "time_scale": curves.get("time_scale", 1.0),
        "acceptance_length": curves.get("acceptance_length"),
        "reference_acceptance_length": curves.get("reference_acceptance_length"),
    }


# what the page shows of the next switch (an option of GET /router/plan)
NEXT_SWITCH = ("engine", "into", "gain", "cost", "need_rps", "have_rps", "blocked")


def plan_document(plan: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The fleet planner's part of the page (``GET /router/plan``, compact): the split now,
    where the plan heads, its next step, the switch under way, the next switch's numbers, the
    rate and its forecast, and the last reasons. None when the planner is off."""
    if not plan or plan.get("planner", "off") == "off":
        return None
    nxt = plan.get("next_switch")
    forecast = plan.get("forecast")
    traffic = plan.get("traffic")
    return {
        "planner": plan["planner"],
        "status": plan.get("status"),
        "running": plan.get("running"),
        "current": plan.get("current"),
        "desired": plan.get("desired"),
        "targets": plan.get("targets"),
        "switch": plan.get("switch"),
        "reason": plan.get("reason"),
        "next_switch": None if not nxt else {k: nxt[k] for k in NEXT_SWITCH},
        "rate": None if not traffic else traffic.get("rate"),
        "forecast": None
        if not forecast or not forecast.get("point")
        else {"point": forecast["point"][0], "upper": forecast["upper"][0]},
        "history": [
            {"at": d["at"], "reason": d["reason"], "action": d["action"]}
            for d in (plan.get("history") or [])[:5]
        ],
    }


def live_document(
    status: Mapping[str, Any],
    curves: Mapping[str, Any],
    series: Mapping[str, Any],
    plan: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    pools: dict[str, Any] = {}
    for pool in POOLS:
        p = status["pools"][pool]
        backends = [_backend(b) for b in p["backends"]]
        pools[pool] = {
            "in_flight": p["in_flight"],
            "usable": p["usable"],
            "slow_clients": p["slow_clients"],
            "backends": backends,
        }
    usable_spec = sum(1 for b in pools[SPECULATIVE]["backends"] if b["usable"])
    learning = status.get("learning") or {}
    slo = status.get("slo")
    return {
        "policy": status["policy"],
        "load_signal": status["load_signal"],
        "crossover": status["crossover"],  # None: none measured (see no_crossover)
        "crossover_source": status["crossover_source"],
        "no_crossover": status.get("no_crossover"),
        # the speculative pool's room before the crossover (or, with none measured, the
        # highest level measured): that x usable engines
        "speculative_capacity": status["speculative_limit"] * usable_spec,
        "learning": {
            "enabled": learning.get("enabled"),
            "pinned": learning.get("pinned"),
            "target": learning.get("target"),
            "samples": learning.get("samples"),
            "acceptance_length": learning.get("acceptance_length"),
        },
        "slo": None
        if not slo
        else {"ttft_ms": slo.get("slo_ttft_ms"), "tpot_ms": slo.get("slo_tpot_ms")},
        "pools": pools,
        "recent": {**status["recent"], "series": dict(series)},
        "curves": curves_document(curves, status["pools"], status["speculative_limit"]),
        "ui": status.get("ui"),
        "plan": plan_document(plan),
    }
