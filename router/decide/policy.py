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

from router.decide.learner import Gain
from router.decide.predict import (
    RELAXED_TTFT,
    PoolModel,
    Prediction,
    Request,
    chance,
    failing,
    predict,
    value,
)
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


class Snapshot(NamedTuple):
    speculative: PoolView
    baseline: PoolView
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


def spillover(snap: Snapshot) -> tuple[Decision | None, RoutingState]:
    """The speculative pool takes a request while its least-loaded replica is below the crossover.

    The crossover is per engine, so N speculative replicas hold up to N x crossover requests.
    """
    spec = pick_backend(snap.speculative, snap.state.rr)
    if spec is None or spec.load < snap.crossover:
        # (no usable speculative replica: _place fails over to baseline and says so)
        return _place(snap, SPECULATIVE, "below_crossover", snap.state)
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


# A backend is a candidate for a request only while the request's predicted time to first token
# there is within the relaxed TTFT target or this factor of its best: goodput alone would let one
# engine's queue absorb every request that cannot meet its SLO anyway, and that queue then grows
# without end. (A long TPOT is not excluded: an engine past its SLO still serves everyone it
# admits, and its throughput only grows with its batch; a queue serves no one.)
BALANCE = 2.0
# Below this value a placement adds no goodput (see ``slo``).
NOTHING = 0.05


def slo(snap: Snapshot) -> tuple[Decision | None, RoutingState]:
    """Each request where it adds the most expected goodput under its SLO (``router.decide.
    predict``): its own chance to meet the TTFT and TPOT targets there, minus the chance it
    takes from the requests already there; among the backends where its predicted end-to-end
    time to first token is acceptable (see ``BALANCE``). Without a request or models:
    ``predictive``."""
    req, models = snap.request, snap.models
    if req is None or models is None:
        return predictive(snap)
    options: list[tuple[Prediction, Pool, BackendView]] = []
    rr, mean_output, sampling_share = snap.state.rr, snap.mean_output, snap.sampling_share
    for view in (snap.speculative, snap.baseline):
        pool_model = models[view.name]
        candidates = view.usable()
        n = len(candidates)
        for i in range(n):
            b = candidates[(rr + i) % n]  # ties rotate
            model = pool_model if b.cap is None else pool_model._replace(cap=b.cap)
            # a backend ramping back in counts as more loaded, as in pick_backend
            load = b.load if b.weight >= 1.0 else math.ceil((b.load + 1) / b.weight) - 1
            p = predict(model, load, b.prefill_share, req, mean_output, sampling_share, b.load_avg)
            options.append((p, view.name, b))
    if not options:
        return None, snap.state
    limit = max(req.slo_ttft * RELAXED_TTFT, BALANCE * min(o[0].ttft for o in options))
    eligible = [o for o in options if o[0].ttft <= limit]
    best, worth = eligible[0], -math.inf
    for o in eligible:
        v = value(o[0], req, o[2].load)
        if v > worth:
            best, worth = o, v
    if worth <= NOTHING and failing(best[0], req):
        dump = max(models, key=lambda name: models[name].capacity())
        if best[1] != dump:
            # Nowhere does it add goodput, and the best of nothing is a smaller pool whose
            # requests already miss their SLO (so it harms none of them). Left to that, every
            # such request would pile onto the small pool until its queue holds them all; the
            # excess goes to the pool with the most throughput instead (the baseline).
            pool = [o for o in eligible if o[1] == dump] or eligible
            best = min(pool, key=lambda o: o[0].ttft)
    # "overflow": it cannot meet even the relaxed SLO anywhere (a router-side queue, when
    # configured, holds such requests until one can)
    overflow = worth <= NOTHING and all(chance(o[0], req) < NOTHING for o in eligible)
    p, pool_name, chosen = best
    decision = Decision(
        pool_name,
        chosen.url,
        "overflow" if overflow else "predicted_slo",
        ttft=p.ttft,
        tpot=p.tpot,
        extrapolated=p.extrapolated,
    )
    return decision, snap.state._replace(rr=rr + 1)


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
