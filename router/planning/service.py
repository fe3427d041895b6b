"""``FleetPlanner``: the planner's loop in the router, its inputs gathered as plain values.

Two timers (``router.lifecycle``): ``look`` every second or so follows the engines' counters
(``traffic``), the switch in progress and the engines that load (``fleet``); ``tick`` every
``PLAN_INTERVAL`` calls ``router.plan.plan`` with

- both modes' curves: the keeper's models (the calibrated table, then what the router learned:
  ``router.learn``), in wall seconds;
- the arrivals from the engines' counters (the router's own count where an engine keeps
  none) over the latest intervals that hold enough of them (``traffic.Window``: one interval
  at a production load, several when few requests arrive, as on a compressed day), and the
  mix: lengths and the share at temperature > 0 of the last requests this router saw, their
  means set to what the engines counted over enough requests;
- each mode's restart time: the median of the last switches the router saw land (an engine
  that left one pool until it was healthy in the other), else ``RESTART_S``;
- the engines (``fleet.census``) and the GPU budget.

It keeps the plan's state between calls (and the forecast's across restarts, at
``PLAN_STATE_PATH``), and publishes the plan as a document (``GET /router/plan``) and gauges
(``router.planning.metrics``). The planner's own durations (its interval, horizon, dwell) are
planner seconds, ``PLAN_TIME_SCALE`` wall seconds each: everything it is given is wall time.

Under ``serve --workers`` only the leader plans; it leaves the document in the run's directory
for the others, which serve it as it is.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from router.health.engines import EngineSample
from router.health.state import BackendHealth
from router.learn.keeper import Tokens
from router.members.member import Member
from router.plan import (
    Curve,
    EngineState,
    Holt,
    Mix,
    Observation,
    Params,
    Plan,
    PlanState,
    Setting,
    Slo,
    curve_of,
    mix_of,
    observe_round,
    plan,
)
from router.plan.values import CurveLike
from router.planning.fleet import (
    Landing,
    MemberView,
    Switch,
    census,
    follow,
    free_slots,
    median,
    running,
    started,
    targets,
)
from router.planning.traffic import (
    CounterWatch,
    Estimate,
    Reading,
    Traffic,
    Window,
    WindowParams,
    count_of,
    moved,
    traffic,
)
from router.pools import BASELINE, POOLS, SPECULATIVE, Pool
from router.settings import Settings

log = logging.getLogger("spec_router.plan")

# Requests the mix is estimated over (the most recent ones): the lab's window, about ten minutes
# at mid load (bench/lab/fleet_sim.py).
MIX_WINDOW = 2000
# Restart samples kept per mode (their median is the restart time used).
RESTART_SAMPLES = 5
# A switch that has not landed within this many restarts (plus the drain timeout) is given up.
SWITCH_PATIENCE = 3.0
STATE_FORMAT = 1
# The mix's band, in standard errors: a held mix is replaced by one from fewer requests only
# when they differ by more than this many standard errors of the difference (``beyond_noise``).
# Three, not two: the test is repeated every round on a sample that grows all day, in three
# numbers (two token means, the share), about fifteen looks that are not one another's (five
# doublings of the sample from 50 to a day's ~1100, three numbers each); at two standard
# errors one of them crosses by chance about half the days, at three one day in twenty-five.
MIX_Z = 3.0
# The curves a plan is made on are replaced by the keeper's latest at most once per
# CURVE_REFRESH planner seconds, and only once one of their numbers has moved by more than
# CURVE_TOLERANCE (relative): learning moves them with every request (a bin at a batch seldom
# seen by several percent), and each move left the goodput model's caches cold (keyed on the
# curves' values): a plan of seconds instead of tenths, on every plan (over sockets, 24
# replacements in one compressed day at 2% alone). Learning follows drift over hours; half an
# hour late is within the model's own error (bench/results/fleet-model.md: objective MAE
# 1.3-1.5 points).
CURVE_TOLERANCE = 0.02
CURVE_REFRESH = 1800.0
# ... and at most once per CURVE_REFRESH_ROUNDS rounds: at a minute's interval that is
# CURVE_REFRESH itself, but on a compressed day (bench/fleet.py: an interval of 0.375 s wall)
# CURVE_REFRESH is 11 s wall, less than one cold plan on the shared machine, and every plan
# was cold (10-12 s, 30 intervals each). Counted in rounds, a replacement's cold plan is
# amortised over as many plans at any time scale.
CURVE_REFRESH_ROUNDS = 30
# The acceptance the plan takes is counted from the speculative engines' own counters (tokens
# per verify step of the requests they ended, ``counted_steps``) once this many requests ended
# on them since it was last taken; until then it stays (and without such counters it is the
# keeper's reading, the mean of readings). Four times PLAN_MIN_REQUESTS.
ACCEPT_MIN_REQUESTS = 200
# Most readings of the curves kept to average (``mean_curve``): four refreshes' worth (two
# hours of minutes). The mean is taken on the event loop each round: ~120 x 70 numbers.
CURVE_READINGS = 4 * CURVE_REFRESH_ROUNDS
# Least wall seconds a plan may take (``FleetPlanner.plan_timeout``).
PLAN_TIMEOUT = 60.0
# Intervals counted while no plan took them that are kept for the next round (``Round.missed``):
# a season's worth of late observations is more than the forecast needs (the newest count).
MISSED_KEPT = 1440


class Finished(Protocol):
    """What the planner reads of a finished request (``router.account.outcome.Outcome``)."""

    @property
    def status(self) -> int: ...
    @property
    def usage(self) -> Tokens | None: ...
    @property
    def sampling(self) -> bool: ...
    @property
    def error(self) -> str | None: ...
    @property
    def client_gone(self) -> bool: ...


class Worker(Protocol):
    """What the document says of the plan's process (``router.planning.worker.PlanWorker``)."""

    @property
    def pid(self) -> int | None: ...
    @property
    def restarts(self) -> int: ...
    @property
    def failures(self) -> int: ...
    @property
    def last_failure(self) -> str | None: ...


