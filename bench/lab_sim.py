"""The policy lab's engines and router, in-process (``bench/policy_lab.py`` and
``bench/policy_family.py`` drive them).

Engines: a discrete-event copy of the sims' continuous-batching loop (``router.sim.engine``
over ``router.sim.model``): iteration cost, prefill stalls, speculative gains drawn per request
and iteration, ``max_running``. ``tests/bench/test_lab_sim.py`` holds it to the model's closed
loop.

Router: the router's own decision shell and learning, not a copy of them: a
``router.forward.decider.Decider`` over a real ``InflightTracker`` and ``HealthRegistry``, and
a ``router.learn.keeper.CrossoverKeeper`` started from the calibrated table with the settings
``spec-router serve`` has by default, all on the lab's clock (model seconds: the table's time
scale is set to 1). A request is leased, sent, given its first byte and released as the proxy
does it (``router.forward.proxy``), and the keeper learns from its ``Outcome``; the keeper's
timer (``LEARN_INTERVAL``) also reads the engines' acceptance lengths, as the poller would.
The router-side queue (``QUEUE_SIZE``, ``QUEUE_TIMEOUT``) is imitated: an ``overflow`` decision
waits (only while its engine is measured past the relaxed SLO, ``router.forward.admission.Strain``,
unless ``measured`` is off), and is looked at again each time a request ends, oldest first, one
per release.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from router.account.inflight import InflightTracker, Lease
from router.account.outcome import Outcome
from router.decide import table as tables
from router.decide.params import DEFAULT, Params
from router.decide.policy import Decision
from router.forward.admission import Strain
from router.forward.decider import Decider
from router.forward.request import RequestInfo
from router.health.state import HealthConfig, HealthRegistry
from router.learn.keeper import CrossoverKeeper
from router.pools import BASELINE, SPECULATIVE, Pool
from router.settings import PolicyName, Settings
from router.sim.model import BASELINE as BASE_PRESET
from router.sim.model import EAGLE3, Preset, prefill_time, solve_alpha, step_time
from router.tools.traffic import Arrival
from router.upstream.stream import Usage

RESULTS = Path(__file__).resolve().parent / "results"
TABLE = RESULTS / "calibration-traffic.json"
# The calibrated table each regime's router starts from (bench/calibrate_regime.py).
TABLES = {
    "eagle3": TABLE,
    "eagle3-chain": RESULTS / "calibration-eagle3-chain.json",
    "eagle3-tree": RESULTS / "calibration-eagle3-tree.json",
}
# Seconds of model time between learning updates: the router's 5 s wall (LEARN_INTERVAL) at the
# sims' time scale 0.25, as bench/traffic.py runs them.
LEARN_INTERVAL = 20.0
# The SLO the router routes for and the runs are scored by (model seconds).
SLO = (1.0, 0.025)


@dataclass(slots=True)
class Req:
    arrival: Arrival
    pool: Pool = SPECULATIVE
    generated: int = 0
    first: float | None = None
    last: float | None = None
    rng: random.Random | None = None
    refused: bool = False  # the router's queue gave up on it
    # the router's side of it
    out: Outcome | None = None
    lease: Lease | None = None

    @property
    def done(self) -> bool:
        return self.generated >= self.arrival.output_tokens


class Engine:
    """One sim engine (``router.sim.engine.Engine``'s loop, on the lab's clock)."""

    def __init__(self, preset: Preset, url: str, seed: int) -> None:
        self.p = preset
        self.url = url
        self.running: list[Req] = []
        self.waiting: deque[Req] = deque()
        self.context = 0
        self.busy_until: float | None = None  # end of the iteration under way
        self.completed = 0
        self.started = 0
        k = preset.spec_k
        # each class's chance that a draw yields more than j tokens: a gain is 1 + the number
        # of these thresholds a uniform draw falls below (``router.sim.model.sample_gain``)
        self.thresholds = {
            s: tuple(solve_alpha(t, k) ** j for j in range(1, k + 1)) if k else ()
            for s, t in ((False, preset.tau), (True, preset.tau_sampling))
        }
        self.seed = seed
        self.spec_tokens = self.spec_steps = 0  # acceptance, as the engine reports it

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    def submit(self, req: Req, now: float) -> None:
        req.rng = random.Random(f"{self.seed}:{self.started}")
        self.started += 1
        self.waiting.append(req)
        if self.busy_until is None:
            self._start(now)

    def _start(self, now: float) -> None:
        joiners = []
        p = self.p
        while self.waiting and len(self.running) < p.max_running:
            r = self.waiting.popleft()
            self.running.append(r)
            self.context += r.arrival.prompt_tokens
            joiners.append(r)
        if not self.running:
            self.busy_until = None
            return
        d = step_time(p, len(self.running), self.context)
        d += sum(prefill_time(p, r.arrival.prompt_tokens) for r in joiners)
        self.busy_until = now + d

    def finish_iteration(self, now: float, firsts: list[Req], done: list[Req]) -> None:
        gained = 0
        finished = []
        thresholds = self.thresholds
        speculative = bool(self.p.spec_k)
        for r in self.running:
            if r.generated == 0:
                g = 1
                r.first = now
                firsts.append(r)
            elif speculative:
                assert r.rng is not None
                u = r.rng.random()
                g = 1
                for t in thresholds[r.arrival.temperature > 0]:
                    if u >= t:
                        break
                    g += 1
                self.spec_tokens += g
                self.spec_steps += 1
                g = min(g, r.arrival.output_tokens - r.generated)
            else:
                g = 1
            r.generated += g
            gained += g
            if r.generated >= r.arrival.output_tokens:
                r.last = now
                finished.append(r)
        self.context += gained
        for r in finished:
            self.completed += 1
            self.running.remove(r)
            self.context -= r.arrival.prompt_tokens + r.generated
            done.append(r)
        self._start(now)


@dataclass
class Seen:
    """What the poller would have read of an engine (``router.learn.keeper.Seen``)."""

    accept_length: float | None = None
    cap: int | None = None


class Truth:
    """The sims' own models instead of what the keeper learned (``tests.support.models``):
    ``spec`` as the speculative pool's engine, the baseline preset as the other's."""

    def __init__(self, spec: Preset) -> None:
        from tests.support.models import preset_model

        self.models = {SPECULATIVE: preset_model(spec), BASELINE: preset_model(BASE_PRESET)}


class _Told:
    """The keeper's values for the decider, with the models replaced (``Truth``)."""

    def __init__(self, keeper: CrossoverKeeper, truth: Truth) -> None:
        self.keeper = keeper
        self.models = truth.models

    @property
    def crossover(self) -> int:
        return self.keeper.crossover

    @property
    def gain(self) -> Any:
        return self.keeper.gain

    @property
    def traffic(self) -> Any:
        return self.keeper.traffic


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def lab_settings(urls: dict[Pool, list[str]], policy: PolicyName, learn: bool) -> Settings:
    """The router's settings in the lab: its pools and policy, the lab's SLO, no table file."""
    return Settings(
        speculative_urls=urls[SPECULATIVE],
        baseline_urls=urls[BASELINE],
        policy=policy,
        learn=learn,
        table_path=None,
        slo_ttft_ms=SLO[0] * 1000,
        slo_tpot_ms=SLO[1] * 1000,
    )


