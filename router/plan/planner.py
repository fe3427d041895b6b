"""How many engines should run speculative, and the next switch towards that: ``plan``.

One call per planning interval, with what every router replica can see alike (the arrivals
counted over the interval, the mix of lengths and temperatures, the fleet's engines and their
states) and the plan's own state from the last call; it returns the plan and the next state.
Nothing here acts: the plan is advice, and actuation is another layer's.

The rule (issue 37's, with the lessons of others' failures):

- **Best splits over the horizon.** Expected goodput of each split (``router.plan.goodput``)
  at the forecast rate, minute by minute, over the horizon. A small dynamic program over that
  forecast finds the best schedule of switches from the fleet as it is: one switch at a time,
  each engine out of service for its mode's restart, none whose remaining engines fall below
  the floor. Where that schedule ends is the desired split.
- **A switch must pay.** The next switch is advised when starting it now beats the best
  schedule that does not start it now (waiting included) by a margin: its gain over the
  horizon exceeds what is lost while the engine is down. So a flat load never switches, a
  falling one does not flap (dynamo #9294), and a path of several switches starts early enough
  to end before the load it is for.
- **The floor.** While an engine restarts, those that stay up must serve the upper band's peak
  over the restart within the SLO (their SLO capacity: ``floor_share`` relaxed goodput). Even
  when the split up is short of it already (a surge, or a load past what it serves): there the
  goodput model is least right (it has no transient queues), and a restart only deepens the
  shortfall. So a split that will need several switches must start them while the floor still
  lets it, which the schedule sees: it charges every request the upper band puts past a split's
  capacity, all over the horizon.
- **Ties go to fewer switches.** Every switch in a schedule is charged ``switch_charge`` of
  the horizon's requests besides what its restart loses, so of schedules the model cannot
  tell apart (within its noise) the one with fewer switches wins, staying put most of all,
  and a round trip (a move and the move back) must pay for both. The charge only picks the
  schedule: the gain judged against the margins is the schedule's expected worth.
- **One switch in flight at a time**, and engines loading count as capacity on its way in the
  mode they load into (inference-sim #1109: loading instances counted as absent, so the scaler
  kept adding more). While any engine is draining or loading, nothing more is advised.
- **Towards baseline faster**: a smaller margin; towards speculation the upper band must
  agree, and a reversal towards speculation waits longer than one towards baseline.
- **Not stranded mid-way**: a switch towards baseline that starts a path of several (the best
  schedule switches again after it) must not lose under the upper band either (unless the
  split up is short already): there the floor is likeliest to block the later switches, and the
  splits a path passes through can be the worst at the load (eagle3: 2+2 between 3+1 and 0+4 at
  the peak; over sockets a fleet heading for 0+4 was held at 2+2 all day).
- **Not on the point alone**: a switch towards baseline must not lose under the band's lower
  edge either (unless the split up is short already). Where a split sits at its cliff (all
  speculative engines at the day's peak), a point forecast a few percent high tips the choice
  and the floor then holds the fleet in it for hours; a switch both edges of the band agree on
  does not flicker so.
- **The GPU budget** (dynamo #12428: two pools over one budget left pods Pending): a switch
  moves an engine between modes on its own GPU; an engine that is down is started only while
  up + draining + loading stays within the budget.
- **Estimates from what is steady** (dynamo #12430: new workers' slow first passes wrecked the
  capacity estimate): the curves come from calibration or learning, not from one engine's first
  minutes; the rate from arrivals, which engines starting up do not change; nothing is advised
  before ``warmup`` intervals are seen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

from router.plan.forecast import Forecast, Holt, forecast, observe
from router.plan.goodput import grid_index, grid_rate, slo_capacity, split_goodput
from router.plan.params import Params
from router.plan.values import Curve, Mix, Slo
from router.pools import BASELINE, SPECULATIVE, Pool

Status = Literal["up", "loading", "draining", "down"]
Split = tuple[int, int]  # (speculative, baseline) engines up
MODES: tuple[Pool, Pool] = (BASELINE, SPECULATIVE)


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
    # the newest interval's own count (arrivals, seconds) when ``arrivals`` is over a window of
    # several: what the forecast's clip judges (``forecast.observe``); none: the same
    fresh: tuple[int, float] | None = None


class Action(NamedTuple):
    engine: str
    mode: Pool  # the mode to switch it into (or, if it is down, to start it in)


class Option(NamedTuple):
    """One switch that could start now, with its numbers."""

    action: Action
    during: Split  # up while it restarts
    gain: float  # the best schedule starting with it against staying put, points (point)
    gain_upper: float  # the same under the upper band
    cost: float  # what its restart loses against staying (points of the horizon's requests)
    need: float  # the upper band's peak over its restart, requests per second
    have: float  # what the engines staying up serve within the SLO (floor_share)
    short: bool  # the split up now serves less than ``need`` already
    blocked: str  # why it may not go ahead now ("" if it may)
    gain_lower: float = 0.0  # the gain under the lower band (the point less the band's width)


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
    observed: float = -math.inf  # when the forecast last took an observation


def steps_since(state: PlanState, now: float, interval: float) -> tuple[int, float]:
    """Planning intervals since the forecast's last observation (at least one): what the next
    observation stands for (``forecast.observe``), and the clock those steps reach (the next
    ``PlanState.observed``). Counted in whole steps with the rest carried: rounds that come
    every 1.1 intervals (a timer's interval plus the round's own time, as over sockets) are
    one step each and an extra one every ten, so the forecast's season keeps to the clock."""
    if not math.isfinite(state.observed) or interval <= 0:
        return 1, now
    steps = max(1, round((now - state.observed) / interval))
    reached = state.observed + steps * interval
    if abs(reached - now) > interval:  # (rounds faster than the interval: counted from now)
        reached = now
    return steps, reached