class Members(Protocol):
    @property
    def members(self) -> Mapping[str, Member]: ...


class Counts(Protocol):
    @property
    def by_backend(self) -> Mapping[str, int]: ...
    @property
    def started(self) -> Mapping[str, int]: ...


class Engines(Protocol):
    @property
    def samples(self) -> Mapping[str, EngineSample]: ...


class Models(Protocol):
    """Both pools' curves (``router.learn.keeper.CrossoverKeeper``: calibrated, then learned)."""

    @property
    def models(self) -> Mapping[Pool, CurveLike] | None: ...


def params_of(s: Settings, base: Params | None = None) -> Params:
    """The planner's tunables with its durations in wall seconds (``PLAN_TIME_SCALE``) and its
    season in intervals (``PLAN_SEASON`` / ``PLAN_INTERVAL``)."""
    p = base if base is not None else Params()
    ts = s.plan_time_scale
    return p._replace(
        interval=s.plan_interval * ts,
        horizon=p.horizon * ts,
        tail=p.tail * ts,
        dwell_to_speculative=p.dwell_to_speculative * ts,
        dwell_to_baseline=p.dwell_to_baseline * ts,
        forecast=p.forecast._replace(season=max(0, round(s.plan_season / s.plan_interval))),
    )


def window_params(s: Settings, base: WindowParams | None = None) -> WindowParams:
    """The window's spans in wall seconds (``PLAN_TIME_SCALE``), its band the forecast's."""
    p = base if base is not None else WindowParams()
    ts = s.plan_time_scale
    return p._replace(rate_span=p.rate_span * ts, means_span=p.means_span * ts,
                      z=Params().forecast.z)  # fmt: skip


class Sample(NamedTuple):
    """How many requests a mix was read from, and their lengths' standard deviations."""

    requests: int
    prompt_sd: float = 0.0
    output_sd: float = 0.0


def sample_of(
    recent: Sequence[tuple[int, int, bool]], mix: Mix | None = None, ended: float | None = None
) -> Sample:
    """The recent requests' count and lengths' standard deviations (``Sample``), scaled as
    ``mix`` scaled their lengths (``scaled_mix``: to the engines' means) when given. When the
    means are the engines' counts over ``ended`` requests, the mix is known as well as those
    are: its count is the fewer of the two (over a compressed day, the last hour's ~100-250
    requests, whose means the backlog of a peak moves, against the router's ~1000)."""
    n = len(recent)
    if n < 2:
        return Sample(n)
    count = n if ended is None else max(1, min(n, math.floor(ended)))
    sds = []
    for i in (0, 1):
        xs = [float(r[i]) for r in recent]
        m = sum(xs) / n
        sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
        if mix is not None and m > 0:
            sd *= (mix.prompt_mean if i == 0 else mix.output_mean) / m
        sds.append(sd)
    return Sample(count, sds[0], sds[1])


def beyond_noise(held: Mix, kept: Sample, new: Mix, seen: Sample, z: float = MIX_Z) -> bool:
    """Whether ``new`` (read from ``seen``) differs from ``held`` (read from ``kept``) by more
    than ``z`` standard errors of the difference of two independent means, in a token mean or
    in the share at temperature > 0. The spread is the larger of the two samples' (a few
    requests of a long-tailed length seldom hold its tail, and understate it)."""
    n, m = kept.requests, seen.requests
    if n < 1 or m < 1:
        return False
    k = math.sqrt(1.0 / n + 1.0 / m)
    p = (held.sampling * n + new.sampling * m) / (n + m)
    return (
        abs(new.prompt_mean - held.prompt_mean) > z * max(kept.prompt_sd, seen.prompt_sd) * k
        or abs(new.output_mean - held.output_mean) > z * max(kept.output_sd, seen.output_sd) * k
        or abs(new.sampling - held.sampling) > z * math.sqrt(p * (1.0 - p)) * k
    )


def mix_moved(held: Mix, kept: Sample, new: Mix, seen: Sample | None, tolerance: float) -> bool:
    """Whether the plan's mix is replaced by ``new``: past the model's ``tolerance`` and either
    read from at least as many requests as the held one or beyond the noise between the two
    (``beyond_noise``). Yesterday's mix of a thousand requests (``PLAN_STATE_PATH``) is not
    replaced by the morning's first fifty, whose means are known to +-28%, unless they are
    that far off; ``seen`` None: its size unknown, the tolerance alone."""
    if new.close_to(held, tolerance):
        return False
    return seen is None or seen.requests >= kept.requests or beyond_noise(held, kept, new, seen)


def reading_of(sample: EngineSample) -> Reading:
    return Reading(
        sample.requests_total,
        sample.prompt_total,
        sample.generated_total,
        sample.running + sample.queued,
    )


def scaled_mix(
    recent: deque[tuple[int, int, bool]], prompt_mean: float | None, output_mean: float | None
) -> Mix | None:
    """The recent requests' mix, each length scaled so its mean is the engines' (when they
    counted one); the engines' means alone when this router has seen no request yet."""
    if not recent:
        if prompt_mean is None or output_mean is None:
            return None
        return Mix((prompt_mean,), (output_mean,), 0.0)
    prompts = [float(p) for p, _, _ in recent]
    outputs = [float(o) for _, o, _ in recent]
    hot = sum(s for _, _, s in recent) / len(recent)
    for xs, target in ((prompts, prompt_mean), (outputs, output_mean)):
        mean = sum(xs) / len(xs)
        if target is not None and mean > 0:
            xs[:] = [x * target / mean for x in xs]
    return mix_of(prompts, [max(1.0, o) for o in outputs], hot)


class Counted(NamedTuple):
    """One interval counted while no plan could take it (the last one was still being made,
    or its round was lost): what its round would have observed."""

    now: float
    estimate: Estimate  # the window's, as the interval closed
    fresh: tuple[int, float]  # the interval's own count: (arrivals, seconds)


