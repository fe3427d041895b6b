"""How many engines should run speculative, and the next switch towards that: ``plan``.

One call per planning interval, with what every router replica can see alike (the arrivals
counted over the interval, the mix of lengths and temperatures, the fleet's engines and their
states) and the plan's own state from the last call; it returns the plan and the next state.
Nothing here acts: the plan is advice, and actuation is another layer's.

The rule (issue 37's, with the lessons of others' failures):

- **Best split over the horizon.** Expected goodput of every split of the engines in service
  or on their way (``router.plan.goodput``) at the forecast rate over one restart plus the
  dwell; the best is the desired split.
- **One switch in flight at a time**, and engines loading count as capacity on its way in the
  mode they load (inference-sim #1109: loading instances counted as absent, so the scaler kept
  adding more). While any engine is draining or loading, nothing more is advised.
- **A switch must pay.** Its value is the requests meeting the SLO over restart + dwell with
  the engine down during its restart and in its new mode after, against staying; it must beat
  staying by a margin, under the point forecast (towards speculation: and under the upper band
  too; towards baseline: under either), so a flat load never switches and a falling one does
  not flap (dynamo #9294).
- **The floor.** The engines that stay up during the restart must serve the upper band's
  peak over it within the SLO (their SLO capacity at ``floor_share`` relaxed goodput).
- **Towards baseline faster**: a smaller margin, no dwell; towards speculation waits
  ``dwell_speculative`` after the last switch ended; a reversal waits ``dwell_reverse``.
- **The GPU budget** (dynamo #12428: two pools over one budget left pods Pending): a switch
  moves an engine between modes on its own GPU, and an engine that is down is started only
  while up + loading + draining stays within the budget.
- **Estimates from what is steady** (dynamo #12430: new workers' slow first passes wrecked the
  capacity estimate): the curves come from calibration or learning, never from one engine's
  first minutes, and the rate from arrivals, which engines starting up do not change.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

from router.plan.forecast import Forecast, Holt, forecast, observe
from router.plan.goodput import slo_capacity, split_goodput
from router.plan.params import Params
from router.plan.values import Curve, Mix, Slo
from router.pools import BASELINE, SPECULATIVE, Pool

Status = Literal["up", "loading", "draining", "down"]


class EngineState(NamedTuple):
    """One engine of the fleet as discovery and the poller see it."""

    name: str
    mode: Pool  # the mode it serves (up), is switching into (draining, loading), or last had
    status: Status = "up"
    eta: float = 0.0  # draining or loading: seconds until it serves in ``mode`` (an estimate)
    inflight: int = 0  # requests in flight on it (the least loaded drains first)


class Setting(NamedTuple):
    """What the planner knows of the deployment."""

    speculative: Curve
    baseline: Curve
    restart_speculative: float = 550.0  # seconds out of service to come up speculative
    restart_baseline: float = 510.0
    slo: Slo = Slo()
    budget: int | None = None  # most engines holding a GPU at once (up, draining or loading)

    def restart(self, mode: Pool) -> float:
        return self.restart_speculative if mode == SPECULATIVE else self.restart_baseline


class Observation(NamedTuple):
    """What the router saw since the last call."""

    now: float  # seconds (any origin, increasing)
    arrivals: int  # requests that arrived in the last ``seconds``
    seconds: float
    mix: Mix  # the recent lengths and temperature share


class Action(NamedTuple):
    engine: str
    mode: Pool  # the mode to switch it into (or, if it is down, to start it in)


class Option(NamedTuple):
    """One switch considered, with its numbers."""

    action: Action
    during: tuple[int, int]  # (speculative, baseline) engines up while it restarts
    after: tuple[int, int]
    gain: float  # expected objective gained over the window, points (point forecast)
    gain_upper: float  # the same under the upper band
    need: float  # the upper band's peak over its restart, requests per second
    have: float  # what the engines that stay up serve within the SLO (floor_share)
    blocked: str  # why it may not go ahead ("" if it may)


class Decision(NamedTuple):
    at: float
    desired: int
    action: Action | None
    reason: str


class PlanState(NamedTuple):
    """What the planner carries from one call to the next (a plain value)."""

    holt: Holt | None = None
    mix: Mix | None = None  # the mix the model uses (see Params.mix_tolerance)
    switched: float = -math.inf  # when a switch was last in flight (or advised)
    direction: Pool | None = None  # the mode the last switch went into
    history: tuple[Decision, ...] = ()


class Plan(NamedTuple):
    desired: int  # engines that should run speculative, of ``engines``
    current: int  # speculative engines up or loading into speculative
    engines: int  # engines up, draining or loading
    action: Action | None  # the next switch, or none
    reason: str
    forecast: Forecast
    values: tuple[float, ...]  # expected objective of each split k = 0..engines (window)
    options: tuple[Option, ...]
    state: PlanState


FRESH = PlanState()
DEFAULT = Params()


class _Fleet(NamedTuple):
    up: tuple[int, int]  # (speculative, baseline) up
    coming: tuple[int, int]  # up or on their way into each mode
    switching: tuple[EngineState, ...]  # draining or loading
    down: tuple[EngineState, ...]
    holding: int  # engines holding a GPU


def _census(fleet: Sequence[EngineState]) -> _Fleet:
    up_s = sum(e.status == "up" and e.mode == SPECULATIVE for e in fleet)
    up_b = sum(e.status == "up" and e.mode == BASELINE for e in fleet)
    moving = tuple(e for e in fleet if e.status in ("draining", "loading"))
    co_s = up_s + sum(e.mode == SPECULATIVE for e in moving)
    co_b = up_b + sum(e.mode == BASELINE for e in moving)
    down = tuple(e for e in fleet if e.status == "down")
    return _Fleet((up_s, up_b), (co_s, co_b), moving, down, up_s + up_b + len(moving))


def plan(
    obs: Observation,
    setting: Setting,
    fleet: Sequence[EngineState],
    state: PlanState = FRESH,
    params: Params = DEFAULT,
) -> Plan:
    """The plan after ``obs`` (see the module's docstring)."""
    names = [e.name for e in fleet]
    if len(set(names)) != len(names):
        raise ValueError("engine names must be unique")
    holt = observe(state.holt, obs.arrivals / obs.seconds, obs.seconds, params.forecast)
    mix = state.mix
    if mix is None or not obs.mix.close_to(mix, params.mix_tolerance):
        mix = obs.mix
    census = _census(fleet)
    window = max(setting.restart_speculative, setting.restart_baseline) + params.dwell
    steps = math.ceil(window / params.interval)
    fc = forecast(holt, steps, params.interval, params.forecast)
    switched = obs.now if census.switching else state.switched
    model = _Model(setting, mix, params)

    k_now, m_now = census.coming
    n = k_now + m_now
    settle = min(setting.restart_speculative, setting.restart_baseline)
    values = tuple(model.value((k, n - k), fc.point, settle, window) for k in range(n + 1))
    desired = _desired(values, k_now, params.margin_baseline * model.volume(fc.point, settle,
                                                                             window))  # fmt: skip

    options: list[Option] = []
    action: Action | None = None
    if census.switching:
        e = census.switching[0]
        reason = (f"switch in flight: {e.name} {e.status} into {e.mode}, up in ~{e.eta:.0f} s; "
                  "one at a time")  # fmt: skip
    else:
        options = _options(obs, setting, fleet, census, fc, model, state, params)
        allowed = [o for o in options if not o.blocked]
        if allowed:
            best = max(allowed, key=lambda o: o.gain)
            action = best.action
            reason = _explain(best, fc)
            switched = obs.now
        else:
            reason = _idle_reason(options, desired, k_now)
    direction = action.mode if action is not None else state.direction
    decision = Decision(obs.now, desired, action, reason)
    history = (state.history + (decision,))[-params.history :]
    new_state = PlanState(holt, mix, switched, direction, history)
    return Plan(desired, k_now, n, action, reason, fc, values, tuple(options), new_state)


class _Model:
    """The goodput model over a forecast, for one call."""

    def __init__(self, setting: Setting, mix: Mix, params: Params) -> None:
        self.s = setting
        self.mix = mix
        self.p = params

    def rate_value(self, split: tuple[int, int], rate: float) -> float:
        """Expected requests per second meeting the objective."""
        if rate <= 0:
            return 0.0
        g = split_goodput(self.s.speculative, self.s.baseline, self.mix, self.s.slo, split[0],
                          split[1], rate, self.p.model)  # fmt: skip
        return g.value(self.p.strict_weight) * rate

    def value(self, split: tuple[int, int], series: Sequence[float], start: float,
              end: float) -> float:  # fmt: skip
        """Requests meeting the objective from ``start`` to ``end`` seconds ahead."""
        return sum(self.rate_value(split, r) * dt for r, dt in self._slices(series, start, end))

    def volume(self, series: Sequence[float], start: float, end: float) -> float:
        return sum(r * dt for r, dt in self._slices(series, start, end))

    def _slices(self, series: Sequence[float], start: float,
                end: float) -> list[tuple[float, float]]:  # fmt: skip
        step = self.p.interval
        out = []
        for i, r in enumerate(series):
            lo, hi = max(start, i * step), min(end, (i + 1) * step)
            if hi > lo:
                out.append((r, hi - lo))
        return out

    def capacity(self, split: tuple[int, int]) -> float:
        return slo_capacity(self.s.speculative, self.s.baseline, self.mix, self.s.slo, split[0],
                            split[1], self.p.floor_share, self.p.model)  # fmt: skip


def _desired(values: Sequence[float], current: int, tolerance: float) -> int:
    """The best split; the current one while it is within ``tolerance`` of the best."""
    best = max(range(len(values)), key=lambda k: values[k])
    if 0 <= current < len(values) and values[current] >= values[best] - tolerance:
        return current
    return best


def _options(
    obs: Observation,
    setting: Setting,
    fleet: Sequence[EngineState],
    census: _Fleet,
    fc: Forecast,
    model: _Model,
    state: PlanState,
    params: Params,
) -> list[Option]:
    """Each switch one engine could make now, scored, and why it may not go ahead if not."""
    up_s, up_b = census.up
    since = obs.now - state.switched
    moves: list[tuple[Pool, tuple[int, int], tuple[int, int], str]] = []
    if up_s:
        moves.append((BASELINE, (up_s - 1, up_b), (up_s - 1, up_b + 1), _pick(fleet, SPECULATIVE)))
    if up_b:
        moves.append((SPECULATIVE, (up_s, up_b - 1), (up_s + 1, up_b - 1), _pick(fleet, BASELINE)))
    if census.down:
        name = census.down[0].name  # one down engine stands for the others
        moves.append((SPECULATIVE, (up_s, up_b), (up_s + 1, up_b), name))
        moves.append((BASELINE, (up_s, up_b), (up_s, up_b + 1), name))
    out = []
    for mode, during, after, engine in moves:
        restart = setting.restart(mode)
        end = restart + params.dwell
        gains = []
        for series in (fc.point, fc.upper):
            stay = model.value((up_s, up_b), series, 0.0, end)
            moved = model.value(during, series, 0.0, restart) + model.value(after, series,
                                                                          restart, end)  # fmt: skip
            volume = max(model.volume(series, 0.0, end), 1e-9)
            gains.append((moved - stay) / volume)
        need = fc.peak(restart, upper=True)
        starting = during == (up_s, up_b)
        have = math.inf if starting else model.capacity(during)
        blocked = _blocked(mode, gains[0], gains[1], need, have, since, starting, census,
                           setting.budget, state, params)  # fmt: skip
        out.append(Option(Action(engine, mode), during, after, gains[0], gains[1], need, have,
                          blocked))  # fmt: skip
    return out


def _pick(fleet: Sequence[EngineState], mode: Pool) -> str:
    """The up engine of ``mode`` with the fewest requests in flight (it drains first)."""
    return min((e for e in fleet if e.status == "up" and e.mode == mode),
               key=lambda e: (e.inflight, e.name)).name  # fmt: skip


def _blocked(
    mode: Pool,
    gain: float,
    gain_upper: float,
    need: float,
    have: float,
    since: float,
    starting: bool,
    census: _Fleet,
    budget: int | None,
    state: PlanState,
    params: Params,
) -> str:
    """Why this switch may not go ahead now ("" if it may): the rule's checks in order."""
    if starting and budget is not None and census.holding + 1 > budget:
        return f"GPU budget: {census.holding} of {budget} held"
    if mode == BASELINE:
        best = max(gain, gain_upper)
        if best <= params.margin_baseline:
            return f"gain {100 * best:+.2f} pt <= margin {100 * params.margin_baseline:.2f}"
        if since < params.dwell_baseline:
            return f"dwell: {since:.0f} of {params.dwell_baseline:.0f} s"
    else:
        worst = min(gain, gain_upper)
        if worst <= params.margin_speculative:
            return f"gain {100 * worst:+.2f} pt <= margin {100 * params.margin_speculative:.2f}"
        if since < params.dwell_speculative:
            return f"dwell: {since:.0f} of {params.dwell_speculative:.0f} s"
    if state.direction not in (None, mode) and since < params.dwell_reverse:
        return f"reversal: {since:.0f} of {params.dwell_reverse:.0f} s since the last switch"
    if have < need:
        return f"floor: those up serve {have:.2f}/s < upper forecast {need:.2f}/s"
    return ""


def _explain(o: Option, fc: Forecast) -> str:
    return (
        f"switch {o.action.engine} to {o.action.mode}: expected {100 * o.gain:+.2f} pt "
        f"({100 * o.gain_upper:+.2f} at the upper band) over the restart and dwell; "
        f"{o.during[0]}+{o.during[1]} up meanwhile serve {o.have:.2f}/s >= upper forecast "
        f"{o.need:.2f}/s; forecast now {fc.point[0]:.2f}/s"
    )


def _idle_reason(options: Sequence[Option], desired: int, current: int) -> str:
    if desired == current:
        return f"hold: {current} speculative is the best split for the forecast"
    toward = SPECULATIVE if desired > current else BASELINE
    why = [f"{o.action.mode}: {o.blocked}" for o in options if o.action.mode == toward]
    return f"hold: desired {desired} speculative, but " + ("; ".join(why) or "no engine to move")