def observe_round(
    state: PlanState,
    now: float,
    rate: float,
    seconds: float,
    params: Params,
    fresh: tuple[int, float] | None = None,
) -> tuple[Holt, float]:
    """The forecast after a round's observation, ``rate`` over the last ``seconds``, and the
    clock it reaches (the next ``PlanState.observed``): it stands for the intervals since the
    last one (``steps_since``), and its window spans ``seconds / interval`` of them (their
    overlap, ``forecast.observe``), the newest of them ``fresh`` (arrivals, seconds). Every
    round takes one, planned or not."""
    steps, observed = steps_since(state, now, params.interval)
    interval = params.interval
    overlap = max(1.0, seconds / interval) if interval > 0 else 1.0
    new = None if fresh is None else (fresh[0] / fresh[1], min(fresh[1], seconds))
    return observe(state.holt, rate, seconds, params.forecast, steps, overlap, new), observed


class Plan(NamedTuple):
    desired: int  # engines that should run speculative, of ``engines``
    current: int  # speculative engines up or loading into speculative
    engines: int  # engines up, draining or loading
    action: Action | None  # the next switch, or none
    reason: str
    forecast: Forecast
    values: tuple[float, ...]  # expected objective per minute of each split k = 0..engines
    options: tuple[Option, ...]
    schedule: tuple[tuple[float, Pool], ...]  # the best schedule's switches: (seconds, mode)
    state: PlanState


FRESH = PlanState()
DEFAULT = Params()