class Round(NamedTuple):
    """One planning round's inputs, gathered on the event loop (plain values)."""

    now: float
    seconds: float
    traffic: Traffic
    fleet: list[EngineState]
    mix: Mix | None
    setting: Setting | None
    state: PlanState
    params: Params
    estimate: Estimate  # the rate and token means over the window
    # the intervals counted since the last round that reached the planner, oldest first: the
    # forecast observes each as its own round would have (``decide``)
    missed: tuple[Counted, ...] = ()
    # the curves the setting's replaced (the keeper's previous reading, ``FleetPlanner.setting``):
    # a switch goes ahead only if it would under them too (``agreed``)
    replaced: Setting | None = None


Outcome = tuple[str, Plan | None, PlanState]  # status, the plan (if one was made), next state


def catch_up(state: PlanState, missed: Sequence[Counted], params: Params) -> PlanState:
    """The plan's state once the forecast has observed the intervals a late plan missed, one
    by one as rounds on time would have. Lumped into the next round's single observation (its
    window then one interval the length of the plan), a cold plan of ~20 s wall on a
    compressed day was 40-50 planner minutes of the morning's ramp read as their mean (session
    10's records). A lost round's intervals come here; a late plan's only with
    ``FleetPlanner.look_while_planning``."""
    for c in missed:
        holt, observed = observe_round(state, c.now, c.estimate.rate, c.estimate.seconds,
                                       params, c.fresh)  # fmt: skip
        state = state._replace(holt=holt, observed=observed)
    return state


def decide(r: Round) -> Outcome:
    """The round's plan: ``router.plan.plan`` when it has what it needs, else the reason why
    not (the forecast learns all the same), after the intervals it missed (``catch_up``).
    Pure, and CPU-bound (up to seconds when the goodput model's cache is cold): the lifecycle
    runs it in a child process (``router.planning.worker``)."""
    if r.missed:
        r = r._replace(state=catch_up(r.state, r.missed, r.params))
    fresh = (r.traffic.arrivals, r.traffic.seconds)  # the window's newest interval
    if r.setting is None:
        status = "waiting for curves: calibrate (spec-router calibrate) or let the router "
        status += "learn both pools"
    elif r.mix is None:
        status = "waiting for traffic: too few request lengths seen yet (PLAN_MIN_REQUESTS)"
    elif not r.fleet:
        status = "no engines"
    else:
        est = r.estimate
        obs = Observation(r.now, est.arrivals, est.seconds, r.mix, fresh)
        p = plan(obs, r.setting, r.fleet, r.state, r.params)
        if p.action is not None and r.replaced is not None:
            p = agreed(p, plan(obs, r.replaced, r.fleet, r.state, r.params))
        return "planning", p, p.state
    holt, observed = observe_round(r.state, r.now, r.estimate.rate, r.estimate.seconds, r.params,
                                   fresh)  # fmt: skip
    return status, None, r.state._replace(holt=holt, observed=observed)


def agreed(p: Plan, q: Plan) -> Plan:
    """``p`` (made on the newest curves) if the plan on the curves they replaced, ``q`` (the
    same round otherwise), would switch the same way; else ``p`` held: no action, its option
    blocked with why, the state ``q``'s (the forecast's the same; no switch taken).

    The learned curves are readings: the engines' acceptance over their last window, split by
    an average of the sampling share, and per-batch decode times of the requests seen. On the
    simulated engines, whose acceptance never changes, consecutive readings of the sampling
    acceptance on one compressed day went 2.39 -> 2.32 -> 2.43 -> 2.41 -> 2.30 -> 2.52
    (eagle3-chain, session 11): swings of 3-10% that are noise, and as large as what decides
    a split at the peak. One such reading (2.39 -> 2.317) moved all-speculative chain 4 -> 3
    at its peak (gain +25.5 pt, +2.4 at the lower band; under the curves it replaced -0.36 at
    the lower band), 6 strict points below the runs that held. Two readings in a row must
    agree: a real change of acceptance shows in both within one replacement
    (CURVE_REFRESH_ROUNDS rounds); noise seldom does the same way in both."""
    if p.action is None or (q.action is not None and q.action.mode == p.action.mode):
        return p
    mine = next((o for o in q.options if o.action.mode == p.action.mode), None)
    why = "not a switch under the curves these replaced"
    if mine is not None:
        why += f" (gain {100 * mine.gain:+.2f} pt, {100 * mine.gain_lower:+.2f} at the lower band)"
    options = tuple(o._replace(blocked=why) if o.action == p.action else o for o in p.options)
    reason = f"holding: {why}"
    last = (
        q.state.history[-1]._replace(desired=p.desired, reason=reason) if q.state.history else None
    )
    history = (*q.state.history[:-1], last) if last is not None else q.state.history
    return p._replace(action=None, reason=reason, options=options,
                      state=q.state._replace(history=history))  # fmt: skip


