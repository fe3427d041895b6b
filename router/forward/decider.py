"""The decision shell: turns live state into a policy ``Snapshot`` and keeps the policy's memory.

It owns only what the policies remember between requests (round-robin position, hysteresis,
exploration credit), the mix of the requests it routed, and the ``slo`` policy's decision
surface (``router.decide.capacity``), which it recomputes off the hot path: when the keeper's
models change and on the keeper's timer (``refresh``), never per request. Everything else it
reads, through the interfaces of its owners: in-flight counts from the tracker, health from the
registry, engine loads from the poller, the crossover and the curves from the keeper.

Reading changes nothing: ``snapshot``, ``peek`` and ``status`` leave what the next decision sees
as it was; only ``decide`` (a request routed) and ``refresh`` (the timer) move it.

Load signals (``LOAD_SIGNAL``):
- ``local``: this router's own in-flight count per backend (under ``serve --workers N``, the
  sum over its workers: ``router.account.shared``), plus the requests whose client left that
  the engine is still running (SGLang aborts them 2-4 s later: ``ENGINE_ABORT_LAG``). Exact
  and instant, but blind to other router replicas in front of the same engines.
- ``engine``: the engine's reported running + queued requests at the last scrape, plus the
  requests this replica sent there since that scrape -- since ``ENGINE_GAUGE_LAG`` before it
  for SGLang, whose gauges lag (router.health.poller.EngineLoad). Replicas agree (they read
  the same engine) at the cost of that lag for the requests of other replicas.
- ``max``: the larger of the two, the conservative choice.

Pools may change while the router runs (backends added or removed): every decision reads
``pools`` as it is, and what is kept per backend is looked up by URL.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from router.account.inflight import InflightTracker
from router.decide.capacity import (
    RELAXED_TPOT,
    RELAXED_TTFT,
    Mix,
    Slo,
    Steps,
    Surface,
    finish,
    surface_steps,
)
from router.decide.params import DEFAULT, Params
from router.decide.policy import (
    BackendView,
    Decision,
    PoolView,
    RoutingState,
    Snapshot,
    choose,
    explore,
    reroute,
)
from router.decide.predict import PoolModel, Request
from router.decide.snapshot import LATELY, OFFERED_WINDOW, RecentMix, RecentRate, Tuning
from router.forward.request import RequestInfo
from router.health.poller import EngineLoad
from router.health.state import HealthRegistry
from router.pools import BASELINE, POOLS, SPECULATIVE, Pool, other
from router.settings import LoadSignal, PolicyName

# The arrival rates the surfaces are computed for: powers of this (25% apart), from MIN_RATE
# requests per second per engine (model time).
RATE_STEP = 1.25
MIN_RATE = 0.01
_LOG_STEP = math.log(RATE_STEP)  # (the same float ``math.log(RATE_STEP)`` gives every time)


_new = tuple.__new__  # (a named tuple built as a tuple, on the hot path: see ``snapshot``)


def _distance(a: int | None, b: int | None) -> float:
    """How far apart two rate buckets are (None: the steady state's, as far as any)."""
    if a is None or b is None:
        return 0.0 if a is b else math.inf
    return abs(a - b)


# Surfaces computed at one tick of the keeper's timer, at most (each takes milliseconds).
PER_REFRESH = 3


# how a surface is computed (``surface_steps``; a test passes one that counts its calls: a
# compiled module's globals cannot be patched)
SurfaceSteps = Callable[[Mapping[Pool, PoolModel], Mix, Slo, Params, float | None], Steps[Surface]]


class SurfaceJob(NamedTuple):
    """Surfaces to compute, and everything they are computed from (plain values: computing
    them touches nothing of the decider, so it may run while decisions go on)."""

    models: Mapping[Pool, PoolModel]
    mix: Mix
    slo: Slo
    params: Params
    buckets: tuple[int | None, ...]
    surfaces: SurfaceSteps = surface_steps

    def compute(self) -> dict[int | None, Surface]:
        return finish(self.steps())

    def steps(self) -> Steps[dict[int | None, Surface]]:
        """``compute`` in steps (``router.decide.capacity.surface_steps``)."""
        found: dict[int | None, Surface] = {}
        for b in self.buckets:
            found[b] = yield from self.surfaces(
                self.models, self.mix, self.slo, self.params, None if b is None else RATE_STEP**b
            )
        return found


class _Backends:
    """One pool's backends as the last snapshot saw them: their views (reused while a
    backend's load, health and weight stay as they were), valid until health moves, the pool
    changes, or the clock reaches ``until``."""

    __slots__ = ("urls", "count", "version", "until", "views", "loads", "pool")

    def __init__(
        self, urls: Sequence[str], version: int, until: float, views: list[BackendView],
        loads: list[int], pool: PoolView,
    ) -> None:  # fmt: skip
        self.urls = urls
        self.count = len(urls)
        self.version = version
        self.until = until
        self.views = views
        self.loads = loads  # as of ``pool``
        self.pool = pool


class Decider:
    def __init__(
        self,
        pools: Mapping[Pool, Sequence[str]],
        tracker: InflightTracker,
        health: HealthRegistry,
        tuning: Tuning,
        loads: Mapping[str, EngineLoad],
        policy: PolicyName,
        hysteresis: int,
        load_signal: LoadSignal = "local",
        clock: Callable[[], float] = time.monotonic,
        explore_share: float = 0.0,
        explore_band: int = 2,
        slo_ttft: float = 1.0,
        slo_tpot: float = 0.025,
        params: Params = DEFAULT,
        surfaces: SurfaceSteps = surface_steps,
    ) -> None:
        self.pools = pools
        self.tracker = tracker
        self.health = health
        self.tuning = tuning
        self.loads = loads
        self.policy: PolicyName = policy
        self.hysteresis = hysteresis
        self.load_signal: LoadSignal = load_signal
        self.clock = clock
        self.explore_share = explore_share
        self.explore_band = explore_band
        self.slo_ttft = slo_ttft  # seconds, wall clock
        self.slo_tpot = slo_tpot
        self.params = params
        self._surface_steps = surfaces
        self._state = RoutingState()
        self._explore_credit = 0.0
        self._mix = RecentMix()  # recent requests' prompt sizes and share at temperature > 0
        self._arrivals: RecentRate | None = None  # requests routed per second lately
        self._recent: dict[str, RecentRate] = {}  # ... to each backend (by URL)
        # the slo policy's surfaces by arrival rate (``_bucket``), of these models and mix
        self._surfaces: dict[int | None, Surface] = {}
        self._surface_from: Mapping[Pool, PoolModel] | None = None
        self._shape: tuple[Mix, Slo] | None = None
        # surfaces of an earlier mix not yet recomputed, and the buckets decisions asked for
        # since the last refresh that had none
        self._stale: dict[int | None, Surface] = {}
        self._wanted: set[int | None] = set()
        # the nearest surface known for each bucket asked for that has none (``_surface_at``),
        # kept until ``_surfaces`` or ``_stale`` change (``_known_changed``)
        self._nearest: dict[int | None, Surface] = {}
        self._backends: dict[Pool, _Backends] = {}
        self.extrapolated = 0  # decisions that predicted beyond the measured batch sizes

    @property
    def deciding_as(self) -> PolicyName:
        """The policy that decides now: ``slo`` without the pools' models (no table, nothing
        learned yet) and ``predictive`` without curves decide as ``spillover``
        (``router.decide.policy``). Shown in /router/status, on the live page and, when it is
        not the configured policy, in each response's ``x-spec-router-deciding-as``."""
        if self.policy == "slo" and self.tuning.models is None:
            return "spillover"
        if self.policy == "predictive" and self.tuning.gain is None:
            return "spillover"
        return self.policy

    def members_changed(self, joined: Iterable[str], removed: Iterable[str]) -> None:
        """The set of backends changed (``router.members.roster``; ``self.pools`` holds the
        routable ones, updated in place): what it keeps per backend ends with them, and the
        pools' views are built afresh (a joined backend's rate starts with its first
        request)."""
        for url in removed:
            self._recent.pop(url, None)
        del joined  # (nothing kept for a backend before its first request)
        self._backends.clear()

    # -- loads ----------------------------------------------------------------------------------
    def backend_load(self, url: str) -> int:
        local = self.tracker.by_backend[url] + self.tracker.lingering(url, self.clock())
        if self.load_signal == "local":
            return local
        seen = self.loads.get(url)
        if seen is None:
            return local
        engine = seen.running + seen.queued + (self.tracker.started[url] - seen.started_at_scrape)
        return engine if self.load_signal == "engine" else max(local, engine)

    def _loads(self, urls: Sequence[str], now: float) -> list[int]:
        tracker = self.tracker
        if self.load_signal != "local":
            return [self.backend_load(url) for url in urls]
        by = tracker.by_backend
        if not tracker.lingered:
            # (the hot path: one pass over the pool's backends, in C rather than Python)
            return list(map(by.__getitem__, urls))
        return [by[url] + tracker.lingering(url, now) for url in urls]

    def _view(self, name: Pool, now: float) -> PoolView:
        urls = self.pools[name]
        health = self.health
        kept = self._backends.get(name)
        tracker = self.tracker
        if self.load_signal == "local" and not tracker.lingered:
            loads = list(map(tracker.by_backend.__getitem__, urls))  # (``_loads``' hot path)
        else:
            loads = self._loads(urls, now)
        if (
            kept is None
            or kept.urls is not urls
            or kept.count != len(urls)
            or kept.version != health.version
            or now >= kept.until
        ):
            until = min((health.changes_at(url, now) for url in urls), default=math.inf)
            views = [
                BackendView(url, load, health.usable(url, now), health.weight(url, now))
                for url, load in zip(urls, loads, strict=True)
            ]
            even = all(v.usable and v.weight >= 1.0 for v in views)
            pool = PoolView(name, tuple(views), even, loads)
            # (a cache of what the states and the clock say: rebuilding it moves nothing)
            self._backends[name] = _Backends(urls, health.version, until, views, loads, pool)
            return pool
        if loads == kept.loads:
            return kept.pool
        views = kept.views
        for i, (load, was) in enumerate(zip(loads, kept.loads, strict=True)):
            if load != was:
                view = views[i]
                views[i] = BackendView(view.url, load, view.usable, view.weight)
        kept.loads = loads
        # (built directly: ``_replace`` costs several times more, on every decision)
        pool = kept.pool
        kept.pool = pool = PoolView(pool.name, tuple(views), pool.even, loads)
        return pool

    # -- the decision surface -------------------------------------------------------------------
    def refresh(self) -> None:
        """Take the keeper's models and the mix of the requests routed so far, and compute the
        slo policy's surfaces that decisions will want (``pending``) here and now (the lab's
        timer; the router's computes them in steps between requests:
        ``router.lifecycle.keep_learning``)."""
        job = self.pending()
        if job is not None:
            self.install(job, job.compute())

    def pending(self) -> SurfaceJob | None:
        """The surfaces to compute at this tick of the keeper's timer: the one for the arrival
        rate lately, then those decisions asked for since the last tick, nearest first, at
        most ``PER_REFRESH`` (the rest wait for the next tick). None: no curves."""
        models = self.tuning.models
        if models is None:
            self._surfaces.clear()
            self._stale.clear()
            self._nearest.clear()
            self._wanted.clear()
            self._surface_from, self._shape = None, None
            return None
        now = self.clock()
        current = self._bucket(self._usable_engines(now), self._offered(now))
        shape = self._mix_now(models)
        if models is not self._surface_from and (self._surfaces or self._stale):
            # the keeper's timer moved the models: until this job's surfaces are installed,
            # decisions take the nearest one of the models before (stale), not one computed
            # on the hot path
            self._stale = {**self._stale, **self._surfaces}
            self._surfaces = {}
            self._nearest.clear()
            self._surface_from, self._shape = models, shape
        fresh = models is self._surface_from and shape == self._shape
        asked = sorted(
            (b for b in self._wanted if not (fresh and b in self._surfaces)),
            key=lambda b: _distance(b, current),
        )
        buckets = [current, *(b for b in asked if b != current)][:PER_REFRESH]
        return SurfaceJob(
            models, shape[0], shape[1], self.params, tuple(buckets), self._surface_steps
        )

    def install(self, job: SurfaceJob, computed: Mapping[int | None, Surface]) -> None:
        """What ``job.compute()`` gave, unless the models changed meanwhile. Surfaces kept of
        an earlier mix stay as the nearest guess for their buckets until asked for again."""
        if job.models is not self.tuning.models:
            return
        shape = (job.mix, job.slo)
        if job.models is not self._surface_from or shape != self._shape:
            self._stale = {**self._stale, **self._surfaces}
            self._surfaces = {}
            self._surface_from, self._shape = job.models, shape
        self._nearest.clear()
        for bucket, found in computed.items():
            self._surfaces[bucket] = found
            self._stale.pop(bucket, None)
            self._wanted.discard(bucket)

    def _mix_now(self, models: Mapping[Pool, PoolModel]) -> tuple[Mix, Slo]:
        scale = models[SPECULATIVE].scale
        mix = self._mix
        traffic = self.tuning.traffic
        prompt = mix.prompt if mix.seen else Mix().prompt
        shape = Mix(prompt, traffic.mean_output, mix.sampling, traffic.output_spread)
        return shape, Slo(self.slo_ttft / scale, self.slo_tpot / scale)

    def _bucket(self, engines: int, offered: float | None) -> int | None:
        """Which surface applies: the requests reaching one engine per second lately (model
        time, ``offered``: ``_offered``), to the nearest power of ``RATE_STEP`` (None: nothing
        routed yet)."""
        if offered is None:
            return None
        # (``max(MIN_RATE, offered / max(1, engines))``, without the calls)
        per_engine = offered / (engines if engines > 1 else 1)
        if not per_engine > MIN_RATE:
            per_engine = MIN_RATE
        return round(math.log(per_engine) / _LOG_STEP)

    def _compute(self, bucket: int | None) -> Surface:
        models, shape = self._surface_from, self._shape
        assert models is not None and shape is not None
        job = SurfaceJob(models, shape[0], shape[1], self.params, (bucket,), self._surface_steps)
        found = self._surfaces[bucket] = job.compute()[bucket]
        self._nearest.clear()
        return found

    def _surface_at(self, bucket: int | None) -> Surface | None:
        """The surface for ``bucket``: as computed at the last refresh; else the nearest one
        known (the bucket is computed at the next refresh); computed here only when none is
        known for these models (the first decision after they came, before any refresh)."""
        models = self.tuning.models
        if models is None:
            return None
        if models is not self._surface_from:  # new models since the last refresh
            self._surfaces.clear()
            self._stale = {}
            self._nearest.clear()
            self._surface_from = models
            self._shape = self._mix_now(models)
        found = self._surfaces.get(bucket)
        if found is not None:
            return found
        found = self._nearest.get(bucket)
        if found is None:
            known = self._surfaces or self._stale
            if not known:
                return self._compute(bucket)
            found = known[min(known, key=lambda b: _distance(b, bucket))]
            self._nearest[bucket] = found
        self._wanted.add(bucket)
        return found

    def surface(self) -> Surface | None:
        """The surface the next decision would use."""
        now = self.clock()
        return self._surface_at(self._bucket(self._usable_engines(now), self._offered(now)))

    def _usable_engines(self, now: float) -> int:
        health = self.health
        return sum(1 for urls in self.pools.values() for url in urls if health.usable(url, now))

    # -- deciding -------------------------------------------------------------------------------
    def snapshot(self, request: Request | None = None) -> Snapshot:
        now = self.clock()
        tuning = self.tuning
        spec, base = self._view(SPECULATIVE, now), self._view(BASELINE, now)
        surf = None
        models, arrivals = tuning.models, self._arrivals  # (``_offered``, written out)
        offered = (
            None
            if models is None or arrivals is None
            else arrivals.rate(now) * models[SPECULATIVE].scale
        )
        if request is not None:
            # (``usable_count``, without the calls while every backend is usable)
            engines = (len(spec.backends) if spec.even else spec.usable_count()) + (
                len(base.backends) if base.even else base.usable_count()
            )
            surf = self._surface_at(self._bucket(engines, offered))
        # (built as a tuple: a third of what the named tuple's constructor costs)
        return _new(
            Snapshot,
            (
                spec,
                base,
                tuning.crossover,
                self.hysteresis,
                self._state,
                tuning.gain,
                request,
                surf,
                offered,
                self._recent,
                now,
                tuning.no_crossover,
            ),
        )

    def _offered(self, now: float) -> float | None:
        """Requests routed per second lately, in the models' time (None: no models yet, or
        nothing routed)."""
        models, arrivals = self.tuning.models, self._arrivals
        if models is None or arrivals is None:
            return None
        return arrivals.rate(now) * models[SPECULATIVE].scale

    def request(
        self, info: RequestInfo, slo_ttft: float | None = None, slo_tpot: float | None = None
    ) -> Request | None:
        """What the ``slo`` policy needs to know of a request (None under other policies)."""
        if self.policy != "slo":
            return None
        tokens = info.prompt_tokens
        output: float | None = info.max_tokens
        if tokens is None or not output:  # (the keeper's sizes, only when the request lacks one)
            traffic = self.tuning.traffic
            if tokens is None:
                tokens = round(info.prompt_chars * traffic.tokens_per_char)
            if not output:
                output = traffic.mean_output
        assert output is not None
        return _new(
            Request,
            (
                float(tokens),
                float(output),
                info.sampling,
                self.slo_ttft if slo_ttft is None else slo_ttft,
                self.slo_tpot if slo_tpot is None else slo_tpot,
            ),
        )

    def peek(self, request: Request | None = None) -> Decision | None:
        """What ``decide`` would answer now, changing nothing (for a queued request)."""
        return choose(self.policy, self.snapshot(request))[0]

    def decide(self, request: Request | None = None) -> Decision | None:
        snap = self.snapshot(request)
        decision, self._state = choose(self.policy, snap)
        if decision is not None and self.explore_share > 0 and self.policy != "round_robin":
            decision = self._maybe_explore(snap, decision)
        if decision is not None and request is not None:
            decision = self._sent(snap, decision, request)
        return decision

    def _sent(self, snap: Snapshot, decision: Decision, req: Request) -> Decision:
        """Note what was routed; the decision carries the load it saw and the request's
        estimated prefill there (model seconds: the learner's stalls)."""
        self._mix.add(req)
        now = self.clock()
        models = self.tuning.models
        pool_name, backend, reason, _, share, ttft, tpot, extrapolated, _ = decision
        arrivals = self._arrivals
        if arrivals is None:
            scale = 1.0 if models is None else models[SPECULATIVE].scale
            arrivals = self._arrivals = RecentRate(OFFERED_WINDOW * scale, now)
        arrivals.add(now)
        sent = self._recent.get(backend)
        if sent is None:
            scale = 1.0 if models is None else models[SPECULATIVE].scale
            window = LATELY * scale
            sent = self._recent[backend] = RecentRate(window, now)
        if models is None:
            prefill = 0.0
            sent.add(now, prefill * 1.0)
        else:
            model = models[pool_name]
            # (``model.prefill``, written out)
            prefill = model.prefill_base + req.prompt_tokens * model.prefill_per_token
            sent.add(now, prefill * model.scale)
        backends = (snap.speculative if pool_name == SPECULATIVE else snap.baseline).backends
        urls = self.pools[pool_name]
        # (the pools' views follow ``self.pools`` in order: look the backend up by its place)
        at = urls.index(backend) if len(urls) == len(backends) else -1
        view = (
            backends[at]
            if at >= 0 and backends[at].url == backend
            else next(b for b in backends if b.url == backend)
        )
        if extrapolated:
            self.extrapolated += 1
        return _new(
            Decision,
            (pool_name, backend, reason, view.load, share, ttft, tpot, extrapolated, prefill),
        )

    def _maybe_explore(self, snap: Snapshot, decision: Decision) -> Decision:
        """Send a bounded share of requests near the crossover the other way (see learning)."""
        if abs(snap.speculative.load - snap.crossover) > self.explore_band:
            return decision
        self._explore_credit += self.explore_share
        if self._explore_credit < 1.0:
            return decision
        alt = explore(snap, decision)
        if alt is None:
            return decision
        self._explore_credit -= 1.0
        return alt

    def retry(self, failed: Decision, tried: Container[str]) -> Decision | None:
        return reroute(self.snapshot(), failed, tried)

    # -- what it rests on -----------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The slo policy's state, for /router/status: its surface, and the rule it follows."""
        surf = self.surface()
        traffic = self.tuning.traffic
        out: dict[str, Any] = {
            "deciding_as": self.deciding_as,
            "slo_ttft_ms": self.slo_ttft * 1000,
            "slo_tpot_ms": self.slo_tpot * 1000,
            "relaxed": {"ttft_times": RELAXED_TTFT, "tpot_times": RELAXED_TPOT},
            "rule": RULE if surf is not None else NO_CURVES,
            "extrapolated_decisions": self.extrapolated,
            "sampling_share": round(self._mix.sampling, 3),
            "mean_prompt_tokens": round(self._mix.prompt, 1),
            "mean_output_tokens": round(traffic.mean_output, 1),
            "tokens_per_char": round(traffic.tokens_per_char, 4),
            "params": {name: value for name, (value, _) in self.params.provenance().items()},
            "pools": None,
        }
        if surf is None:
            return out
        scale = surf.scale
        pools: dict[str, Any] = {}
        for pool in POOLS:
            cap = surf.pools[pool]
            usable = sum(1 for url in self.pools[pool] if self.health.usable(url, self.clock()))
            pools[pool] = {
                # most requests one engine runs within each target, by class (greedy, sampling)
                "strict_capacity": {"greedy": cap.strict[0], "sampling": cap.strict[1]},
                "relaxed_capacity": {"greedy": cap.relaxed[0], "sampling": cap.relaxed[1]},
                # requests/s one engine serves at them (wall clock), and the usable engines
                "strict_rate_per_s": round(cap.strict_rate / scale, 3),
                "relaxed_rate_per_s": round(cap.relaxed_rate / scale, 3),
                "usable_engines": usable,
                "measured_up_to": cap.measured,
                "cap": cap.cap,
            }
        out["pools"] = pools
        # the overload rule's inputs and its verdict now (``router.decide.policy.slo``, step 3)
        now = self.clock()
        served = sum(surf.pools[p].relaxed_rate * pools[p]["usable_engines"] for p in POOLS)
        offered = self._offered(now)
        out["overload"] = {
            "offered_per_s": None if offered is None else round(offered / scale, 3),
            "served_within_relaxed_per_s": round(served / scale, 3),
            "threshold": self.params.overload,
            "sustained": offered is not None and offered > served * self.params.overload,
            "excess_to": _excess_to(surf),
        }
        # the strict pool by class: kept within the strict SLO (steps 2 and 3 of the rule)
        out["strict_pool"] = {"greedy": surf.strict_pool[0], "sampling": surf.strict_pool[1]}
        # the pool step 2 takes last by class: the strict pool, or one with params.lead more
        out["taken_last"] = {"greedy": surf.last[0], "sampling": surf.last[1]}
        out["mix"] = {
            "prompt_tokens": round(surf.mix.prompt, 1),
            "output_tokens": round(surf.mix.output, 1),
            "sampling_share": round(surf.mix.sampling, 3),
        }
        return out

    def pool_usable(self, pool: Pool) -> bool:
        now = self.clock()
        return any(self.health.usable(url, now) for url in self.pools[pool])


# What /router/status says the slo policy does (``router.decide.policy.slo``).
RULE = (
    "1. each request to the engine with room under its strict capacity (pools.*."
    "strict_capacity) where its time per token is lowest (within params.headroom of the "
    "strict target: its own plus the step it adds to each request running there, those "
    "engines first); 2. when every engine is at its strict "
    "capacity, to an engine with room under its relaxed capacity: the other pool's before the "
    "pool taken last (taken_last: the strict pool, strict_pool: the pool whose strict "
    "capacity is at least params.reserve times the other's, kept within the strict SLO; with "
    "none, the pool whose strict capacity is params.lead requests larger), then the one filled "
    "least against it; "
    "3. when every engine is at its relaxed capacity: under sustained overload "
    "(overload.sustained: requests arriving faster than overload.threshold times what the "
    "engines serve within the relaxed SLO) to overload.excess_to (the pool other than the "
    "strict pool; with none, the pool with the most throughput), so that the other keeps "
    "serving within the SLO; short of that (a burst) to the engine filled least against its "
    "relaxed capacity; in both cases the router's queue, when on, holds it first"
)


def _excess_to(surf: Surface) -> str:
    """Where step 3 sends the excess under sustained overload (a greedy request's)."""
    keep = surf.strict_pool[0]
    return surf.most if keep is None else other(keep)


NO_CURVES = "no curves yet: deciding as spillover on the crossover"