class _Fleet(NamedTuple):
    up: Split
    coming: Split  # up or on their way into each mode
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
    if obs.seconds <= 0 or obs.arrivals < 0:
        raise ValueError("need seconds > 0 and arrivals >= 0")
    if obs.fresh is not None and (obs.fresh[0] < 0 or obs.fresh[1] <= 0):
        raise ValueError("need fresh seconds > 0 and arrivals >= 0")
    holt, observed = observe_round(state, obs.now, obs.arrivals / obs.seconds, obs.seconds, params,
                                   obs.fresh)  # fmt: skip
    mix = state.mix
    if mix is None or not obs.mix.close_to(mix, params.mix_tolerance):
        mix = obs.mix
    census = _census(fleet)
    steps = math.ceil(params.horizon / params.interval)
    fc = forecast(holt, steps, params.interval, params.forecast)
    model = _Model(setting, mix, params, fc)
    switched = obs.now if census.switching else state.switched

    k_now, m_now = census.coming
    n = k_now + m_now
    values = tuple(model.steady((k, n - k)) for k in range(n + 1))
    dp = _Schedule(model, census.coming, fc.point)
    path = dp.follow(census.coming)
    desired = path[-1][2][0] if path else k_now
    schedule = tuple((t * params.interval, mode) for t, mode, _ in path)

    options: list[Option] = []
    action: Action | None = None
    if holt.seen < params.warmup:
        reason = f"warming up: {holt.seen} of {params.warmup} intervals observed"
    elif census.switching:
        e = census.switching[0]
        reason = (f"switch in flight: {e.name} {e.status} into {e.mode}, up in ~{e.eta:.0f} s; "
                  "one at a time")  # fmt: skip
    else:
        upper = _Schedule(model, census.up, fc.upper)
        lower = _Schedule(model, census.up, _lower(fc))
        options = _options(obs, setting, fleet, census, model, dp, upper, lower, state, params)
        allowed = [o for o in options if not o.blocked]
        if allowed:
            best = max(allowed, key=lambda o: o.gain)
            action = best.action
            reason = _explain(best, fc, desired)
            switched = obs.now
        else:
            reason = _idle_reason(options, desired, k_now, schedule)
    direction = action.mode if action is not None else state.direction
    decision = Decision(obs.now, desired, action, reason)
    history = (state.history + (decision,))[-params.history :]
    new_state = PlanState(holt, mix, switched, direction, history, observed)
    return Plan(desired, k_now, n, action, reason, fc, values, tuple(options), schedule,
                new_state)  # fmt: skip


def steady_split(setting: Setting, mix: Mix, rate: float, engines: int,
                 params: Params = DEFAULT) -> int:  # fmt: skip
    """The speculative engines of ``engines`` that the objective prefers at a steady ``rate``
    (where to start a fleet the planner has not seen yet)."""
    fc = Forecast(params.interval, (rate,), (rate,))
    model = _Model(setting, mix, params, fc)
    return max(range(engines + 1), key=lambda k: model.rate_value((k, engines - k), rate))


class _Model:
    """The goodput model over one call's forecast: value per step, SLO capacities."""

    def __init__(self, setting: Setting, mix: Mix, params: Params, fc: Forecast) -> None:
        self.s = setting
        self.mix = mix
        self.p = params
        self.fc = fc
        # the model judges the slo router's threshold by the planner's own objective
        self.mp = params.model._replace(strict_weight=params.strict_weight)
        self._caps: dict[Split, float] = {}
        self._memo: dict[tuple[Split, int], float] = {}

    def rate_value(self, split: Split, rate: float) -> float:
        """Expected requests per second meeting the objective (the model's grid points
        remembered for the call: most calls ask for the same few)."""
        if rate <= 0 or split[0] + split[1] == 0:
            return 0.0
        x = grid_index(rate, self.p.model.grid_step)
        i = int(x)
        lo, hi = self._at(split, i), self._at(split, i + 1)
        return (lo + (x - i) * (hi - lo)) * rate

    def _at(self, split: Split, index: int) -> float:
        key = (split, index)
        got = self._memo.get(key)
        if got is None:
            rate = grid_rate(index, self.p.model.grid_step)
            g = split_goodput(self.s.speculative, self.s.baseline, self.mix, self.s.slo,
                              split[0], split[1], rate, self.mp)  # fmt: skip
            got = self._memo[key] = g.value(self.p.strict_weight)
        return got

    def steady(self, split: Split) -> float:
        """Expected objective per second of ``split`` over the horizon (point forecast, every
        fifth step)."""
        points = self.fc.point[::5]
        return sum(self.rate_value(split, r) for r in points) / len(points)

    def capacity(self, split: Split) -> float:
        if split not in self._caps:
            self._caps[split] = slo_capacity(self.s.speculative, self.s.baseline, self.mix,
                                             self.s.slo, split[0], split[1],
                                             self.p.floor_share, self.mp)  # fmt: skip
        return self._caps[split]

    def restart_steps(self, mode: Pool) -> int:
        return max(1, math.ceil(self.s.restart(mode) / self.p.interval))