class FleetPlanner:
    def __init__(
        self,
        settings: Settings,
        roster: Members,
        health: Mapping[str, BackendHealth],
        tracker: Counts,
        engines: Engines,
        keeper: Models,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        writer: bool = True,
        shared: Path | None = None,
    ) -> None:
        self.settings = settings
        self.mode = settings.planner
        self.roster = roster
        self.health = health
        self.tracker = tracker
        self.engines = engines
        self.keeper = keeper
        self.clock = clock
        self.wall = wall
        self.writer = writer  # plans (the process, or the leader under --workers)
        self.shared = shared  # where the leader leaves the document for the other workers
        self.params = params_of(settings)
        self.slo = Slo(settings.slo_ttft_ms / 1000, settings.slo_tpot_ms / 1000)
        holt, mix, kept = self._load_state()
        self.state = PlanState(holt=holt)
        self.watch = CounterWatch()
        self.window = Window(window_params(settings))
        self.last_estimate: Estimate | None = None
        self.recent: deque[tuple[int, int, bool]] = deque(maxlen=MIX_WINDOW)
        self.switch: Switch | None = None
        self.loading: dict[str, float] = {}  # members seen loading: since when
        self.restarts: dict[Pool, deque[float]] = {p: deque(maxlen=RESTART_SAMPLES) for p in POOLS}
        self.sent: dict[str, int] = {}  # requests this router sent each backend, at the last look
        self.own = 0.0  # ... and what that grew by since the interval began
        self.last_tick = self.born = clock()
        self.missed: list[Counted] = []  # intervals counted since the last round planned
        self.last_intervals = 0  # intervals the last round's traffic spans (missed + its own)
        self.last_plan: Plan | None = None
        self.took = 0.0  # seconds the last decision took
        self.stale: str | None = None  # why the plan shown is not this interval's
        self.curves: dict[Pool, Curve] = {}  # the curves plans are made on (CURVE_TOLERANCE)
        self.curves_at = -math.inf  # when they were last replaced
        self.curves_rounds = 0  # rounds planned on them since
        self.curve_updates = 0  # times they were replaced by the keeper's (after the first)
        self.curves_before: dict[Pool, Curve] = {}  # the ones they last replaced (``agreed``)
        # the keeper's readings since they were last replaced (their mean replaces them)
        self.readings: dict[Pool, deque[Curve]] = {p: deque(maxlen=CURVE_READINGS) for p in POOLS}
        # the speculative engines' counted acceptance since it was last taken, their last samples
        self.accepted = Accepted()
        self.accept_last: dict[str, EngineSample] = {}
        self.accept_counted = False  # whether any engine has counted (then it is the source)
        # the mix plans are made on (``hold_mix``; yesterday's, kept at PLAN_STATE_PATH, until
        # today's replaces it), and how many requests it was read from
        self.mix: Mix | None = mix
        self.mix_sample = kept
        self.mix_rounds = 0  # rounds planned on it since it was taken
        self.worker: Worker | None = None  # the process that plans (router.planning.worker)
        self.last_traffic: Traffic | None = None
        self.status = "starting: the first plan comes after one interval"
        self.advised = 0  # distinct switches advised so far (the last one's id)
        self.withdrawn: Switch | None = None  # the last advice withdrawn (``_advise``)
        # switches that ended (landed or given up) so far, and that count when the round being
        # planned was gathered: a plan made on a fleet a switch has since changed is not acted on
        self.ended = self.ended_at_gather = 0
        self.doc: dict[str, Any] = {
            "planner": self.mode,
            "status": self.status,
            "at": None,
            "interval_s": self.interval,
            "time_scale": settings.plan_time_scale,
            "budget": settings.gpu_budget,
        }

    @property
    def interval(self) -> float:
        """Wall seconds between two plans."""
        return self.params.interval

    @property
    def look_interval(self) -> float:
        return min(1.0, self.interval / 8)

    @property
    def plan_timeout(self) -> float:
        """Wall seconds a plan may take before its worker is stopped and started afresh: far
        past a cold plan on a loaded machine, short enough that a stuck one does not silence
        the planner for long."""
        return max(PLAN_TIMEOUT, 10 * self.interval)

    # -- inputs --------------------------------------------------------------------------------
    def observe(self, out: Finished) -> None:
        """Outcome observer: a request that ended well adds its lengths to the mix."""
        usage = out.usage
        if out.status != 200 or usage is None or out.error is not None or out.client_gone:
            return
        self.recent.append((usage.prompt_tokens, usage.completion_tokens, out.sampling))

    def views(self) -> list[MemberView]:
        flight = self.tracker.by_backend
        out = []
        for m in self.roster.members.values():
            h = self.health.get(m.url)
            state = "starting" if h is None else h.state.value
            refused = h is not None and h.failures > 0 and state == "starting"
            since = m.joined if h is None else h.since
            out.append(MemberView(m.url, m.pool, m.active, state, since, m.joined, refused,
                                  flight.get(m.url, 0)))  # fmt: skip
        return out

    def restart(self, mode: Pool) -> float:
        """Wall seconds an engine switching into ``mode`` is out of service."""
        seen = self.restarts[mode]
        if seen:
            return median(list(seen))
        return self.settings.restart_s * self.settings.plan_time_scale

    def look(self) -> None:
        """Follow the counters, the switch in progress and the engines that load."""
        now = self.clock()
        members = self.views()
        for m in members:  # (one there before the planner: its load began we know not when)
            if m.refused and m.url not in self.loading and m.joined > self.born:
                self.loading[m.url] = m.joined
        samples = self.engines.samples
        readings = {url: reading_of(s) for url, s in samples.items()}
        self.watch.update(readings, fresh=self.loading)
        spec = {m.url for m in members if m.pool == SPECULATIVE}
        last = {url: s for url, s in samples.items() if url in spec}
        for url, s in last.items():
            moved_by = counted_steps(self.accept_last.get(url), s)
            if moved_by is not None:
                self.accepted = self.accepted.plus(moved_by)
                self.accept_counted = True
        self.accept_last = last
        started = self.tracker.started
        for url, n in started.items():
            self.own += max(0, n - self.sent.get(url, n))
        self.sent = dict(started)
        if self.switch is not None:
            sw, landing = follow(self.switch, members, now)
            if landing is not None:
                self._landed(landing, self.switch)
                self.ended += 1
            elif sw is not None and self._overdue(sw, now):
                log.warning("the switch of %s into %s did not land in time: given up",
                            sw.engine, sw.mode)  # fmt: skip
                sw = None
                self.ended += 1
            self.switch = sw
        elif self.withdrawn is not None:
            self._recall(self.withdrawn, members, now)
        healthy = {m.url: m for m in members if m.health == "healthy"}
        for url in [u for u in self.loading if u in healthy]:
            start = self.loading.pop(url)
            self.restarts[healthy[url].pool].append(max(0.0, healthy[url].since - start))
        present = {m.url for m in members}
        for url in [u for u in self.loading if u not in present]:
            del self.loading[url]
        self.doc = {**self.doc, **self._live(members, now)}  # (the rest changes with a plan)
        self._share()

    def _recall(self, old: Switch, members: Sequence[MemberView], now: float) -> None:
        """An actuator may act on advice between two looks, after a plan withdrew it: when the
        withdrawn switch's engine is seen moving, the switch is followed again. Without it the
        engine leaves with no switch to count it, the census is one short, and a free GPU of
        the budget is offered for a placeholder no engine ever fills. Forgotten after two
        intervals unmoved (an actuator acts within a look or two of the advice)."""
        sw, landing = follow(old, members, now)
        if landing is None and (sw is None or sw.phase == "advised"):
            if now - old.advised > 2 * self.interval:
                self.withdrawn = None
            return
        self.withdrawn = None
        log.warning("the withdrawn switch of %s into %s was carried out: followed again",
                    old.engine, old.mode)  # fmt: skip
        if landing is not None:
            self._landed(landing, old)
            self.ended += 1
        else:
            self.switch = sw

    def _landed(self, landing: Landing, sw: Switch) -> None:
        self.restarts[landing.mode].append(landing.seconds)
        if sw.landed is not None:
            self.loading.pop(sw.landed, None)  # (counted here, from when it left)
        log.info("%s serves %s again after %.1f s out of service", sw.landed, landing.mode,
                 landing.seconds)  # fmt: skip

    def _overdue(self, sw: Switch, now: float) -> bool:
        if sw.phase == "advised":
            return False  # (withdrawn or renewed at the next plan)
        limit = SWITCH_PATIENCE * self.restart(sw.mode) + self.settings.drain_timeout
        return now - sw.advised > limit

    # -- the plan ------------------------------------------------------------------------------
    def setting(self) -> Setting | None:
        models = self.keeper.models
        if models is None:
            return None
        now = self.clock()
        self.curves_rounds += 1
        due = (now - self.curves_at >= CURVE_REFRESH * self.settings.plan_time_scale
               and self.curves_rounds > CURVE_REFRESH_ROUNDS)  # fmt: skip
        before = dict(self.curves)
        for pool in POOLS:
            new = curve_of(models[pool])
            held = self.curves.get(pool)
            readings = self.readings[pool]
            if held is not None and not math.isinf(curve_drift(held, new)):
                readings.append(new)
                new = mean_curve(readings)
                if pool == SPECULATIVE and self.accept_counted:
                    new = self._acceptance(held, new)
            drift = curve_drift(held, new)
            if held is None or math.isinf(drift) or (due and drift > CURVE_TOLERANCE):
                if held is not None:
                    log.info("the %s curve moved %.1f%% (the mean of %d readings): the plan "
                             "takes it", pool, 100 * drift, max(1, len(readings)))  # fmt: skip
                if (
                    pool == SPECULATIVE
                    and held is not None
                    and ((new.tau_greedy, new.tau_sampling) != (held.tau_greedy, held.tau_sampling))
                ):
                    self.accepted = Accepted()  # (counted afresh from the acceptance taken)
                self.curves[pool] = new
                readings.clear()
                self.curves_at = now
                self.curves_rounds = 0
                self.curve_updates += held is not None
                if held is not None:
                    self.curves_before = before
        return Setting(
            self.curves[SPECULATIVE],
            self.curves[BASELINE],
            self.restart(SPECULATIVE),
            self.restart(BASELINE),
            self.slo,
            self.settings.gpu_budget,
        )

    def _acceptance(self, held: Curve, mean: Curve) -> Curve:
        """``mean`` (the keeper's readings) with the acceptance the engines counted since it
        was last taken, or ``held``'s until they have counted ACCEPT_MIN_REQUESTS requests.

        The keeper's acceptance is SGLang's gauge, each engine's last 40 iterations: on
        simulated engines whose acceptance never changes, the means of 31 rounds' readings at
        the curves' replacements went 2.59, 2.36, 2.53, 2.40 (eagle3-chain, tau at
        temperature > 0, session 11; the readings repeat while an engine's window lasts), as
        far apart as what decides that fleet's split at its peak; the counters hold every
        step of every request that ended."""
        acc = self.accepted
        if acc.requests < ACCEPT_MIN_REQUESTS or acc.steps <= 0:
            return mean._replace(tau_greedy=held.tau_greedy, tau_sampling=held.tau_sampling)
        share = self.mix.sampling if self.mix is not None else 0.0
        return counted_curve(mean, acc, share)

    def hold_mix(self, mix: Mix | None, seen: Sample | None = None) -> Mix | None:
        """The mix the plan is made on: the one it had until the observed one (read from
        ``seen``) has moved (``mix_moved``: past the model's tolerance, ``Params.mix_tolerance``,
        which the planner applies too, and not within the noise of fewer requests) and it has
        been planned on for CURVE_REFRESH_ROUNDS rounds, as the curves are. Each new mix
        leaves the goodput model's caches cold; over a compressed day the token means of a
        few hundred requests moved past 10% every few rounds (half the cold plans)."""
        self.mix_rounds += 1
        held = self.mix
        moved = held is None or (
            self.mix_rounds > CURVE_REFRESH_ROUNDS
            and mix is not None
            and mix_moved(held, self.mix_sample, mix, seen, self.params.mix_tolerance)
        )
        if mix is not None and moved:
            self.mix, self.mix_rounds = mix, 0
            self.mix_sample = seen if seen is not None else Sample(0)
        return self.mix

    def tick(self) -> None:
        """One plan in the caller's thread: gather, decide, publish (the lifecycle runs the
        decision in its worker process instead: ``gather``, ``decide``, ``publish``)."""
        r = self.gather()
        t0 = time.perf_counter()
        out = decide(r)
        self.publish(r, out, time.perf_counter() - t0)

    def _count(self) -> tuple[float, Traffic, Estimate]:
        """Close the interval: its count into the window; the window's estimate."""
        now = self.clock()
        seconds = max(1e-9, now - self.last_tick)
        self.last_tick = now
        tally = self.watch.take()
        tr = traffic(tally, seconds, self.own)
        self.own = 0.0
        self.window.add(count_of(tally, tr))
        est = self.last_estimate = self.window.estimate()
        return now, tr, est

    def look_while_planning(self) -> None:
        """A look while a plan is being made (in the worker); an interval that ends meanwhile
        is counted as its own, for the next round's forecast (``Round.missed``). Not used by
        the lifecycle for now (see ``router.lifecycle.keep_planning``)."""
        self.look()
        if self.clock() - self.last_tick >= self.interval:
            now, tr, est = self._count()
            self.missed.append(Counted(now, est, (tr.arrivals, tr.seconds)))
            del self.missed[:-MISSED_KEPT]

    def gather(self) -> Round:
        """The interval's inputs as plain values (on the event loop: it reads the members)."""
        self.look()
        self.ended_at_gather = self.ended
        now, tr, est = self._count()
        seconds = tr.seconds
        fleet = census(self.views(), self.switch, self.restart, now)
        fleet += free_slots(fleet, self.settings.gpu_budget)
        # No plan on the lengths of a few requests: over sockets the first plans of a
        # compressed day were made on ONE request's (392 / 72 tokens against the day's ~1190 /
        # 230), held for CURVE_REFRESH_ROUNDS rounds, and both flat-load runs switched on it.
        # (Yesterday's mix, when PLAN_STATE_PATH kept one, is planned on meanwhile.)
        seen, sample = None, None
        if len(self.recent) >= self.settings.plan_min_requests:
            seen = scaled_mix(self.recent, est.prompt_mean, est.output_mean)
            engines = est.prompt_mean is not None or est.output_mean is not None
            sample = sample_of(self.recent, seen, est.ended if engines else None)
        mix = self.hold_mix(seen, sample)
        missed, self.missed = tuple(self.missed), []
        # shown (the document's traffic): every interval since the last round, the token means
        # the newest's
        self.last_traffic = tr._replace(
            seconds=tr.seconds + sum(c.fresh[1] for c in missed),
            arrivals=tr.arrivals + sum(c.fresh[0] for c in missed),
        )
        self.last_intervals = 1 + len(missed)
        setting = self.setting()
        return Round(now, seconds, tr, fleet, mix, setting, self.state, self.params, est, missed,
                     self.replaced(setting))  # fmt: skip

    def replaced(self, setting: Setting | None) -> Setting | None:
        """``setting`` on the curves its own replaced, if they were (``agreed``)."""
        if setting is None or not self.curves_before:
            return None
        return setting._replace(speculative=self.curves_before[SPECULATIVE],
                                baseline=self.curves_before[BASELINE])  # fmt: skip

    def publish(self, r: Round, out: Outcome, took: float, worker: Worker | None = None) -> None:
        """Take the decision's plan and state, advise, and publish the document."""
        self.status, p, self.state = out
        self.took = took
        self.stale = None
        self.worker = worker
        if p is not None and self.ended != self.ended_at_gather:
            # a switch ended while this plan was made (in the worker, seconds): the fleet it
            # was made on is gone, and acting on it could switch the engine that just landed
            # again or a second one past the goal (one switch at a time). The next plan decides.
            self.status += "; not acted on: a switch ended while it was made"
            log.info("plan not acted on: a switch ended while it was made (%s)", p.reason)
        elif p is not None:
            self._advise(p, r.fleet, r.now)
        self.last_plan = p
        self.doc = self._document(self.views(), self.clock())
        self._share()
        self._save_holt()

    def failed(self, r: Round, why: str, worker: Worker | None = None) -> None:
        """The round's decision was lost (its worker died or overran): the last plan and its
        advice stay, marked stale (``stale`` in the document, a gauge), until the next plan."""
        self.stale = why
        self.worker = worker
        # the lost round's intervals are the next round's to observe (none is lost with it)
        own = Counted(r.now, r.estimate, (r.traffic.arrivals, r.traffic.seconds))
        self.missed[:0] = [*r.missed, own]
        del self.missed[:-MISSED_KEPT]
        self.status = f"stale: {why}; the plan shown is the last one made"
        self.doc = self._document(self.views(), self.clock())
        self._share()

    def _advise(self, p: Plan, fleet: list[Any], now: float) -> None:
        sw = self.switch
        if p.action is None:
            if sw is not None and sw.phase == "advised":
                self.switch, self.withdrawn = None, sw  # withdrawn: nothing seen moving yet
            return
        engine = next((e for e in fleet if e.name == p.action.engine), None)
        source: Pool = engine.mode if engine is not None else p.action.mode
        if sw is not None and sw.phase != "advised":
            return  # (the planner holds while one is in flight: not reached)
        if sw is not None and (sw.engine, sw.mode) == (p.action.engine, p.action.mode):
            self.switch = sw._replace(advised=now)  # the same advice again: the same switch
            return
        self.advised += 1
        self.withdrawn = None  # (other advice replaces it)
        if engine is not None and engine.status == "down":
            self.switch = started(engine.name, p.action.mode, now, self.advised)
        else:
            self.switch = Switch(p.action.engine, source, p.action.mode, now, id=self.advised)
        log.info("plan: %s", p.reason)

    # -- what it publishes ---------------------------------------------------------------------
    def document(self) -> dict[str, Any]:
        """``GET /router/plan`` (the leader's, under --workers)."""
        if self.writer or self.shared is None:
            if "running" not in self.doc:  # (asked before the first look)
                self.doc = {**self.doc, **self._live(self.views(), self.clock())}
            return self.doc
        try:
            got: dict[str, Any] = json.loads(self.shared.read_text())
            return got
        except (OSError, ValueError):
            return {"planner": self.mode, "status": "no plan shared by the leader yet"}

    def _when(self, now: float) -> Callable[[float], float]:
        """Monotonic seconds to Unix time, for the document."""
        wall_now = self.wall()
        return lambda t: round(wall_now - (now - t), 3)

    def _live(self, members: list[MemberView], now: float) -> dict[str, Any]:
        """The document's part that follows the members between two plans (each look)."""
        sw = self.switch
        when = self._when(now)
        fleet = census(members, sw, self.restart, now)
        fleet += free_slots(fleet, self.settings.gpu_budget)
        run = running(members)
        goal = targets(members, sw)
        return {
            "running": run,
            "targets": goal,
            "desired_engines": goal if self.mode == "autoscale" else run,
            "off_plan_engines": sum(abs(goal[pool] - run[pool]) for pool in POOLS),
            "fleet": [
                {
                    "engine": e.name,
                    "mode": e.mode,
                    "status": e.status,
                    "eta_s": round(e.eta, 3),
                    "in_flight": e.inflight,
                }
                for e in fleet
            ],  # fmt: skip
            "switch": None
            if sw is None
            else {
                "id": sw.id,
                "engine": sw.engine,
                "from": sw.source,
                "into": sw.mode,
                "phase": sw.phase,
                "advised_at": when(sw.advised),
                "draining": sw.draining,
                "landed": sw.landed,
            },
            "restart_s": {
                pool: {
                    "seconds": round(self.restart(pool), 3),
                    "source": "observed" if self.restarts[pool] else "configured",
                    "samples": [round(x, 3) for x in self.restarts[pool]],
                }
                for pool in POOLS
            },
            "switches_advised": self.advised,
        }

    def _document(self, members: list[MemberView], now: float) -> dict[str, Any]:
        p, tr, sw, est = self.last_plan, self.last_traffic, self.switch, self.last_estimate
        when = self._when(now)
        doc: dict[str, Any] = {
            "planner": self.mode,
            "status": self.status,
            "at": when(now),
            "interval_s": self.interval,
            "time_scale": self.settings.plan_time_scale,
            "budget": self.settings.gpu_budget,
            "took_s": round(self.took, 3),
            "stale": self.stale is not None,
            "curve_updates": self.curve_updates,
            **self._live(members, now),
        }
        w = self.worker
        if w is not None:
            doc["worker"] = {"pid": w.pid, "restarts": w.restarts, "failures": w.failures,
                             "last_failure": w.last_failure}  # fmt: skip
        if tr is not None:
            doc["traffic"] = {
                "seconds": round(tr.seconds, 3),
                "arrivals": tr.arrivals,
                "rate": tr.arrivals / tr.seconds,
                "intervals": self.last_intervals,
                "source": tr.source,
                "prompt_mean": tr.prompt_mean,
                "output_mean": tr.output_mean,
                "mix_requests": len(self.recent),
            }
        if est is not None:
            doc["estimate"] = {
                "arrivals": est.arrivals,
                "seconds": round(est.seconds, 3),
                "rate": est.rate,
                "lower": est.lower,
                "upper": est.upper,
                "prompt_mean": est.prompt_mean,
                "output_mean": est.output_mean,
                "means_over": est.ended,
            }
        if p is None:
            return doc
        split = {SPECULATIVE: p.current, BASELINE: p.engines - p.current}
        goal = {SPECULATIVE: p.desired, BASELINE: p.engines - p.desired}
        chosen = next((o for o in p.options if o.action == p.action), None)
        best = max(p.options, key=lambda o: o.gain, default=None)
        nxt = chosen or best
        doc.update(
            current=split,
            desired=goal,
            action=None
            if p.action is None or sw is None
            else {"engine": p.action.engine, "into": p.action.mode, "switch_id": sw.id},
            reason=p.reason,
            next_switch=None if nxt is None else _option(nxt),
            forecast={
                "step_s": p.forecast.step,
                "point": [round(x, 4) for x in p.forecast.point],
                "upper": [round(x, 4) for x in p.forecast.upper],
            },
            values=[round(v, 5) for v in p.values],
            options=[_option(o) for o in p.options],
            schedule=[{"in_s": round(t, 1), "into": mode} for t, mode in p.schedule],
            history=[
                {
                    "at": when(d.at),
                    "desired": d.desired,
                    "reason": d.reason,
                    "action": None
                    if d.action is None
                    else {"engine": d.action.engine, "into": d.action.mode},
                }
                for d in reversed(p.state.history)
            ],  # fmt: skip
        )
        return doc

    def _share(self) -> None:
        if self.shared is None or not self.writer:
            return
        tmp = self.shared.with_suffix(f".{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(self.doc, default=_plain))
            os.replace(tmp, self.shared)
        except OSError as exc:
            log.warning("cannot share the plan: %s", exc)

    # -- the forecast's state across restarts ----------------------------------------------------
    def _load_state(self) -> tuple[Holt | None, Mix | None, Sample]:
        path = self.settings.plan_state_path
        if path is None or not path.exists():
            return None, None, Sample(0)
        try:
            return state_of(json.loads(path.read_text()), self.params.interval)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s: cannot read the forecast's state (%s): it starts afresh", path, exc)
            return None, None, Sample(0)

    def _save_holt(self) -> None:
        path = self.settings.plan_state_path
        holt = self.state.holt
        if path is None or holt is None or not self.writer:
            return
        raw = holt_document(holt, self.params.interval, self.mix, self.mix_sample)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(raw))
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cannot keep the forecast's state at %s: %s", path, exc)


