"""Routing decisions: pure functions from a frozen snapshot to a decision.

Nothing here sees a request, a socket or a clock. The proxy builds a ``Snapshot`` (loads,
health, crossover), calls ``choose`` and applies the returned ``RoutingState``; tests call the
same function with plain values.

Loads are whatever the configured load signal says (this router's own in-flight counts, or the
engines' reported running requests; see ``router.load``): the policies do not care which.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Mapping, Sequence
from typing import Literal, NamedTuple

from router.decide.capacity import (
    MAX_STALL_SHARE,
    RELAXED_TPOT,
    RELAXED_TTFT,
    TOP,
    Capacity,
    Surface,
)
from router.decide.predict import Gain, Request
from router.decide.snapshot import RecentRate
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
    "within_slo",
    "within_relaxed",
    "overflow",
    "beyond_slo",
    "beyond_measured",
]


class PoolView(NamedTuple):
    name: Pool
    backends: tuple[BackendView, ...]
    # True: every backend is usable at full weight (the builder knows it; False: look)
    even: bool = False
    # the backends' loads in order, when the builder has them at hand (else read from them)
    loads: Sequence[int] | None = None

    @property
    def load(self) -> int:
        loads = self.loads
        if loads is not None:
            return sum(loads)  # (the same numbers, summed without a pass in Python)
        return sum(b.load for b in self.backends)

    def usable(self, exclude: Container[str] = ()) -> list[BackendView]:
        if self.even and not exclude:
            return list(self.backends)
        return [b for b in self.backends if b.usable and b.url not in exclude]

    def usable_count(self) -> int:
        if self.even:
            return len(self.backends)
        return sum(1 for b in self.backends if b.usable)


class RoutingState(NamedTuple):
    """What a policy remembers between decisions (the shell stores it, the policy updates it)."""

    rr: int = 0
    # `crossover` policy: True once load reached the crossover, until it falls below the band.
    above: bool = False


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
    # Optional, for the `slo` policy: the request, and both pools' capacities.
    request: Request | None = None
    surface: Surface | None = None
    offered: float | None = None  # requests per second arriving lately (model time)
    # requests sent to each backend lately (``RecentRate``: per second of the shell's clock),
    # and that clock now
    recent: Mapping[str, RecentRate] | None = None
    now: float = 0.0
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
    prefill_share: float = 0.0  # (no longer estimated: 0)
    # slo policy: the request's predicted TTFT and TPOT there, wall seconds (steady state at
    # that load), and whether that prediction went beyond or below the measured batch sizes
    ttft: float = 0.0
    tpot: float = 0.0
    extrapolated: bool = False
    prefill: float = 0.0  # its prefill there, as the slo policy's model says (model seconds)


_new = tuple.__new__


def pick_backend(pool: PoolView, rr: int = 0, exclude: Container[str] = ()) -> BackendView | None:
    """The usable replica with the fewest requests in flight (weighted while ramping).

    Ties rotate with ``rr`` so equal replicas share the work.
    """
    if pool.even and not exclude and pool.backends:
        # (every replica at full weight: the same choice by the builtins, one pass each)
        backends = pool.backends
        loads = pool.loads if pool.loads is not None else [b.load for b in backends]
        least = min(loads)
        start = rr % len(loads)
        try:
            return backends[loads.index(least, start)]
        except ValueError:
            return backends[loads.index(least)]
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


# Added to step 1's cost of an engine without headroom below the strict target: more than any
# time per token (seconds), so that it comes after every engine with headroom.
CLOSE = 1e6


def _effective(b: BackendView) -> int:
    """A backend's requests in flight with one more, counted as more while it ramps."""
    if b.weight >= 1.0:
        return b.load + 1
    return math.ceil((b.load + 1) / b.weight - 1e-9)


def _tpot_at(cap: Capacity, c: int, n: int) -> float:
    table = cap.tpot[c]
    return table[n] if n < len(table) else table[-1]


