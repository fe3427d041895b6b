"""Controllers the fleet lab runs: the planner in the loop, and a fixed schedule (the oracle's).

The planner gets what a calibrated router knows: each mode's curve as a perfect calibration
would measure it on the workload's mix (``curve_for``: the preset's iteration cost at each batch
with the mix's mean context, its acceptance, prefill line and cap) and each mode's restart time
(the preset's start-up), and each interval what the lab's router observed (``fleet_sim``).
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet_sim import Observed

from router.plan import (
    Action,
    Curve,
    Observation,
    Params,
    Plan,
    PlanState,
    Setting,
    Slo,
    mix_of,
    observe,
    plan,
)
from router.sim.model import Preset, step_time


def curve_for(p: Preset, context: float, limit: int = 256) -> Curve:
    """A preset's engine as calibration would know it (wall seconds: the lab's time)."""
    spi = tuple(step_time(p, max(1, b), max(1, b) * context) for b in range(limit + 1))
    return Curve(spi, p.tau, p.tau_sampling, p.prefill_factor * p.p0,
                 p.prefill_factor / p.r_pre, p.max_running)  # fmt: skip


def setting_for(spec: Preset, base: Preset, context: float, budget: int | None = None) -> Setting:
    return Setting(curve_for(spec, context), curve_for(base, context), spec.startup,
                   base.startup, Slo(), budget)  # fmt: skip


class PlannerController:
    """``router.plan.plan`` in the loop, its state kept between calls."""

    def __init__(self, setting: Setting, params: Params | None = None) -> None:
        self.setting = setting
        self.params = params if params is not None else Params()
        self.state = PlanState()
        self.plans: list[tuple[float, Plan]] = []

    def warm(self, counts: Sequence[int], seconds: float) -> None:
        """Feed the forecast an earlier day's arrivals (counts per interval), as a planner that
        has run for a day has seen them."""
        self.warm_rates([c / seconds for c in counts], seconds)

    def warm_rates(self, rates: Sequence[float], seconds: float) -> None:
        """``warm`` given the rates (per second) of intervals of ``seconds``."""
        holt = self.state.holt
        for r in rates:
            holt = observe(holt, r, seconds, self.params.forecast)
        self.state = self.state._replace(holt=holt)

    def observation(self, obs: Observed) -> Observation:
        """What the planner is given of an interval: here its own arrivals."""
        mix = mix_of(obs.prompts, obs.outputs, obs.hot)
        return Observation(obs.now, obs.arrivals, obs.seconds, mix)

    def __call__(self, obs: Observed) -> tuple[Action | None, dict[str, float]]:
        p = plan(self.observation(obs), self.setting, obs.fleet, self.state, self.params)
        self.state = p.state
        self.plans.append((obs.now, p))
        note = {"desired": float(p.desired), "current": float(p.current),
                "point": p.forecast.point[0], "upper": p.forecast.upper[0]}  # fmt: skip
        if p.action is not None:
            chosen = next(o for o in p.options if o.action == p.action)
            note["need"], note["have"] = chosen.need, chosen.have
            note["short"] = float(chosen.short)
        return p.action, note


class Schedule:
    """Fixed switches at fixed times (the oracle's plan, replayed)."""

    def __init__(self, moves: Sequence[tuple[float, str]]) -> None:
        self.moves = sorted(moves)  # (time, mode)

    def __call__(self, obs: Observed) -> tuple[Action | None, dict[str, float]]:
        if not self.moves or self.moves[0][0] > obs.now:
            return None, {}
        if any(e.status in ("draining", "loading") for e in obs.fleet):
            return None, {}  # wait: one switch at a time
        _, mode = self.moves.pop(0)
        other = [e for e in obs.fleet if e.status == "up" and e.mode != mode]
        if not other:
            return None, {}
        e = min(other, key=lambda e: (e.inflight, e.name))
        return Action(e.name, mode), {}  # type: ignore[arg-type]