class _Schedule:
    """The best schedule of switches over a rate series (a dynamic program, one step per
    planning interval): from each split at each step, stay a step, or start a switch that
    keeps the engines up during its restart at or above the floor (the upper band's peak over
    it) and lands in the neighbouring split when done. A step is worth the requests expected
    to meet the objective there, less the share of the upper band's load past the split's SLO
    capacity (so the schedule keeps capacity ahead of the band, and starts the switches that
    need a while early enough). Past the horizon each split keeps its last step's value for
    ``Params.tail`` seconds."""

    def __init__(self, model: _Model, start: Split, series: Sequence[float]) -> None:
        self.model = model
        n = start[0] + start[1]
        self.n = n
        p = model.p
        horizon = len(series)
        tail = math.ceil(p.tail / p.interval)
        rates = list(series) + [series[-1]] * tail
        self.steps = len(rates)
        self.horizon = horizon
        dt = p.interval
        splits = [(k, n - k) for k in range(n + 1)] + [(k, n - 1 - k) for k in range(n)]
        upper = list(model.fc.upper) + [model.fc.upper[-1]] * tail
        # each step's value: the requests expected to meet the objective, less the share of
        # them the band's top puts beyond what the split serves within the SLO (its capacity):
        # the top of where the rate may go, in expectation over how well today's level is known
        # (with a few arrivals a window that is most of the band, and at its top the charge
        # alone moved fleets an hour before a peak that never came near their capacity)
        tops = _tops(model.fc, p.forecast.z)
        tops += [tops[-1]] * tail
        self.v: dict[Split, list[float]] = {}
        for s in splits:
            cap = model.capacity(s)
            self.v[s] = [
                (model.rate_value(s, r)
                 - p.overload_charge * r * _excess(top, sd, cap) / max(top, 1e-9)) * dt
                for r, (top, sd) in zip(rates, tops, strict=True)
            ]  # fmt: skip
        self.prefix = {s: _prefix(v) for s, v in self.v.items()}
        self.volume = max(sum(rates) * dt, 1e-9)  # requests expected over the horizon
        # hysteresis: every switch in a schedule pays this besides its restart's loss
        self.charge = p.switch_charge * self.volume
        self.restart = {m: model.restart_steps(m) for m in MODES}
        # ok[mode][k][t]: a switch of one engine into ``mode`` from k speculative may start at t
        self.ok: dict[Pool, list[list[bool]]] = {}
        for mode in MODES:
            r = self.restart[mode]
            rows = []
            for k in range(n + 1):
                during = (k - 1, n - k) if mode == BASELINE else (k, n - k - 1)
                if min(during) < 0:
                    rows.append([False] * horizon)
                    continue
                cap = model.capacity(during)
                rows.append([cap >= max(upper[t : t + r]) for t in range(horizon)])
            self.ok[mode] = rows
        # value[t][k]: best objective from step t in split k (stable) to the end
        self.value = [[0.0] * (n + 1) for _ in range(self.steps + 1)]
        self.choice: list[list[Pool | None]] = [[None] * (n + 1) for _ in range(self.steps + 1)]
        for t in range(self.steps - 1, -1, -1):
            for k in range(n + 1):
                best = self.v[(k, n - k)][t] + self.value[t + 1][k]
                pick: Pool | None = None
                if t < horizon:
                    for mode in MODES:
                        got = self.switch_value(t, k, mode)
                        if got is not None and got > best:
                            best, pick = got, mode
                self.value[t][k] = best
                self.choice[t][k] = pick

    def switch_value(self, t: int, k: int, mode: Pool, check: bool = True) -> float | None:
        """Objective from step t if a switch into ``mode`` starts then from split k (None if
        it cannot: no engine to move, or the floor)."""
        n = self.n
        if (mode == BASELINE and k == 0) or (mode == SPECULATIVE and k == n):
            return None
        if check and not self.ok[mode][k][t]:
            return None
        r = self.restart[mode]
        during = (k - 1, n - k) if mode == BASELINE else (k, n - k - 1)
        after = k - 1 if mode == BASELINE else k + 1
        end = min(self.steps, t + r)
        pre = self.prefix[during]
        return pre[end] - pre[t] + self.value[end][after] - self.charge

    def switches_from(self, t: int, k: int) -> int:
        """How many switches the best schedule makes from split k (stable) at step t."""
        return len(self.follow((k, self.n - k), t))

    def follow(self, start: Split, t: int = 0) -> list[tuple[int, Pool, Split]]:
        """The best schedule's switches from ``start`` (stable at step ``t``): (step, mode,
        split after)."""
        k = start[0]
        out = []
        while t < self.horizon:
            mode = self.choice[t][k]
            if mode is None:
                t += 1
                continue
            k = k - 1 if mode == BASELINE else k + 1
            t += self.restart[mode]
            out.append((t - self.restart[mode], mode, (k, self.n - k)))
        return out