def slo(snap: Snapshot) -> tuple[Decision | None, RoutingState]:
    """Each request within the SLO where there is room, by the pools' capacities
    (``router.decide.capacity``: computed from the curves off the hot path), in three steps:

    1. an engine with room under its strict capacity for this request's class (and where its own
       time to first token and per token meet the strict targets): the one where its time per
       token is lowest (``within_slo``); quiet, that is speculation. Among engines with headroom
       below the strict target (``params.headroom``) the time per token counted is what the
       request adds in all: its own and the step it adds to each request running there (two
       engines that both serve it within the SLO: the one where it slows the others least);
       those closer to the target come after them;
    2. else an engine with room under its relaxed capacity (``within_relaxed``): the other
       pool's before the strict pool's (``surf.strict_pool``: a pool whose strict capacity
       clearly exceeds the other's, which so keeps serving within the strict SLO; with none,
       before the pool whose strict capacity is ``params.lead`` requests larger: ``surf.last``),
       then the one filled least against its relaxed capacity;
    3. else it overflows (``overflow``: the router's queue, when on, holds it until an engine
       has room). While requests arrive faster than ``params.overload`` times what the engines
       serve within the relaxed SLO (``snap.offered``: sustained overload), it goes away from
       the strict pool, or with none to the pool with the most throughput, so that the other
       keeps serving within the SLO; short of that (a burst) to the engine filled least against
       its relaxed capacity. A request that would miss the relaxed targets even alone, or that
       some engine has a place for by its load (within its relaxed capacity and the request's
       relaxed time per token there) but not within the targets (its prefill's harm, the
       prefills sent there lately: a release would not bring that), is placed the same way,
       unqueued (``beyond_slo``).

    Without curves (no surface yet): as ``spillover``."""
    req, surf = snap.request, snap.surface
    if req is None or surf is None:
        return spillover(snap)
    state = snap.state
    rr = state.rr
    c = 1 if req.sampling else 0
    scale = surf.scale
    ttft, tpot = req.slo_ttft / scale, req.slo_tpot / scale
    prompt = req.prompt_tokens
    pools = surf.pools
    recent = snap.recent
    now = snap.now
    mix_tokens = surf.mix.output - 1.0
    if not mix_tokens > 1.0:  # (max(1.0, ...) without the call)
        mix_tokens = 1.0
    # each candidate (the least loaded usable engine of each pool): its time per token and to
    # first token, as busy as it has been lately, and what its prefill adds to the time per
    # token of each request running there (spread over a request of the mix's length). Kept
    # flat (one tuple each; the capacities' methods and ``_effective`` written out, no closures
    # or generators): this runs for every request, and ``tests/decide/test_slo_rewrite.py``
    # holds it to the rule as first written, float for float.
    picks: list[_Pick] = []
    for view in (snap.speculative, snap.baseline):
        b = pick_backend(view, rr)
        if b is None:
            continue
        weight = b.weight
        n = b.load + 1 if weight >= 1.0 else math.ceil((b.load + 1) / weight - 1e-9)
        cap = pools[view.name]
        per_token = cap.prefill_per_token
        harm = (cap.prefill_base + prompt * per_token) / mix_tokens if n > 1 else 0.0
        spi = cap.spi[n if n <= TOP else TOP]
        limit = cap.cap
        # (``cap.ttft(prompt, n)``: without the prefills ahead)
        if limit is not None and n > limit:
            predicted = 1.5 * spi + (n - limit) * spi + cap.prefill_base + prompt * per_token
        else:
            predicted = 1.5 * spi + cap.prefill_base + prompt * per_token
        sent = None if recent is None else recent.get(b.url)
        if sent is not None:
            # as busy as it has been lately (``cap.busy``, ``cap.own_tpot``); its prefill waits
            # for those sent there lately that have not ended yet
            # (``sent.rate(now)`` and ``sent.ahead(now)``, written out)
            at, until = sent.at, sent.until
            rate = sent.count * (math.exp(-(now - at) / sent.window) if now > at else 1.0)
            busy = rate / sent.window * scale * cap.prefill
            if not busy < MAX_STALL_SHARE:  # (as ``min``)
                busy = MAX_STALL_SHARE
            own = spi / cap.tau[c] / (1.0 - busy)
            first = predicted + (until - now if until > now else 0.0) / scale
        elif recent is not None:
            own, first = spi / cap.tau[c] / 1.0, predicted
        else:
            own, first = _tpot_at(cap, c, n), predicted
        picks.append((view, b, n, cap, own, first, harm, predicted))
    if not picks:
        return None, state
    # 1. room within the strict SLO, its prefill keeping those there within it too: where the
    # time per token it sees and adds to the others is lowest; first among the engines with
    # headroom below the target (``params.headroom``), counting the step it adds to the time per
    # token of each request running there, then the others (without the step)
    best: _Pick | None = None
    best_cost = math.inf
    headroom = surf.params.headroom * tpot
    for pick in picks:
        _, _, n, cap, own, first, harm, _ = pick
        if n > cap.strict[c] or own + harm > tpot or first > ttft:
            continue
        table = _tpot_at(cap, c, n)
        cost = own + (n - 1) * harm
        if (own if own > table else table) + harm > headroom:
            cost += CLOSE  # (after every engine with headroom; a plain float: no allocation)
        elif n > 1:
            before = _tpot_at(cap, c, n - 1)
            if table > before:
                cost += (n - 1) * (table - before)
        if cost < best_cost:
            best, best_cost = pick, cost
    reason: Reason = "within_slo"
    if best is None:
        # 2. room within the relaxed SLO
        reason = "within_relaxed"
        relaxed_tpot, relaxed_ttft = tpot * RELAXED_TPOT, ttft * RELAXED_TTFT
        fits = [
            p
            for p in picks
            if p[2] <= p[3].relaxed[c] and p[4] + p[6] <= relaxed_tpot and p[5] <= relaxed_ttft
        ]
        if fits:
            if all(p[2] < p[3].lowest for p in fits):
                # quieter than anything measured on either pool (the curves are held flat
                # below their lowest point, which says nothing of how they compare there): by
                # its own time per token, as with room under the strict capacity
                best = min(fits, key=_own)
            else:
                # the other pool before the one taken last (the strict pool, or the one with
                # clearly more strict room: it keeps its requests within the strict SLO), then
                # the engine filled least against its relaxed capacity
                best = _least_filled(fits, c, surf.last[c])
    if best is None:
        best, reason = _overflow(snap, surf, picks, c, prompt, ttft, tpot)
    view, b, n, cap, _, _, _, predicted = best
    measured = cap.measured
    row = cap.tpot[c]
    # (the named tuples built as tuples: a third of what their constructors cost)
    decision = _new(
        Decision,
        (
            view.name,
            b.url,
            reason,
            0,
            0.0,
            predicted * scale,
            (row[n] if n < len(row) else row[-1]) * scale,
            n > (measured if measured > 1 else 1) or n < cap.lowest,
            0.0,
        ),
    )
    return decision, _new(RoutingState, (rr + 1, state.above))