class Accepted(NamedTuple):
    """What the speculative engines' counters moved by: tokens, verify steps, requests."""

    tokens: float = 0.0
    steps: float = 0.0
    requests: float = 0.0

    def plus(self, other: Accepted) -> Accepted:
        return Accepted(*(a + b for a, b in zip(self, other, strict=True)))


def counted_steps(prev: EngineSample | None, cur: EngineSample) -> Accepted | None:
    """The tokens and verify steps a speculative engine counted between two samples: SGLang's
    generated tokens and verify calls (0.5.23, moved as its requests end), vLLM's and
    llama.cpp's drafts + accepted tokens and drafts; None without such counters, or at the
    first sample. A counter that went back is an engine that restarted (from zero)."""
    if prev is None:
        return None
    requests = moved(cur.requests_total, prev.requests_total) or 0.0
    drafts = moved(cur.drafts_total, prev.drafts_total)
    accepted = moved(cur.accepted_total, prev.accepted_total)
    if drafts is not None and accepted is not None:
        return Accepted(drafts + accepted, drafts, requests)
    tokens = moved(cur.generated_total, prev.generated_total)
    steps = moved(cur.verifies_total, prev.verifies_total)
    if tokens is not None and steps is not None:
        return Accepted(tokens, steps, requests)
    return None