def _tops(fc: Forecast, z: float) -> list[tuple[float, float]]:
    """Each step's band top without the level's count noise, and that noise's standard
    deviation: the band is ``point + z * sqrt(move**2 + known**2)``."""
    known = fc.known or (0.0,) * len(fc.point)
    out = []
    for q, u, k in zip(fc.point, fc.upper, known, strict=True):
        sd = (u - q) / z if z > 0 else 0.0
        k = min(k, sd)
        out.append((q + z * math.sqrt(max(0.0, sd * sd - k * k)), k))
    return out


def _excess(mean: float, sd: float, cap: float) -> float:
    """Expected requests per second past ``cap`` of a rate normally spread (``mean``,
    ``sd``): ``E[max(0, R - cap)]``."""
    if sd <= 0:
        return max(0.0, mean - cap)
    d = (mean - cap) / sd
    return (mean - cap) * _phi_cdf(d) + sd * math.exp(-0.5 * d * d) / math.sqrt(2 * math.pi)


def _phi_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _lower(fc: Forecast) -> tuple[float, ...]:
    """The band's bottom: the point less the band's width above it."""
    return tuple(max(0.0, 2.0 * p - u) for p, u in zip(fc.point, fc.upper, strict=True))


def _prefix(xs: Sequence[float]) -> list[float]:
    out = [0.0]
    for x in xs:
        out.append(out[-1] + x)
    return out


def _options(
    obs: Observation,
    setting: Setting,
    fleet: Sequence[EngineState],
    census: _Fleet,
    model: _Model,
    dp: _Schedule,
    upper: _Schedule,
    lower: _Schedule,
    state: PlanState,
    params: Params,
) -> list[Option]:
    """Each switch that could start now, scored: the best schedule that starts with it against
    staying put over the horizon. It may go ahead only if the best schedule starts with it now
    (so its timing is the schedule's: a path of switches that pays later starts when it must)
    and its gain clears the margin."""
    up_s, up_b = census.up
    since = obs.now - state.switched
    out = []
    for mode in MODES:
        source: Pool = SPECULATIVE if mode == BASELINE else BASELINE
        if (up_s if source == SPECULATIVE else up_b) == 0:
            continue
        after = up_s - 1 if mode == BASELINE else up_s + 1
        gains, later = [], []  # later: the switches each schedule makes after this one
        for sched in (dp, upper, lower):
            now = sched.switch_value(0, up_s, mode, check=False)
            assert now is not None
            stay = sum(sched.v[(up_s, up_b)])
            # the charges steer which schedule wins (ties); the gain judged against the
            # margins is what the schedule is worth, as the model expects it
            later.append(sched.switches_from(sched.restart[mode], after))
            gains.append((now + (1 + later[-1]) * sched.charge - stay) / sched.volume)
        during = (up_s - 1, up_b) if mode == BASELINE else (up_s, up_b - 1)
        r = dp.restart[mode]
        cost = (sum(dp.v[(up_s, up_b)][:r]) - sum(dp.v[during][:r])) / dp.volume
        need = model.fc.peak(setting.restart(mode), upper=True)
        have = model.capacity(during)
        short = model.capacity((up_s, up_b)) < need
        path = later[0] > 0  # the best schedule switches again after it
        blocked = _blocked(mode, gains[0], gains[1], gains[2], need, have, short, since, state,
                           params, path)  # fmt: skip
        if not blocked and dp.choice[0][up_s] != mode:
            when = [t for t, m, _ in dp.follow((up_s, up_b)) if m == mode]
            blocked = (f"not yet: the best schedule starts it in {when[0]} min" if when
                       else "the best schedule does not start it")  # fmt: skip
        out.append(Option(Action(_pick(fleet, source), mode), during, gains[0], gains[1], cost,
                          need, have, short, blocked, gains[2]))  # fmt: skip
    out.extend(_starts(census, setting, model, params))
    return out