# One candidate of the slo policy: its pool's view, the engine, its load with the request,
# the pool's capacity, the request's time per token and to first token there (as busy as the
# engine has been lately), what its prefill adds to each request running there, and its time to
# first token at that load (without the prefills ahead).
_Pick = tuple[PoolView, BackendView, int, Capacity, float, float, float, float]


def _own(p: _Pick) -> float:
    return p[4]


def _least_filled(picks: list[_Pick], c: int, last: Pool | None) -> _Pick:
    """The candidate filled least against its relaxed capacity, the pool ``last`` after the
    other (``min`` by ``(pool is last, fill)``, the first of equals, written out: no key
    function or tuple per candidate)."""
    best = picks[0]
    best_last = best[0].name == last
    relaxed = best[3].relaxed[c]
    best_fill = best[2] / (relaxed if relaxed > 1 else 1)
    for p in picks[1:]:
        is_last = p[0].name == last
        if is_last and not best_last:
            continue
        relaxed = p[3].relaxed[c]
        fill = p[2] / (relaxed if relaxed > 1 else 1)
        if (best_last and not is_last) or fill < best_fill:
            best, best_last, best_fill = p, is_last, fill
    return best


def _overflow(
    snap: Snapshot,
    surf: Surface,
    picks: list[_Pick],
    c: int,
    prompt: float,
    ttft: float,
    tpot: float,
) -> tuple[_Pick, Reason]:
    """Step 3 of ``slo``: no engine has room for the request within the relaxed SLO."""
    # what a queued request waits for is a place: an engine whose load keeps it within the
    # relaxed targets; with one left (it missed on its own prefill's harm or the prefills sent
    # there lately), a release would not bring the room it lacks, so it is not held either
    relaxed_tpot = tpot * RELAXED_TPOT
    place = False
    served = 0.0
    for view, _, n, cap, _, _, _, _ in picks:
        if not place and n <= cap.relaxed[c]:
            table = cap.tpot[c]
            place = (table[n] if n < len(table) else table[-1]) <= relaxed_tpot
        served += cap.relaxed_rate * (len(view.backends) if view.even else view.usable_count())
    reason: Reason = "beyond_slo"
    if not place:
        # it overflows (the router's queue, when on, holds it until one has), unless it would
        # miss that SLO even alone (looked at only here: with a place, it is not held anyway)
        relaxed_ttft = ttft * RELAXED_TTFT
        for p in picks:
            cap = p[3]
            if cap.ttft(prompt, 1) <= relaxed_ttft and cap.own_tpot(c, 1, 0.0) <= relaxed_tpot:
                reason = "overflow"
                break
    # sustained overload: requests arrive faster than the engines serve within the relaxed SLO
    offered = snap.offered
    if offered is not None and offered > served * surf.params.overload:
        keep = surf.strict_pool[c]
        if keep is not None:
            # away from the strict pool, so that it keeps serving within the strict SLO
            return _least_filled(picks, c, keep), reason
        most = surf.most
        for p in picks:
            if p[0].name == most:
                return p, reason
        return picks[0], reason
    return _least_filled(picks, c, None), reason


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