def counted_curve(curve: Curve, accepted: Accepted, sampling: float) -> Curve:
    """``curve`` with the acceptance ``accepted`` counted (tokens per verify step over both
    classes of request), split between greedy and sampling at the curve's own ratio and the
    mix's share at temperature > 0 (``sampling``)."""
    tau = accepted.tokens / accepted.steps
    ratio = curve.tau_sampling / curve.tau_greedy if curve.tau_greedy > 0 else 1.0
    share = min(1.0, max(0.0, sampling))
    greedy = max(1.0, tau / (1.0 - share + share * ratio))
    return curve._replace(tau_greedy=greedy, tau_sampling=max(1.0, greedy * ratio))


def mean_curve(readings: Sequence[Curve]) -> Curve:
    """The mean of readings of one shape (the newest's running cap), number by number.

    The learned acceptance is SGLang's gauge: each engine's last 40 iterations, averaged over
    the speculative engines and split by an average of the sampling share. In a trough that
    is a few requests' worth, and on simulated engines whose acceptance never changes the
    newest reading at a replacement went 2.14-2.52 (tau at temperature > 0, eagle3-chain,
    session 11), as far as what decides the day's peak: two readings of 2.18 and 2.19 in a
    row moved an all-speculative chain fleet to 3 at 1.3 h. The planner reads the keeper at
    every round anyway; the mean of the readings since the last replacement (30 rounds or
    more) is what they agree on."""
    n = len(readings)
    last = readings[-1]
    if n == 1:
        return last

    def mean(xs: Iterable[float]) -> float:
        return math.fsum(xs) / n

    return Curve(
        tuple(mean(c.spi[i] for c in readings) for i in range(len(last.spi))),
        mean(c.tau_greedy for c in readings),
        mean(c.tau_sampling for c in readings),
        mean(c.prefill_base for c in readings),
        mean(c.prefill_per_token for c in readings),
        last.cap,
    )