def _starts(census: _Fleet, setting: Setting, model: _Model, params: Params) -> list[Option]:
    """Starting an engine that is down (one stands for all), within the GPU budget: it adds
    an engine after its restart and takes none away."""
    if not census.down:
        return []
    up_s, up_b = census.up
    fc = model.fc
    dt = params.interval
    volume = max(sum(fc.point) * dt, 1e-9)
    out = []
    starts: tuple[tuple[Pool, Split], ...] = (
        (SPECULATIVE, (up_s + 1, up_b)),
        (BASELINE, (up_s, up_b + 1)),
    )
    for mode, after in starts:
        r = model.restart_steps(mode)
        gain = sum(model.rate_value(after, x) - model.rate_value((up_s, up_b), x)
                   for x in fc.point[r:]) * dt / volume  # fmt: skip
        blocked = ""
        if setting.budget is not None and census.holding + 1 > setting.budget:
            blocked = f"GPU budget: {census.holding} of {setting.budget} held"
        elif gain <= params.margin_baseline:
            blocked = f"gain {100 * gain:+.2f} pt <= margin {100 * params.margin_baseline:.2f}"
        out.append(Option(Action(census.down[0].name, mode), (up_s, up_b), gain, gain, 0.0,
                          0.0, math.inf, False, blocked))  # fmt: skip
    return out


def _pick(fleet: Sequence[EngineState], mode: Pool) -> str:
    """The up engine of ``mode`` with the fewest requests in flight (it drains first)."""
    return min((e for e in fleet if e.status == "up" and e.mode == mode),
               key=lambda e: (e.inflight, e.name)).name  # fmt: skip


def _blocked(
    mode: Pool,
    gain: float,
    gain_upper: float,
    gain_lower: float,
    need: float,
    have: float,
    short: bool,
    since: float,
    state: PlanState,
    params: Params,
    path: bool = False,
) -> str:
    """Why this switch may not go ahead now ("" if it may): the rule's checks in order."""
    if mode == BASELINE:
        if gain <= params.margin_baseline:
            return f"gain {100 * gain:+.2f} pt <= margin {100 * params.margin_baseline:.2f}"
        if gain_lower <= 0 and not short:
            return f"gain {100 * gain_lower:+.2f} pt at the lower band"
        if path and gain_upper <= 0 and not short:
            return f"a path of switches losing {100 * gain_upper:+.2f} pt at the upper band"
        wait = params.dwell_to_baseline
    else:
        if gain <= params.margin_speculative:
            return f"gain {100 * gain:+.2f} pt <= margin {100 * params.margin_speculative:.2f}"
        if gain_upper <= params.margin_speculative:
            return (f"gain {100 * gain_upper:+.2f} pt <= margin "
                    f"{100 * params.margin_speculative:.2f} at the upper band")  # fmt: skip
        wait = params.dwell_to_speculative
    if state.direction not in (None, mode) and since < wait:
        return f"reversal: {since:.0f} of {wait:.0f} s since the last switch"
    if have < need:
        return f"floor: those up would serve {have:.2f}/s < upper forecast {need:.2f}/s"
    return ""


def _explain(o: Option, fc: Forecast, desired: int) -> str:
    return (
        f"switch {o.action.engine} to {o.action.mode} (towards {desired} speculative): "
        f"{100 * o.gain:+.2f} pt expected over the horizon against staying put "
        f"({100 * o.gain_upper:+.2f} at the upper band), its restart costing "
        f"{100 * o.cost:.2f} pt; {o.during[0]}+{o.during[1]} up "
        f"meanwhile serve {o.have:.2f}/s >= upper forecast {o.need:.2f}/s; rate now "
        f"{fc.point[0]:.2f}/s"
    )


def _idle_reason(options: Sequence[Option], desired: int, current: int,
                 schedule: Sequence[tuple[float, Pool]]) -> str:  # fmt: skip
    if desired == current:
        return f"hold: {current} speculative stays the best over the horizon"
    why = "; ".join(f"to {o.action.mode}: {o.blocked}" for o in options if o.blocked)
    nxt = f"next switch planned in {schedule[0][0] / 60:.0f} min; " if schedule else ""
    return f"hold: heading for {desired} speculative; {nxt}{why}"