def lab_decider(
    settings: Settings,
    urls: dict[Pool, list[str]],
    tracker: InflightTracker,
    health: HealthRegistry,
    tuning: Any,
    clock: Clock,
    explore_share: float,
    params: Params,
) -> Decider:
    """``spec-router serve``'s decider over the lab's pools, on the lab's clock and SLO."""
    return Decider(
        urls,
        tracker,
        health,
        tuning,
        {},
        policy=settings.policy,
        hysteresis=settings.hysteresis,
        load_signal=settings.load_signal,
        clock=clock,
        explore_share=explore_share,
        explore_band=settings.explore_band,
        slo_ttft=SLO[0],
        slo_tpot=SLO[1],
        params=params,
    )


@dataclass
class Router:
    """The router around a policy: its Decider, tracker, health and keeper, on the lab's clock.

    ``table``: the calibrated table it starts from; ``learn``: learning on (as ``spec-router
    serve`` runs by default) or off; ``queue``: (size, timeout in model seconds) of the
    router-side queue, or None (off, the default)."""

    policy: PolicyName
    urls: dict[Pool, list[str]]
    table: Path = TABLE
    learn: bool = True
    queue: tuple[int, float] | None = None
    lifo: bool = False  # the queue admits its newest waiter first
    # the queue holds a request only while its engine is measured past the relaxed SLO
    measured: bool = True
    params: Params = DEFAULT
    explore_share: float | None = None  # None: the settings' default (when learning)
    truth: Truth | None = None  # the sims' models instead of the keeper's
    clock: Clock = field(default_factory=Clock)

    def __post_init__(self) -> None:
        clock = self.clock
        backends = [(pool, url) for pool, urls in self.urls.items() for url in urls]
        settings = lab_settings(self.urls, self.policy, self.learn)
        table = dataclasses.replace(tables.load(self.table), time_scale=1.0)
        self.tracker = InflightTracker(backends, clock)
        self.health = HealthRegistry([u for _, u in backends], HealthConfig(), clock())
        for _, url in backends:
            self.health.probe(url, True, clock())
        # the engines' running caps as their /server_info reports them (the poller's)
        self.seen: dict[str, Seen] = {url: Seen() for _, url in backends}
        self.keeper = CrossoverKeeper(settings, self.tracker, self.seen, table, clock)
        share = settings.explore_share if self.learn else 0.0
        tuning: Any = self.keeper if self.truth is None else _Told(self.keeper, self.truth)
        share = share if self.explore_share is None else self.explore_share
        self.decider = lab_decider(
            settings, self.urls, self.tracker, self.health, tuning, clock, share, self.params
        )
        self.next_update = LEARN_INTERVAL
        self.waiting: deque[tuple[Req, Any]] = deque()
        self.refused = 0
        self.strain = Strain(SLO[0], SLO[1], clock, self.tracker.flights)

    def request(self, a: Arrival) -> Any:
        info = RequestInfo(
            stream=True,
            max_tokens=a.output_tokens,
            temperature=a.temperature,
            prompt_tokens=a.prompt_tokens,
        )
        return self.decider.request(info)

    def route(self, r: Req, engines: dict[str, Engine]) -> None:
        """``r`` arrived now: decided and sent, or queued."""
        now = self.clock.now
        out = Outcome("/v1/chat/completions", now, stream=True)
        out.read(True, r.arrival.temperature > 0, 0)
        r.out = out
        request = self.request(r.arrival)
        out.request = request
        decision = self.decider.decide(request)
        assert decision is not None
        if decision.reason == "overflow" and self.queue is not None and self._holds(decision):
            if len(self.waiting) >= self.queue[0]:
                r.refused = True
                self.refused += 1
                return
            out.queued()
            self.waiting.append((r, request))
            return
        self._send(r, decision, engines)

    def _holds(self, decision: Decision) -> bool:
        """The queue holds it (``router.forward.admission.Admission.holds``)."""
        return not self.measured or self.strain.strained(decision.backend)

    def _send(self, r: Req, decision: Decision, engines: dict[str, Engine]) -> None:
        tracker = self.tracker
        out = r.out
        assert out is not None
        r.lease = tracker.acquire(decision.backend, out if out.request is not None else None)
        r.pool = decision.pool
        out.attempt(decision.pool, decision.backend, decision.reason, decision.load,
                    decision.prefill_share, tracker.started[decision.backend],
                    decision.prefill)  # fmt: skip
        engines[decision.backend].submit(r, self.clock.now)

    def first(self, r: Req) -> None:
        """Its first token reached the router (``Proxy._first_bytes``)."""
        out, now = r.out, self.clock.now
        assert out is not None and out.backend is not None
        tracker = self.tracker
        out.first_bytes(now, tracker.area(out.backend, now), tracker.started[out.backend])
        if out.prefill:
            tracker.prefilled(out.backend, now, out.prefill)

    def finished(self, r: Req, engines: dict[str, Engine]) -> None:
        """Its last token: the lease released (its in-flight integral taken first, as
        ``Proxy.release`` takes it), the outcome observed, a queued request looked at."""
        out, lease = r.out, r.lease
        assert out is not None and lease is not None
        out.answered(200)
        out.counted(Usage(r.arrival.prompt_tokens, r.arrival.output_tokens))
        now = self.clock.now
        out.finish(now)
        # (without it the keeper makes no decode or concurrency sample: the lab learned
        # nothing of the curves from 1df2b2f to 42904a5)
        out.lease_ends(now, self.tracker.area(lease.backend, now))
        lease.release()
        self.keeper.observe(out)
        self.strain.observe(out)
        self._admit(engines)

    def _admit(self, engines: dict[str, Engine]) -> None:
        """One queued request looked at (the oldest within its deadline), as a release wakes
        one waiter of ``router.forward.admission``."""
        if self.queue is None:
            return
        timeout = self.queue[1]
        now = self.clock.now
        while self.waiting and now - self.waiting[0][0].arrival.at > timeout:
            r, _ = self.waiting.popleft()
            r.refused = True
            self.refused += 1
        if not self.waiting:
            return
        r, request = self.waiting[-1] if self.lifo else self.waiting[0]
        peek = self.decider.peek(request)
        if peek is None or (peek.reason == "overflow" and self._holds(peek)):
            return
        if self.lifo:
            self.waiting.pop()
        else:
            self.waiting.popleft()
        decision = self.decider.decide(request)
        assert decision is not None
        self._send(r, decision, engines)

    def tick(self, engines: Sequence[Engine]) -> None:
        """The keeper's timer: the engines' acceptance lengths as scraped, one learning step,
        the decider's surface (``router.lifecycle.keep_learning``)."""
        now = self.clock.now
        if now < self.next_update:
            return
        self.next_update = now + LEARN_INTERVAL
        for e in engines:
            seen = self.seen[e.url]
            seen.cap = e.p.max_running
            if e.p.spec_k and e.spec_steps:
                seen.accept_length = e.spec_tokens / e.spec_steps
                e.spec_tokens = e.spec_steps = 0
        self.keeper.update()
        self.decider.refresh()


