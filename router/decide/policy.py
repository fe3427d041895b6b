"""Routing decisions: pure functions from a frozen snapshot to a decision.

Nothing here sees a request, a socket or a clock. The proxy builds a ``Snapshot`` (loads,
health, crossover), calls ``choose`` and applies the returned ``RoutingState``; tests call the
same function with plain values.

Loads are whatever the configured load signal says (this router's own in-flight counts, or the
engines' reported running requests; see ``router.load``): the policies do not care which.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Mapping
from typing import Literal, NamedTuple

from router.decide.predict import Gain, PoolModel, Request
from router.decide.twin import Flight, Held, Placement, Stream, place, slo_capacity
from router.pools import BASELINE, SPECULATIVE, Pool, other

# Named tuples rather than frozen dataclasses: as immutable, and several times cheaper to build,
# which matters because a snapshot is built for every request (bench/results/overhead.md).


class BackendView(NamedTuple):
    url: str
    load: int
    usable: bool = True
    # 0 < weight <= 1 while a recovered backend is ramped back in; it counts as more loaded.
    weight: float = 1.0
    # share of the recent time this backend spent prefilling the requests sent to it
    prefill_share: float = 0.0
    # its recent mean load (None: not tracked)
    load_avg: float | None = None
    # the most requests the engine runs at once, when it has shown it (else the pool model's)
    cap: int | None = None
    # for the slo policy (model seconds): the requests in flight there as far as they are known
    # (``load`` may count more: other routers' and workers', whose sizes are the stream's), and
    # the traffic expected to keep arriving (router.decide.twin)
    flights: tuple[Flight, ...] = ()
    stream: Stream | None = None
    # of ``load``, requests whose client left that the engine has yet to abort (counted for
    # ENGINE_ABORT_LAG): how much longer each holds a place in its batch (wall seconds); they
    # have no SLO any more
    leaving: tuple[float, ...] = ()


# Why a request went where it went (the ``x-spec-router-reason`` header, a metric label).
Reason = Literal[
    "below_crossover",
    "above_crossover",
    "predicted_gain",
    "failover",
    "retry",
    "explore",
    "round_robin",
    "predicted_slo",
    "overflow",
    "beyond_measured",
]


class PoolView(NamedTuple):
    name: Pool
    backends: tuple[BackendView, ...]

    @property
    def load(self) -> int:
        return sum(b.load for b in self.backends)

    def usable(self, exclude: Container[str] = ()) -> list[BackendView]:
        return [b for b in self.backends if b.usable and b.url not in exclude]


class RoutingState(NamedTuple):
    """What a policy remembers between decisions (the shell stores it, the policy updates it)."""

    rr: int = 0
    # `crossover` policy: True once load reached the crossover, until it falls below the band.
    above: bool = False
    # `slo` policy: the decayed share of recent requests that no backend could take within
    # their SLO without costing the others theirs (see ``slo``).
    pressure: float = 0.0


class Snapshot(NamedTuple):
    speculative: PoolView
    baseline: PoolView
    # requests per speculative engine before the rest go elsewhere: the crossover, or with
    # ``no_crossover`` the highest level measured (none was found up to there)
    crossover: int
    hysteresis: int = 0
    state: RoutingState = RoutingState()
    # Optional: a request's predicted effect per pool, for the `predictive` policy.
    gain: Gain | None = None
    # Optional, for the `slo` policy: the request, and what is known of each pool's engines.
    request: Request | None = None
    models: Mapping[Pool, PoolModel] | None = None
    mean_output: float = 200.0  # output tokens of recent requests, for requests without one
    sampling_share: float = 0.5  # share of recent requests at temperature > 0
    # True: the table measured no crossover (``router.decide.table``): speculation was better
    # at every level measured, so past ``crossover`` (that level) nothing says the baseline is
    # better, and the rest of the requests go by load rather than all to the baseline
    no_crossover: bool = False

    def pool(self, name: Pool) -> PoolView:
        return self.speculative if name == SPECULATIVE else self.baseline

    @property
    def total_load(self) -> int:
        return self.speculative.load + self.baseline.load


class Decision(NamedTuple):
    pool: Pool
    backend: str
    reason: Reason
    # what the backend looked like when it was chosen (the decider fills these in)
    load: int = 0
    prefill_share: float = 0.0
    # slo policy: the request's predicted TTFT and TPOT there, wall seconds, and whether that
    # prediction went beyond the measured batch sizes
    ttft: float = 0.0
    tpot: float = 0.0
    extrapolated: bool = False
    prefill: float = 0.0  # its prefill there, as the slo policy's model says (model seconds)


def pick_backend(pool: PoolView, rr: int = 0, exclude: Container[str] = ()) -> BackendView | None:
    """The usable replica with the fewest requests in flight (weighted while ramping).

    Ties rotate with ``rr`` so equal replicas share the work.
    """
    candidates = pool.usable(exclude)
    if not candidates:
        return None
    n = len(candidates)
    best = None
    best_score = 0.0
    for i in range(n):
        b = candidates[(rr + i) % n]
        score = (b.load + 1) / b.weight
        if best is None or score < best_score:
            best, best_score = b, score
    return best


def _place(
    snap: Snapshot, pool: Pool, reason: Reason, state: RoutingState
) -> tuple[Decision | None, RoutingState]:
    """Put the request on ``pool``, or fail over to the other one if it has no usable backend."""
    chosen = pick_backend(snap.pool(pool), state.rr)
    if chosen is None:
        pool, reason = other(pool), "failover"
        chosen = pick_backend(snap.pool(pool), state.rr)
        if chosen is None:
            return None, state
    return Decision(pool, chosen.url, reason), state._replace(rr=state.rr + 1)


def by_load(snap: Snapshot, state: RoutingState) -> tuple[Decision | None, RoutingState]:
    """Past the highest level measured when no crossover was measured: the least loaded usable
    backend of either pool (weighted while ramping; a tie stays speculative, the pool measured
    better), so neither pool is assumed better where nothing was measured."""
    spec = pick_backend(snap.speculative, state.rr)
    base = pick_backend(snap.baseline, state.rr)
    if spec is None or base is None:  # one pool only: _place fails over and says so
        return _place(snap, SPECULATIVE if base is None else BASELINE, "beyond_measured", state)
    if (spec.load + 1) / spec.weight <= (base.load + 1) / base.weight:
        return Decision(SPECULATIVE, spec.url, "beyond_measured"), state._replace(rr=state.rr + 1)
    return Decision(BASELINE, base.url, "beyond_measured"), state._replace(rr=state.rr + 1)


def spillover(snap: Snapshot) -> tuple[Decision | None, RoutingState]:
    """The speculative pool takes a request while its least-loaded replica is below the crossover.

    The crossover is per engine, so N speculative replicas hold up to N x crossover requests.
    With no crossover measured (``no_crossover``), the rest go by load (``by_load``).
    """
    spec = pick_backend(snap.speculative, snap.state.rr)
    if spec is None or spec.load < snap.crossover:
        # (no usable speculative replica: _place fails over to baseline and says so)
        return _place(snap, SPECULATIVE, "below_crossover", snap.state)
    if snap.no_crossover:
        return by_load(snap, snap.state)
    return _place(snap, BASELINE, "above_crossover", snap.state)


def crossover(snap: Snapshot) -> tuple[Decision | None, RoutingState]:
    """Speculative while the total load before this request is below the crossover.

    For two modes of one capacity (two servers on the same GPUs), where only total load matters.
    Hysteresis: once at or above the crossover, the load must fall below crossover - hysteresis
    before speculation resumes, so the rule does not flap at the edge.
    """
    replicas = max(1, len(snap.speculative.usable()))
    limit = snap.crossover * replicas
    load = snap.total_load
    above = snap.state.above
    if above and load < limit - snap.hysteresis:
        above = False
    elif not above and load >= limit:
        above = True
    state = snap.state._replace(above=above)
    if above:
        if snap.no_crossover:
            return by_load(snap, state)
        return _place(snap, BASELINE, "above_crossover", state)
    return _place(snap, SPECULATIVE, "below_crossover", state)


def round_robin(snap: Snapshot) -> tuple[Decision | None, RoutingState]:
    """Every usable backend of both pools in turn: the generic load balancer, for reference."""
    candidates = snap.speculative.usable() + snap.baseline.usable()
    if not candidates:
        return None, snap.state
    chosen = candidates[snap.state.rr % len(candidates)]
    pool: Pool = SPECULATIVE if chosen in snap.speculative.backends else BASELINE
    return Decision(pool, chosen.url, "round_robin"), snap.state._replace(rr=snap.state.rr + 1)


def predictive(snap: Snapshot) -> tuple[Decision | None, RoutingState]:
    """Where the request adds the most to the whole system (see ``router.decide.table``).

    ``snap.gain(pool, load)`` is the change in the objective when one more request joins a
    replica of ``pool`` already running ``load``; without curves it falls back to spillover.
    """
    if snap.gain is None:
        return spillover(snap)
    spec = pick_backend(snap.speculative, snap.state.rr)
    base = pick_backend(snap.baseline, snap.state.rr)
    if spec is None or base is None:
        return spillover(snap)
    if snap.gain(SPECULATIVE, spec.load) >= snap.gain(BASELINE, base.load):
        return _place(snap, SPECULATIVE, "predicted_gain", snap.state)
    return _place(snap, BASELINE, "predicted_gain", snap.state)


# The slo policy's value of a placement: requests expected to meet their SLO there, with this
# one against without it, at the strict tier (weighted) and at the relaxed one; and, to break
# ties, a small pull towards what slows every request there least (its own time to first token
# and per token, and what it adds to the others': the placement that serves them all fastest).
STRICT_WEIGHT = 1.0
TIE_WEIGHT = 0.01
# A placement is *feasible* while the request itself meets the relaxed tier there and costs the
# requests already (or soon) there less than this many relaxed-tier requests.
SPARE = 0.5
# Below this chance to meet even the relaxed tier anywhere, a request "overflows": a router-side
# queue, when configured, holds it until a backend can serve it.
NOTHING = 0.05
# Pressure: each decision weighs this much in the decayed share of requests with no feasible
# backend. Past LIMIT the engines are overloaded for longer than a burst: spreading the excess
# would take both below their SLO, so it goes to the backend with the most throughput, which
# keeps the other one serving within its SLO (bench/results/traffic.md).
PRESSURE_KEEP = 0.05
PRESSURE_LIMIT = 0.5
# ... and only while the traffic arriving is at least this share of what the engines can serve
# (``offered``): a closed loop of users at the edge of the SLO, which waits for its answers, has
# no feasible backend either, yet concentrating it on one engine only trades one engine's
# requests for the other's (bench/results/policy-lab.md, the demo's 32 users).
OVERLOAD = 0.85
# Short of that, a share of requests with no feasible backend past this is a closed loop of
# users past the SLO's edge (``_dump``): higher than PRESSURE_LIMIT, as open traffic below
# overload reaches it only in its longest bursts, where each request's least harm does better.
SATURATED = 0.7
# ... and only if its excess fits in the other pool's engines within this share of their caps.
FIT = 0.8
# Replicas of a pool simulated for each request: the least loaded ones.
CANDIDATES = 2
# How far the running requests have got is guessed from the iteration time stretched by the
# share of recent time the engine spent prefilling; past this share the guess stops growing.
MAX_PREFILL_SHARE = 0.8


class Option(NamedTuple):
    pool: Pool
    backend: BackendView
    placement: Placement
    value: float
    feasible: bool


def _phantoms(
    view: BackendView, model: PoolModel, like: Flight, sampling: float, weight: float = 1.0
) -> tuple[Flight, ...]:
    """The requests in flight there that this router does not know (other routers' and workers',
    or a ramping backend's handicap: ``weight``, its ramp relative to the other backends'), as
    requests ``like`` this one halfway through, the ``sampling`` share of them at temperature
    > 0."""
    # (to the nearest request: a backend a hair behind the others in its ramp is not one busier)
    load = view.load if weight >= 1.0 else math.floor((view.load + 1) / weight + 0.5) - 1
    missing = load - len(view.flights)
    if missing <= 0:
        return view.flights
    running = min(load, model.cap or load)
    ghosts: list[Flight] = []
    # those being aborted: in the batch until the engine drops them, then gone; met whatever
    # happens (no SLO), so they count for nothing either way, only as places in the batch
    leaving = view.leaving[:missing]
    if leaving:
        spi, tau = model.iteration(running), model.tau(False)
        ghosts += [
            Flight(
                like.prompt,
                1.0 + tau * max(1.0, left / model.scale / spi),
                False,
                0.0,
                0.0,
                math.inf,
                math.inf,
            )
            for left in leaving
        ]
        missing -= len(leaving)
    hot = round(missing * min(1.0, max(0.0, sampling)))
    for n, hot_class in ((missing - hot, False), (hot, True)):
        if n:
            decoding = max(1.0, like.output - 1) / model.tau(hot_class) / 2
            decoding *= model.iteration(running)
            age = decoding + model.prefill(like.prompt)
            ghosts += [like._replace(sampling=hot_class, age=age, decoding=decoding)] * n
    return view.flights + tuple(ghosts)


def _option(
    pool: Pool, view: BackendView, model: PoolModel, snap: Snapshot, top: float = 1.0
) -> Option:
    """``view`` with the request, against without it; ``top``: the highest ramp weight among
    the usable backends (a ramp handicaps a backend against the others, so when every backend
    ramps, as when the router has just started, none is handicapped)."""
    req = snap.request
    assert req is not None
    scale = model.scale
    me = Flight(req.prompt_tokens, req.output_tokens, req.sampling, 0.0, None,
                req.slo_ttft / scale, req.slo_tpot / scale)  # fmt: skip
    s = view.stream
    like = me if s is None else me._replace(prompt=s.prompt, output=s.output or snap.mean_output)
    sampling = snap.sampling_share if s is None else s.sampling
    flights = _phantoms(view, model, like, sampling, min(1.0, view.weight / top))
    stretch = 1.0 / (1.0 - min(max(view.prefill_share, 0.0), MAX_PREFILL_SHARE))
    p = place(model, flights, s, me, stretch)
    latency = p.ttft / me.slo_ttft + p.slowness
    value = STRICT_WEIGHT * p.strict + p.relaxed - TIE_WEIGHT * latency
    feasible = p.own[1] >= 0.5 and p.relaxed - p.own[1] > -SPARE
    return Option(pool, view, p, value, feasible)


def offered(snap: Snapshot, models: Mapping[Pool, PoolModel]) -> float | None:
    """The requests arriving (the backends' streams) over the most the usable backends can
    serve, each engine prefilling the streams' mean prompt and then giving their mean output
    at its peak throughput; None while no stream is known."""
    rate = served = 0.0
    for view in (snap.speculative, snap.baseline):
        model = models[view.name]
        for b in view.usable():
            s = b.stream
            if s is None:
                return None
            rate += s.rate
            served += 1.0 / (model.prefill(s.prompt) + s.output / model.capacity())
    return rate / served if served > 0 else None


def _dump(snap: Snapshot, models: Mapping[Pool, PoolModel], pressure: float) -> Pool | None:
    """Where the requests no backend can take go while that lasts (``pressure`` past
    ``PRESSURE_LIMIT``), if anywhere in particular (None: each where it does the least harm).

    - Arriving faster than the engines can serve (``OVERLOAD``): the excess has no bound, and
      the pool with the most throughput drains it fastest.
    - Otherwise, past ``SATURATED``: a closed loop of users past the SLO's edge, whose excess
      is the users both pools cannot serve within their SLO, and who wait for their answers.
      The pool that serves fewer of them within the relaxed SLO (``pool_slo_capacity``) takes
      them, so the one that serves more keeps doing so (left to each request's least harm,
      whichever pool tipped first would stay the one sacrificed), if they fit in its engines
      with room to spare (``FIT``). Beyond that it would queue them, or take them one moment
      and refuse them the next: then, as under overload, the pool with the most throughput.
    """
    share = offered(snap, models)
    if share is None or share >= OVERLOAD:  # (no streams known: as before they were)
        return _most_throughput(models)
    if pressure <= SATURATED:
        return None
    views = {view.name: view for view in (snap.speculative, snap.baseline)}
    held = slo_capacities(snap, models)
    low = min(held, key=lambda name: held[name].rate)
    keep = other(low)
    cap = models[low].cap
    if cap is not None:
        room = sum(b.cap or cap for b in views[low].usable())
        excess = sum(b.load for view in views.values() for b in view.usable())
        if excess - held[keep].running > FIT * room:
            return _most_throughput(models)
    return low


def _most_throughput(models: Mapping[Pool, PoolModel]) -> Pool:
    return max(models, key=lambda name: models[name].capacity())


def slo_capacities(snap: Snapshot, models: Mapping[Pool, PoolModel]) -> dict[Pool, Held]:
    """``pool_slo_capacity`` of each pool."""
    return {
        view.name: pool_slo_capacity(view, models[view.name])
        for view in (snap.speculative, snap.baseline)
    }


def pool_slo_capacity(view: PoolView, model: PoolModel) -> Held:
    """What the pool's usable backends serve within the relaxed TPOT target of the traffic each
    sees (``twin.slo_capacity``), summed."""
    rate, running = 0.0, 0
    for b in view.usable():
        if b.stream is not None:
            one = slo_capacity(model, b.stream)
            rate, running = rate + one.rate, running + one.running
    return Held(rate, running)


def _candidates(view: PoolView, rr: int) -> list[BackendView]:
    """A pool's ``CANDIDATES`` least loaded usable replicas (weighted while ramping; ties
    rotate): which of a pool's replicas is worth the most is rarely in doubt, and each one
    simulated costs a little time."""
    usable = view.usable()
    n = len(usable)
    rotated = [usable[(rr + i) % n] for i in range(n)]
    if n <= CANDIDATES:
        return rotated
    return sorted(rotated, key=lambda b: (b.load + 1) / b.weight)[:CANDIDATES]


def slo(snap: Snapshot) -> tuple[Decision | None, RoutingState]:
    """Each request where it adds the most requests meeting their SLO, by simulating each
    backend's near future with it and without it (``router.decide.twin``): its own TTFT and
    TPOT there, and what its prefill and its place in the batch cost the requests already there
    and those that keep arriving. Under sustained overload (see ``PRESSURE_LIMIT``) the requests
    no backend can take are sent to the backend with the most throughput. Without a request or
    models: ``predictive``."""
    req, models = snap.request, snap.models
    if req is None or models is None:
        return predictive(snap)
    options: list[Option] = []
    rr = snap.state.rr
    pools = (snap.speculative, snap.baseline)
    top = max((b.weight for view in pools for b in view.usable()), default=1.0)
    for view in pools:
        pool_model = models[view.name]
        for b in _candidates(view, rr):
            # the cap the engine reported (the table's), unless it has since run more at once
            if b.cap is not None and (pool_model.cap is None or b.cap > pool_model.cap):
                model = pool_model._replace(cap=b.cap)
            else:
                model = pool_model
            options.append(_option(view.name, b, model, snap, top))
    if not options:
        return None, snap.state
    best = max(options, key=lambda o: o.value)
    feasible = [o for o in options if o.feasible]
    pressure = snap.state.pressure + (float(not feasible) - snap.state.pressure) * PRESSURE_KEEP
    if not best.feasible:
        if feasible:
            best = max(feasible, key=lambda o: o.value)
        elif pressure > PRESSURE_LIMIT:
            dump = _dump(snap, models, pressure)
            if dump is not None:
                best = max((o for o in options if o.pool == dump), key=lambda o: o.value,
                           default=best)  # fmt: skip
    p = best.placement
    scale = models[best.pool].scale
    overflow = not feasible and all(o.placement.own[1] < NOTHING for o in options)
    decision = Decision(
        best.pool,
        best.backend.url,
        "overflow" if overflow else "predicted_slo",
        ttft=p.ttft * scale,
        tpot=p.tpot * scale,
        extrapolated=p.batch > max(1, models[best.pool].measured),
    )
    return decision, snap.state._replace(rr=rr + 1, pressure=pressure)


POLICIES: dict[str, Callable[[Snapshot], tuple[Decision | None, RoutingState]]] = {
    "spillover": spillover,
    "crossover": crossover,
    "round_robin": round_robin,
    "predictive": predictive,
    "slo": slo,
}


def choose(policy: str, snap: Snapshot) -> tuple[Decision | None, RoutingState]:
    return POLICIES[policy](snap)


def explore(snap: Snapshot, decision: Decision) -> Decision | None:
    """The same request on the other pool, to keep the curve there measured."""
    pool = other(decision.pool)
    alt = pick_backend(snap.pool(pool), snap.state.rr)
    return None if alt is None else Decision(pool, alt.url, "explore")


def reroute(snap: Snapshot, failed: Decision, tried: Container[str]) -> Decision | None:
    """After a safe-to-retry failure: another replica of the same pool, else the other pool."""
    same = pick_backend(snap.pool(failed.pool), snap.state.rr, exclude=tried)
    if same is not None:
        return Decision(failed.pool, same.url, "retry")
    pool = other(failed.pool)
    alt = pick_backend(snap.pool(pool), snap.state.rr, exclude=tried)
    if alt is not None:
        return Decision(pool, alt.url, "failover")
    return None
