"""Routing decisions: pure functions from a frozen snapshot to a decision.

Nothing here sees a request, a socket or a clock. The proxy builds a ``Snapshot`` (loads,
health, crossover), calls ``choose`` and applies the returned ``RoutingState``; tests call the
same function with plain values.

Loads are whatever the configured load signal says (this router's own in-flight counts, or the
engines' reported running requests; see ``router.load``): the policies do not care which.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Literal, NamedTuple

from router.decide.learner import Gain
from router.pools import BASELINE, SPECULATIVE, Pool, other

# Named tuples rather than frozen dataclasses: as immutable, and several times cheaper to build,
# which matters because a snapshot is built for every request (bench/results/overhead.md).


class BackendView(NamedTuple):
    url: str
    load: int
    usable: bool = True
    # 0 < weight <= 1 while a recovered backend is ramped back in; it counts as more loaded.
    weight: float = 1.0


# Why a request went where it went (the ``x-spec-router-reason`` header, a metric label).
Reason = Literal[
    "below_crossover",
    "above_crossover",
    "predicted_gain",
    "failover",
    "retry",
    "explore",
    "round_robin",
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

    def pool(self, name: Pool) -> PoolView:
        return self.speculative if name == SPECULATIVE else self.baseline

    @property
    def total_load(self) -> int:
        return self.speculative.load + self.baseline.load


class Decision(NamedTuple):
    pool: Pool
    backend: str
    reason: Reason


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


POLICIES: dict[str, Callable[[Snapshot], tuple[Decision | None, RoutingState]]] = {
    "spillover": spillover,
    "crossover": crossover,
    "round_robin": round_robin,
    "predictive": predictive,
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