class Busy(Protocol):
    busy_until: float | None


B = TypeVar("B", bound=Busy)


def next_due(engines: Sequence[B], until: float) -> tuple[B | None, float]:
    """The engine whose iteration under way ends first, at or before ``until``, and when
    (None and ``until``: none does)."""
    nxt = None
    at = until
    for e in engines:
        b = e.busy_until
        if b is not None and b <= at:
            nxt, at = e, b
    return nxt, at


def engines_for(
    presets: Sequence[Preset], pools: Sequence[Pool], seed: int
) -> tuple[list[Engine], dict[Pool, list[str]]]:
    engines = [Engine(p, f"http://e{i}", seed + i) for i, p in enumerate(presets)]
    urls: dict[Pool, list[str]] = {SPECULATIVE: [], BASELINE: []}
    for e, pool in zip(engines, pools, strict=True):
        urls[pool].append(e.url)
    return engines, urls


def run(
    arrivals: Sequence[Arrival],
    make_router: Callable[[dict[Pool, list[str]]], Router],
    seed: int = 0,
    presets: Sequence[Preset] = (EAGLE3, BASE_PRESET),
    pools: Sequence[Pool] = (SPECULATIVE, BASELINE),
    on_decision: Callable[[Req], None] | None = None,
    drain: float = math.inf,
) -> list[Req]:
    """Every arrival routed by the router ``make_router`` builds over fresh engines, until the
    last one finishes (or is refused), or ``drain`` after the last arrival; every request,
    finished or not."""
    engines, urls = engines_for(presets, pools, seed)
    router = make_router(urls)
    by_url = {e.url: e for e in engines}
    clock = router.clock
    reqs: list[Req] = []
    firsts: list[Req] = []
    done: list[Req] = []

    def advance(until: float) -> None:
        while True:
            nxt, at = next_due(engines, until)
            if nxt is None:
                return
            clock.now = at
            router.tick(engines)
            nxt.finish_iteration(at, firsts, done)
            for r in firsts:
                router.first(r)
            firsts.clear()
            for r in done:
                router.finished(r, by_url)
            done.clear()

    for a in arrivals:
        advance(a.at)
        clock.now = a.at
        router.tick(engines)
        r = Req(a)
        reqs.append(r)
        router.route(r, by_url)
        if on_decision is not None:
            on_decision(r)
    advance((arrivals[-1].at if arrivals else 0.0) + drain)
    return reqs