def curve_drift(held: Curve | None, new: Curve) -> float:
    """How far ``new`` is from ``held``: the largest relative change of any of its numbers
    (infinite when there is none held, or its shape changed: the running cap, the table's
    length)."""
    if held is None or held.cap != new.cap or len(held.spi) != len(new.spi):
        return math.inf
    pairs = [*zip(held.spi, new.spi, strict=True), (held.tau_greedy, new.tau_greedy),
             (held.tau_sampling, new.tau_sampling), (held.prefill_base, new.prefill_base),
             (held.prefill_per_token, new.prefill_per_token)]  # fmt: skip
    return max((abs(b - a) / max(abs(a), abs(b)) for a, b in pairs if a != b), default=0.0)


def holt_document(
    holt: Holt, interval: float, mix: Mix | None = None, sample: Sample | None = None
) -> dict[str, Any]:
    """The forecast's state as ``PLAN_STATE_PATH`` holds it (``spec-router fleet`` writes one
    for a router that has seen yesterday), with the mix plans were made on and how many
    requests it was read from (with their lengths' spreads)."""
    doc = holt._asdict()
    if not math.isfinite(doc["surged"]):
        doc["surged"] = None  # (none yet: JSON has no infinity)
    out: dict[str, Any] = {"format": STATE_FORMAT, "interval_s": interval, "holt": doc}
    if mix is not None:
        got = sample if sample is not None else Sample(0)
        out["mix"] = {"prompts": list(mix.prompts), "outputs": list(mix.outputs),
                      "sampling": mix.sampling, "requests": got.requests,
                      "prompt_sd": got.prompt_sd, "output_sd": got.output_sd}  # fmt: skip
    return out


