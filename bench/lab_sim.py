"""The policy lab's engines and router, in-process (``bench/policy_lab.py`` drives them).

Engines: a discrete-event copy of the sims' continuous-batching loop (``router.sim.engine``
over ``router.sim.model``): iteration cost, prefill stalls, speculative gains, ``max_running``.

Router: the decision shell of ``router.forward.decider.Decider`` as HTTP runs it, imitated on
the lab's clock: loads are the requests in flight per engine (the router's ``local`` signal),
the prefill share and the Little's-law expected load over ``RECENT_WINDOW``, the crossover and
the curves from the calibrated table, kept current by learning from finished requests as
``router.learn.keeper`` does (samples into ``Learner`` and ``EngineModels``, republished
every ``LEARN_INTERVAL``), and the same exploration near the crossover. ``Router(models=...)``
can instead hand the policies the sims' true models (``tests.support.models``), to tell what
the policy gets wrong from what the router's knowledge does.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from router.account.inflight import PrefillLog
from router.decide import table as tables
from router.decide.policy import (
    BackendView,
    Decision,
    PoolView,
    RoutingState,
    Snapshot,
    choose,
    explore,
)
from router.decide.predict import PoolModel, Request
from router.decide.snapshot import RECENT_WINDOW, Mix, flight
from router.decide.snapshot import Recent as _DeciderRecent
from router.decide.twin import Flight, Stream
from router.learn.learner import Held, LearnConfig, Learner, marginal_gain
from router.learn.models import EngineModels, Sample
from router.pools import BASELINE, SPECULATIVE, Pool
from router.sim.model import BASELINE as BASE_PRESET
from router.sim.model import EAGLE3, Preset, prefill_time, sample_gain, solve_alpha, step_time
from router.tools.traffic import Arrival

# As the router's settings default: seconds of model time between learning updates (the
# router's 5 s wall at the sims' time scale 0.25), exploration share and band.
LEARN_INTERVAL = 20.0
EXPLORE_SHARE, EXPLORE_BAND = 0.02, 2


@dataclass
class Req:
    arrival: Arrival
    pool: Pool = SPECULATIVE
    generated: int = 0
    first: float | None = None
    last: float | None = None
    rng: random.Random = field(default_factory=random.Random)
    # what the router saw when it routed it, and the backend's in-flight area at its first token
    request: Request | None = None
    load_at_start: int = 0
    prefill_share: float = 0.0
    area_first: float = 0.0
    prefill: float = 0.0  # its prefill as the router estimated it (Decision.prefill)

    @property
    def done(self) -> bool:
        return self.generated >= self.arrival.output_tokens

    # what the router's Decider reads of a request in flight (router.account.outcome.Outcome)
    stream = True

    @property
    def started(self) -> float:
        return self.arrival.at

    @property
    def first_byte(self) -> float | None:
        return self.first


class Engine:
    def __init__(self, preset: Preset, url: str, seed: int) -> None:
        self.p = preset
        self.url = url
        self.running: list[Req] = []
        self.waiting: deque[Req] = deque()
        self.context = 0
        self.busy_until: float | None = None  # end of the iteration under way
        self.joiners: list[Req] = []
        self.completed = 0
        self.started = 0
        self.alpha = {
            False: solve_alpha(preset.tau, preset.spec_k),
            True: solve_alpha(preset.tau_sampling, preset.spec_k),
        }
        self.seed = seed
        self._area, self._area_at = 0.0, 0.0  # integral of the load over time
        self.spec_tokens = self.spec_steps = 0  # acceptance, as the engine reports it
        # the router's estimate of each prefill here, by its first token (InflightTracker's)
        self.prefilled = PrefillLog()

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    def area(self, now: float) -> float:
        return self._area + self.load * (now - self._area_at)

    def _moved(self, now: float) -> None:
        self._area, self._area_at = self.area(now), now

    def submit(self, req: Req, now: float) -> None:
        self._moved(now)
        req.rng = random.Random(f"{self.seed}:{self.started}")
        self.started += 1
        self.waiting.append(req)
        if self.busy_until is None:
            self._start(now)

    def _start(self, now: float) -> None:
        self.joiners = []
        while self.waiting and len(self.running) < self.p.max_running:
            r = self.waiting.popleft()
            self.running.append(r)
            self.context += r.arrival.prompt_tokens
            self.joiners.append(r)
        if not self.running:
            self.busy_until = None
            return
        d = step_time(self.p, len(self.running), self.context)
        d += sum(prefill_time(self.p, r.arrival.prompt_tokens) for r in self.joiners)
        self.busy_until = now + d

    def finish_iteration(self, now: float, done: list[Req]) -> None:
        k = self.p.spec_k
        gained = 0
        for r in self.running:
            if r.generated == 0:
                g = 1
                r.first = now
                r.area_first = self.area(now)
                if r.prefill:
                    self.prefilled.add(now, r.prefill)
            else:
                g = 1
                if k:
                    g = sample_gain(self.alpha[r.arrival.temperature > 0], k, r.rng.random())
                    self.spec_tokens += g
                    self.spec_steps += 1
                g = min(g, r.arrival.output_tokens - r.generated)
            r.generated += g
            gained += g
            if r.done:
                r.last = now
        self.context += gained
        finished = [r for r in self.running if r.done]
        if finished:
            self._moved(now)
        for r in finished:
            self.completed += 1
            self.running.remove(r)
            self.context -= r.arrival.prompt_tokens + r.generated
            done.append(r)
        self._start(now)


TABLE = Path(__file__).resolve().parent / "results" / "calibration-traffic.json"


def true_models(spec: Preset = EAGLE3) -> dict[Pool, PoolModel]:
    from tests.support.models import preset_model

    return {SPECULATIVE: preset_model(spec), BASELINE: preset_model(BASE_PRESET)}


class Router:
    """What the router knows and does around a policy (see the module's docstring).

    ``models``: "learn" (the calibrated table, learning on: as ``bench/traffic.py`` runs the
    router), "table" (the table, no learning) or "truth" (the sims' own models, no learning:
    ``spec``'s and the baseline's).
    """

    def __init__(
        self,
        policy: str,
        models: str = "learn",
        table: Path = TABLE,
        slo: tuple[float, float] = (1.0, 0.025),
        explore_share: float = EXPLORE_SHARE,
        spec: Preset = EAGLE3,
    ) -> None:
        self.policy = policy
        self.mode = models
        # the lab runs in model time (the table's time scale is that of the sims it measured)
        t = dataclasses.replace(tables.load(table), time_scale=1.0)
        self.learner = Learner(LearnConfig(), t)
        self.engines = EngineModels(t)
        self.held = Held(t.limit, t.crossover is None)
        self.gain = marginal_gain(self.learner.curves())
        self.models: Mapping[Pool, PoolModel] | None = (
            true_models(spec) if models == "truth" else self.engines.models()
        )
        self.slo = slo
        self.explore_share = explore_share
        self.credit = 0.0
        self.state = RoutingState()
        self.recent: dict[str, _DeciderRecent] = {}
        self.mix = Mix()
        self.caps: dict[str, int] = {}  # as the poller learns them: once a queue is seen
        self.last_request: Request | None = None
        self.next_update = LEARN_INTERVAL

    # -- deciding -------------------------------------------------------------------------------
    def _view(self, pool: Pool, e: Engine, now: float) -> BackendView:
        r = self.recent.setdefault(e.url, _DeciderRecent(0.0))
        r.update(now, RECENT_WINDOW, e.area(now), e.completed)
        flights: tuple[Flight, ...] = ()
        stream = None
        if self.policy == "slo" and self.models is not None:
            model = self.models[pool]
            flights = tuple(flight(q, now, model) for q in (*e.running, *e.waiting))
            rate = r.rate(now, RECENT_WINDOW)
            output = self.mix.output or self.engines.mean_output.value
            stream = Stream(rate, self.mix.prompt, output, self.mix.sampling, *self.slo)
        return BackendView(e.url, e.load, prefill_share=r.prefill / RECENT_WINDOW,
                           load_avg=r.expected(RECENT_WINDOW), cap=self.caps.get(e.url),
                           flights=flights, stream=stream)  # fmt: skip

    def decide(self, a: Arrival, engines: Sequence[Engine], pools: Sequence[Pool], now: float
               ) -> Decision:  # fmt: skip
        req = None
        if self.policy == "slo":
            out = a.output_tokens
            req = Request(a.prompt_tokens, out, a.temperature > 0, *self.slo)
        pairs = list(zip(pools, engines, strict=True))
        spec = [self._view(p, e, now) for p, e in pairs if p == SPECULATIVE]
        base = [self._view(p, e, now) for p, e in pairs if p == BASELINE]
        snap = Snapshot(
            PoolView(SPECULATIVE, tuple(spec)),
            PoolView(BASELINE, tuple(base)),
            self.held.value,
            1,
            self.state,
            self.gain,
            req,
            self.models if req is not None else None,
            self.engines.mean_output.value,
            self.mix.sampling,
            self.held.no_crossover,
        )
        decision, self.state = choose(self.policy, snap)
        assert decision is not None
        self.last_request = req
        if self.explore_share > 0 and self.policy != "round_robin":
            if abs(snap.speculative.load - snap.crossover) <= EXPLORE_BAND:
                self.credit += self.explore_share
                if self.credit >= 1.0:
                    alt = explore(snap, decision)
                    if alt is not None:
                        self.credit -= 1.0
                        decision = alt
        if req is not None and self.models is not None:
            self.mix.add(req)
            prefill = self.models[decision.pool].prefill(a.prompt_tokens)
            self.recent[decision.backend].sent(prefill)
            view = next(b for b in (*spec, *base) if b.url == decision.backend)
            decision = decision._replace(load=view.load, prefill_share=view.prefill_share,
                                         prefill=prefill)  # fmt: skip
        return decision

    # -- learning -------------------------------------------------------------------------------
    def finished(self, r: Req, engine: Engine) -> None:
        """A finished request becomes a learning sample, as ``Keeper.observe`` makes it."""
        if self.mode != "learn" or r.first is None or r.last is None:
            return
        n = r.arrival.output_tokens
        decode = r.last - r.first
        concurrency = spt = 0.0
        if n >= 2 and decode > 0:
            concurrency = (engine.area(r.last) - r.area_first) / decode
            spt = decode / (n - 1)
            self.learner.record(r.pool, concurrency, spt, r.first - r.arrival.at,
                                r.last - r.arrival.at)  # fmt: skip
        cap = self.caps.get(engine.url)
        if cap is not None:
            concurrency = min(concurrency, float(cap))
        stall = engine.prefilled.stalls(r.first, spt, r.last)
        sample = Sample(r.pool, concurrency, spt, r.first - r.arrival.at,
                        r.arrival.temperature > 0, r.arrival.prompt_tokens, 0, n,
                        r.load_at_start, r.prefill_share, stall)  # fmt: skip
        self.engines.record(sample)

    def tick(self, now: float, engines: Sequence[Engine]) -> None:
        """The keeper's timer: the acceptance length, the crossover step, the models."""
        if self.mode != "learn" or now < self.next_update:
            return
        self.next_update = now + LEARN_INTERVAL
        spec = [e for e in engines if e.p.spec_k and e.spec_steps]
        tau = sum(e.spec_tokens / e.spec_steps for e in spec) / len(spec) if spec else None
        for e in spec:
            e.spec_tokens = e.spec_steps = 0
        self.learner.observe_accept(tau)
        self.engines.observe_accept(tau)
        self.gain = marginal_gain(self.learner.curves())
        self.models = self.engines.models()
        new = self.learner.step(self.held, False)
        if new is not None:
            self.held = new


def _route(router: Router, a: Arrival, engines: Sequence[Engine], pools: tuple[Pool, Pool],
           pool_of: Mapping[str, Pool]) -> Decision:  # fmt: skip
    """``a`` routed by ``router`` and submitted to the engine it chose."""
    router.tick(a.at, engines)
    decision = router.decide(a, engines, pools, a.at)
    req = Req(a, pool_of[decision.backend], request=getattr(router, "last_request", None),
              load_at_start=decision.load, prefill_share=decision.prefill_share,
              prefill=decision.prefill)  # fmt: skip
    next(e for e in engines if e.url == decision.backend).submit(req, a.at)
    return decision


def run(
    arrivals: Sequence[Arrival],
    router: Router,
    seed: int = 0,
    presets: tuple[Preset, Preset] = (EAGLE3, BASE_PRESET),
    pools: tuple[Pool, Pool] = (SPECULATIVE, BASELINE),
    on_decision: Callable[[Decision, Arrival], None] | None = None,
) -> list[Req]:
    """Every arrival routed by ``router`` onto fresh engines, until the last one finishes."""
    engines = [Engine(p, f"e{i}", seed + i) for i, p in enumerate(presets)]
    pool_of = {e.url: pools[i] for i, e in enumerate(engines)}
    done: list[Req] = []

    def advance(until: float) -> None:
        while True:
            busy = [e for e in engines if e.busy_until is not None and e.busy_until <= until]
            if not busy:
                return
            nxt = min(busy, key=lambda e: e.busy_until or 0.0)
            assert nxt.busy_until is not None
            before = len(done)
            nxt.finish_iteration(nxt.busy_until, done)
            for r in done[before:]:
                router.finished(r, nxt)

    for a in arrivals:
        advance(a.at)
        decision = _route(router, a, engines, pools, pool_of)
        if on_decision is not None:
            on_decision(decision, a)
    advance(math.inf)
    return done


def run_closed(
    users: int,
    prompt_tokens: int,
    output_tokens: int,
    duration: float,
    router: Router,
    seed: int = 0,
    temperature: float = 0.0,
    presets: tuple[Preset, Preset] = (EAGLE3, BASE_PRESET),
    pools: tuple[Pool, Pool] = (SPECULATIVE, BASELINE),
) -> tuple[list[Req], list[Arrival]]:
    """A closed loop: ``users`` clients that each send the next request the moment the last one
    ends (all starting together, as the demo's), for ``duration`` model seconds; the requests
    that finished by then, and every arrival."""
    engines = [Engine(p, f"e{i}", seed + i) for i, p in enumerate(presets)]
    pool_of = {e.url: pools[i] for i, e in enumerate(engines)}
    done: list[Req] = []
    arrivals: list[Arrival] = []
    due = [0.0] * users  # each user's next arrival, in order of time
    while True:
        busy = [e for e in engines if e.busy_until is not None]
        nxt = min(busy, key=lambda e: e.busy_until or 0.0) if busy else None
        at = due[0] if due else math.inf
        if nxt is not None and (nxt.busy_until or 0.0) <= at:
            now = nxt.busy_until or 0.0
            if now > duration:
                return done, arrivals
            before = len(done)
            nxt.finish_iteration(now, done)
            for r in done[before:]:
                router.finished(r, nxt)
                bisect.insort(due, now)
            continue
        if at > duration:
            return done, arrivals
        due.pop(0)
        a = Arrival(at, prompt_tokens, output_tokens, temperature)
        arrivals.append(a)
        _route(router, a, engines, pools, pool_of)