def run_closed(
    users: int,
    prompt_tokens: int,
    output_tokens: int,
    duration: float,
    make_router: Callable[[dict[Pool, list[str]]], Router],
    seed: int = 0,
    temperature: float = 0.0,
    presets: Sequence[Preset] = (EAGLE3, BASE_PRESET),
    pools: Sequence[Pool] = (SPECULATIVE, BASELINE),
) -> list[Req]:
    """A closed loop: ``users`` clients that each send the next request the moment the last one
    ends (all starting together, as the demo's), for ``duration`` model seconds; every request
    sent by then."""
    engines, urls = engines_for(presets, pools, seed)
    router = make_router(urls)
    by_url = {e.url: e for e in engines}
    clock = router.clock
    reqs: list[Req] = []
    firsts: list[Req] = []
    done: list[Req] = []
    due = [0.0] * users  # each user's next arrival, in order of time

    while True:
        nxt: Engine | None = None
        at = due[0] if due else math.inf
        for e in engines:
            b = e.busy_until
            if b is not None and b <= at:
                nxt, at = e, b
        if at > duration:
            return reqs
        clock.now = at
        router.tick(engines)
        if nxt is not None:
            nxt.finish_iteration(at, firsts, done)
            for r in firsts:
                router.first(r)
            firsts.clear()
            for r in done:
                router.finished(r, by_url)
                due.append(at)
            done.clear()
            due.sort()
            continue
        due.pop(0)
        r = Req(Arrival(at, prompt_tokens, output_tokens, temperature))
        reqs.append(r)
        router.route(r, by_url)