def state_of(raw: Mapping[str, Any], interval: float) -> tuple[Holt | None, Mix | None, Sample]:
    """The forecast's state, the mix and its sample from ``holt_document``'s document
    (nothing when it is another format or was kept at another interval; no mix when it was
    written before the mix was kept). Raises ``KeyError`` / ``ValueError`` / ``TypeError``
    on a malformed one."""
    if raw.get("format") != STATE_FORMAT or not math.isclose(
        raw["interval_s"], interval, rel_tol=1e-6
    ):
        log.warning("the kept plan state has another format or interval: it starts afresh")
        return None, None, Sample(0)
    h = raw["holt"]
    holt = Holt(
        float(h["level"]),
        float(h["trend"]),
        float(h["var"]),
        float(h["noise"]),
        int(h["seen"]),
        float(h["scale"]),
        tuple(float(x) for x in h["history"]),
        float(h.get("burst", 0.0)),
        float(h.get("overlap", 1.0)),
        math.inf if h.get("surged") is None else float(h["surged"]),
    )  # a state written before the burst (overlap, surged) term has none
    m = raw.get("mix")
    if m is None:
        return holt, None, Sample(0)
    prompts = tuple(float(x) for x in m["prompts"])
    outputs = tuple(float(x) for x in m["outputs"])
    sampling = float(m["sampling"])
    if not prompts or not outputs or not 0.0 <= sampling <= 1.0:
        raise ValueError("a kept mix needs lengths and a share in [0, 1]")
    kept = Sample(max(0, int(m.get("requests", 0))), float(m.get("prompt_sd", 0.0)),
                  float(m.get("output_sd", 0.0)))  # fmt: skip
    return holt, Mix(prompts, outputs, sampling), kept


def _option(o: Any) -> dict[str, Any]:
    return {
        "engine": o.action.engine,
        "into": o.action.mode,
        "during": {SPECULATIVE: o.during[0], BASELINE: o.during[1]},
        "gain": round(o.gain, 6),
        "gain_upper": round(o.gain_upper, 6),
        "cost": round(o.cost, 6),
        "need_rps": _finite(o.need),
        "have_rps": _finite(o.have),
        "short": o.short,
        "blocked": o.blocked,
    }


def _finite(x: float) -> float | None:
    return round(x, 4) if math.isfinite(x) else None


def _plain(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    raise TypeError(type(x).__name__)
