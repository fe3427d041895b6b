"""The decision shell: snapshots built from the tracker, health, keeper and engine loads.

Real ``InflightTracker`` and ``HealthRegistry``, a plain stand-in for the keeper, a dict of
``EngineLoad`` and a clock the test moves: no sockets, no sleeping.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

import pytest

from router.account.inflight import InflightTracker, Lease
from router.decide.capacity import Mix, Slo, Steps, Surface, surface_steps
from router.decide.params import Params
from router.decide.policy import Decision, PoolView, choose
from router.decide.predict import Gain, PoolModel, Request
from router.decide.snapshot import Traffic
from router.forward.decider import PER_REFRESH, Decider, SurfaceSteps
from router.health.poller import EngineLoad
from router.health.state import HealthConfig, HealthRegistry
from router.pools import BASELINE, POOLS, SPECULATIVE, Pool
from router.settings import LoadSignal, PolicyName
from router.sim.model import BASELINE as BASE_PRESET
from router.sim.model import EAGLE3
from tests.support.models import preset_model

S1, S2, B1 = "http://s1", "http://s2", "http://b1"
POOL_URLS: dict[Pool, list[str]] = {SPECULATIVE: [S1, S2], BASELINE: [B1]}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Tuning:
    """What the decider reads from the keeper, as plain values the test sets."""

    crossover: int = 4
    no_crossover: bool = False
    gain: Gain | None = None
    models: Mapping[Pool, PoolModel] | None = None
    traffic: Traffic = Traffic()


@dataclass
class World:
    decider: Decider
    tracker: InflightTracker
    health: HealthRegistry
    tuning: Tuning
    loads: dict[str, EngineLoad]
    clock: Clock

    def hold(self, url: str, n: int = 1) -> list[Lease]:
        return [self.tracker.acquire(url) for _ in range(n)]

    def scrape(self, url: str, running: int, queued: int = 0) -> None:
        """What the poller records: the engine's counts, and how many were sent there by then."""
        self.loads[url] = EngineLoad(
            running, queued, None, self.clock(), self.tracker.started[url], "sglang"
        )

    def loads_seen(self) -> dict[str, int]:
        snap = self.decider.snapshot()
        return {b.url: b.load for pool in (snap.speculative, snap.baseline) for b in pool.backends}


def world(
    policy: PolicyName = "spillover",
    load_signal: LoadSignal = "local",
    explore_share: float = 0.0,
    explore_band: int = 2,
    ramp_seconds: float = 0.0,
    healthy: bool = True,
    surfaces: SurfaceSteps = surface_steps,
) -> World:
    clock = Clock()
    tracker = InflightTracker([(p, u) for p in POOLS for u in POOL_URLS[p]], clock)
    health = HealthRegistry([S1, S2, B1], HealthConfig(ramp_seconds=ramp_seconds), clock())
    if healthy:
        for url in (S1, S2, B1):
            health.probe(url, True, clock())
    tuning = Tuning()
    loads: dict[str, EngineLoad] = {}
    decider = Decider(
        POOL_URLS,
        tracker,
        health,
        tuning,
        loads,
        policy=policy,
        hysteresis=1,
        load_signal=load_signal,
        clock=clock,
        explore_share=explore_share,
        explore_band=explore_band,
        surfaces=surfaces,
    )
    return World(decider, tracker, health, tuning, loads, clock)


# -- the snapshot ----------------------------------------------------------------------------------


def test_the_snapshot_carries_counts_health_and_the_keepers_values() -> None:
    w = world(ramp_seconds=10.0)
    w.hold(S1, 2)
    w.hold(B1, 1)

    def gain(pool: Pool, load: int) -> float:
        return 0.0

    w.tuning.crossover, w.tuning.gain = 9, gain
    w.clock.now += 5.0  # halfway through the ramp after the first good probe
    w.health.eject(S2, w.clock(), "connect")
    snap = w.decider.snapshot()
    assert snap.speculative.name == SPECULATIVE and snap.baseline.name == BASELINE
    assert [(b.url, b.load, b.usable) for b in snap.speculative.backends] == [
        (S1, 2, True),
        (S2, 0, False),
    ]
    assert [(b.url, b.load, b.usable) for b in snap.baseline.backends] == [(B1, 1, True)]
    assert snap.speculative.backends[0].weight == pytest.approx(0.5)
    assert (snap.crossover, snap.hysteresis, snap.gain) == (9, 1, gain)


def test_a_backend_not_yet_seen_healthy_is_not_usable() -> None:
    w = world(healthy=False)
    snap = w.decider.snapshot()
    assert not any(b.usable for b in snap.speculative.backends + snap.baseline.backends)
    assert w.decider.decide() is None


def test_the_snapshot_reads_the_keeper_at_every_decision() -> None:
    w = world()
    first = w.decider.decide()
    assert first is not None and (first.pool, first.reason) == (SPECULATIVE, "below_crossover")
    w.tuning.crossover = 0  # the keeper moved it: the very next decision sees it
    second = w.decider.decide()
    assert second == Decision(BASELINE, B1, "above_crossover")


# -- load signals ----------------------------------------------------------------------------------


def engine_state(signal: LoadSignal) -> World:
    """S1: 2 in flight at a scrape that saw 5 running + 1 queued, then 1 more sent (and 1 more
    sent and finished); S2: 1 in flight, the engine idle at the scrape; B1: 2, never scraped."""
    w = world(load_signal=signal)
    w.hold(S1, 2)
    w.hold(S2, 1)
    w.hold(B1, 2)
    w.scrape(S1, running=5, queued=1)
    w.scrape(S2, running=0)
    w.hold(S1, 1)
    for lease in w.hold(S1, 1):
        lease.release()
    return w


@pytest.mark.parametrize(
    ("signal", "expected"),
    [
        ("local", {S1: 3, S2: 1, B1: 2}),
        # reported running + queued, plus the requests sent since that scrape
        ("engine", {S1: 5 + 1 + 2, S2: 0, B1: 2}),
        ("max", {S1: 8, S2: 1, B1: 2}),
    ],
)
def test_load_signals(signal: LoadSignal, expected: dict[str, int]) -> None:
    w = engine_state(signal)
    assert {url: w.decider.backend_load(url) for url in (S1, S2, B1)} == expected
    assert w.loads_seen() == expected


def test_a_new_scrape_absorbs_the_requests_sent_before_it() -> None:
    w = world(load_signal="engine")
    w.scrape(S1, running=0)
    w.hold(S1, 3)
    assert w.decider.backend_load(S1) == 3
    w.scrape(S1, running=3)  # the engine now reports them itself: not counted twice
    assert w.decider.backend_load(S1) == 3


def test_the_engine_signal_routes_on_what_the_engine_reports() -> None:
    w = world(load_signal="engine")
    w.tuning.crossover = 4
    # this replica sent nothing, but the engines are busy with another replica's requests
    w.scrape(S1, running=4)
    w.scrape(S2, running=5)
    assert w.decider.decide() == Decision(BASELINE, B1, "above_crossover")
    local = world(load_signal="local")
    decision = local.decider.decide()
    assert decision is not None and decision.pool == SPECULATIVE


# -- exploration -----------------------------------------------------------------------------------


def reasons(w: World, n: int) -> list[str]:
    out = []
    for _ in range(n):
        decision = w.decider.decide()
        assert decision is not None
        out.append(f"{decision.pool}:{decision.reason}")
    return out


def test_exploration_spends_a_credit_of_one_request_in_share() -> None:
    w = world(explore_share=0.5)
    w.hold(S1, 3)  # 3 in flight against a crossover of 4: inside the band
    assert reasons(w, 4) == [
        "speculative:below_crossover",
        "baseline:explore",
        "speculative:below_crossover",
        "baseline:explore",
    ]


def test_no_exploration_outside_the_band_and_no_credit_saved_up_there() -> None:
    w = world(explore_share=0.5, explore_band=1)
    w.tuning.crossover = 10  # 0 in flight: 10 away from the crossover
    assert reasons(w, 4) == ["speculative:below_crossover"] * 4
    w.tuning.crossover = 1  # now inside: the first in-band request earns only its share
    assert reasons(w, 2) == ["speculative:below_crossover", "baseline:explore"]


def test_exploration_waits_for_the_other_pool_and_keeps_its_credit() -> None:
    w = world(explore_share=0.5)
    w.tuning.crossover = 2  # 0 in flight: inside the band
    w.health.eject(B1, w.clock(), "connect")  # out for the 1 s base back-off
    assert reasons(w, 3) == ["speculative:below_crossover"] * 3
    w.clock.now += 1.0
    assert reasons(w, 1) == ["baseline:explore"]


@pytest.mark.parametrize(("policy", "share"), [("round_robin", 0.5), ("spillover", 0.0)])
def test_no_exploration_for_round_robin_or_a_zero_share(policy: PolicyName, share: float) -> None:
    w = world(policy=policy, explore_share=share)
    w.tuning.crossover = 1  # inside the band: only the policy or the share keeps it home
    assert not any(r.endswith(":explore") for r in reasons(w, 6))


# -- retries and readiness -------------------------------------------------------------------------


def test_a_retry_goes_to_another_replica_then_to_the_other_pool() -> None:
    w = world()
    failed = Decision(SPECULATIVE, S1, "below_crossover")
    assert w.decider.retry(failed, {S1}) == Decision(SPECULATIVE, S2, "retry")
    assert w.decider.retry(failed, {S1, S2}) == Decision(BASELINE, B1, "failover")
    assert w.decider.retry(failed, {S1, S2, B1}) is None


def test_a_retry_sees_health_as_it_is_now() -> None:
    w = world()
    failed = Decision(SPECULATIVE, S1, "below_crossover")
    w.health.eject(S2, w.clock(), "reset")
    assert w.decider.retry(failed, {S1}) == Decision(BASELINE, B1, "failover")


def test_pool_usable_follows_health_and_the_clock() -> None:
    w = world()
    assert [w.decider.pool_usable(p) for p in POOLS] == [True, True]
    w.health.eject(B1, w.clock(), "connect")
    w.health.eject(S1, w.clock(), "connect")
    assert [w.decider.pool_usable(p) for p in POOLS] == [True, False]  # S2 still serves
    w.clock.now += 1.0  # the back-off is over
    assert w.decider.pool_usable(BASELINE) is True
    assert [world(healthy=False).decider.pool_usable(p) for p in POOLS] == [False, False]


# -- the slo policy's view: recent prefill share and expected load -------------------------------


def slo_world(surfaces: SurfaceSteps = surface_steps) -> World:

    w = world(policy="slo", surfaces=surfaces)
    w.tuning.models = {SPECULATIVE: preset_model(EAGLE3), BASELINE: preset_model(BASE_PRESET)}
    return w


def route(w: World, req: Request, n: int, every: float, hold: float = 2.0) -> list[Decision]:
    """``n`` requests ``every`` seconds apart, each held ``hold`` seconds where it was sent."""
    held: list[tuple[float, Lease]] = []
    decisions = []
    for _ in range(n):
        d = w.decider.decide(req)
        assert d is not None
        decisions.append(d)
        held.append((w.clock.now + hold, w.tracker.acquire(d.backend)))
        w.clock.now += every
        for end, lease in list(held):
            if end <= w.clock.now:
                lease.release()
                held.remove((end, lease))
    for _, lease in held:
        lease.release()
    return decisions


def test_reading_changes_nothing_the_next_decision_sees() -> None:
    # two routers fed the same requests at the same times; one is read between every two
    # decisions (peek, snapshot, status, the surface: the live page's timer, /router/status)
    req = Request(400.0, 200.0, False, 1.0, 0.025)
    quiet, read = slo_world(), slo_world()
    for w in (quiet, read):
        w.decider.refresh()
    first = quiet.decider.peek(req)
    for _ in range(3):
        assert read.decider.peek(req) == first
    for w in (quiet, read):
        w.clock.now += 1.0
    decided: dict[int, list[Decision]] = {0: [], 1: []}
    for step in range(120):
        for i, w in enumerate((quiet, read)):
            if i == 1:
                for _ in range(3):
                    w.decider.peek(req)
                    w.decider.snapshot(req)
                    w.decider.status()
                    w.decider.surface()
            d = w.decider.decide(req)
            assert d is not None
            decided[i].append(d)
            w.tracker.acquire(d.backend)  # (held: the load climbs)
            w.clock.now += 0.05
            if step % 40 == 39:
                w.decider.refresh()
    assert decided[0] == decided[1]
    # (and the load climbed through more than one rule: the test covered more than one step)
    assert len({d.reason for d in decided[0]}) > 1


Computed = list[tuple[Mapping[Pool, PoolModel], float | None]]


def counting(computed: Computed) -> SurfaceSteps:
    """``surface_steps`` that notes each surface's models and arrival rate in ``computed``."""

    def counted(
        models: Mapping[Pool, PoolModel], mix: Mix, slo: Slo, params: Params, arriving: float | None
    ) -> Steps[Surface]:
        computed.append((models, arriving))
        return surface_steps(models, mix, slo, params, arriving)

    return counted


def test_surfaces_are_computed_on_the_timer_not_per_decision() -> None:
    computed: Computed = []
    w = slo_world(counting(computed))
    req = Request(400.0, 200.0, False, 1.0, 0.025)
    # before any tick: the first decision with curves computes its own (nothing else known)
    assert w.decider.decide(req) is not None
    assert len(computed) == 1
    w.decider.refresh()
    done = len(computed)
    # the arrival rate climbs through several rate buckets: decisions take the nearest known
    route(w, req, 200, every=0.01)
    assert len(computed) == done
    # the next tick computes the current one and the ones asked for, at most PER_REFRESH
    w.decider.refresh()
    assert done < len(computed) <= done + PER_REFRESH


def slower(models: Mapping[Pool, PoolModel] | None) -> dict[Pool, PoolModel]:
    """``models`` with prefills three times as long (new models, a different surface)."""
    assert models is not None
    return {pool: m._replace(prefill_base=m.prefill_base * 3) for pool, m in models.items()}


def test_models_moved_by_the_timer_are_not_computed_on_the_hot_path() -> None:
    """A keeper tick that moved the models: until that tick's surfaces are in, decisions take
    the nearest one of the models before, and none computes its own (the router's loop would
    stall for the tens of milliseconds a surface takes)."""
    computed: Computed = []
    w = slo_world(counting(computed))
    req = Request(400.0, 200.0, False, 1.0, 0.025)
    route(w, req, 20, every=0.05)
    w.decider.refresh()
    before = w.decider.surface()
    assert before is not None
    done = len(computed)
    # the timer: new (slower) models, then the job for them, computed later
    moved = slower(w.tuning.models)
    w.tuning.models = moved
    job = w.decider.pending()
    assert job is not None and job.models is moved
    route(w, req, 20, every=0.05)
    assert len(computed) == done  # (decisions took the old models' surface meanwhile)
    assert w.decider.surface() == before
    w.decider.install(job, job.compute())
    after = w.decider.surface()
    assert after is not None and after != before
    assert all(models is moved for models, _ in computed[done:])


def test_models_replaced_off_the_timer_are_computed_at_once() -> None:
    """New models with no tick between (an operator's PUT of a table): the next decision
    computes the surface of the new models, not an old one's."""
    w = slo_world()
    req = Request(400.0, 200.0, False, 1.0, 0.025)
    route(w, req, 20, every=0.05)
    w.decider.refresh()
    before = w.decider.surface()
    w.tuning.models = slower(w.tuning.models)
    after = w.decider.surface()
    assert after is not None and after != before


def test_status_says_the_rule_and_the_capacities() -> None:
    w = slo_world()
    route(w, Request(400.0, 200.0, True, 1.0, 0.025), 30, every=0.5)
    w.decider.refresh()
    status = w.decider.status()
    assert status["deciding_as"] == "slo"
    assert status["rule"] == decider_module_rule()
    surf = w.decider.surface()
    assert surf is not None
    for pool in POOLS:
        cap = surf.pools[pool]
        shown = status["pools"][pool]
        assert shown["strict_capacity"] == {"greedy": cap.strict[0], "sampling": cap.strict[1]}
        assert shown["relaxed_capacity"] == {"greedy": cap.relaxed[0], "sampling": cap.relaxed[1]}
        assert shown["usable_engines"] == len(POOL_URLS[pool])
    # the overload rule's inputs: 2 requests a second is far from what 3 engines serve
    overload = status["overload"]
    # (a world whose pools hold about as many within the strict SLO: no strict pool, so the
    # excess goes to the pool with the most throughput)
    assert status["strict_pool"] == {"greedy": None, "sampling": None}
    assert surf.strict_pool == (None, None)
    assert overload["excess_to"] == surf.most
    assert overload["threshold"] == w.decider.params.overload
    assert overload["offered_per_s"] == pytest.approx(2.0 * 10 / 30, rel=0.5)
    assert overload["sustained"] is False
    assert overload["served_within_relaxed_per_s"] > overload["offered_per_s"]
    # the mix it was computed for: what was routed (all sampled, 400-token prompts)
    assert status["mix"]["sampling_share"] > 0.9
    assert status["mix"]["prompt_tokens"] == pytest.approx(400.0)
    # the tunables in force, each with where its value came from
    assert set(status["params"]) == set(w.decider.params.provenance())


def decider_module_rule() -> str:
    from router.forward.decider import RULE

    return RULE


def test_deciding_as_says_which_policy_decides_without_curves() -> None:
    # no models: slo decides as spillover, with or without a gain (router.decide.policy.slo)
    assert world(policy="slo").decider.deciding_as == "spillover"
    with_gain = world(policy="slo")
    with_gain.tuning.gain = lambda pool, load: 1.0
    assert with_gain.decider.deciding_as == "spillover"
    predictive = world(policy="predictive")
    predictive.tuning.gain = lambda pool, load: 1.0
    assert predictive.decider.deciding_as == "predictive"
    assert slo_world().decider.deciding_as == "slo"
    assert world(policy="predictive").decider.deciding_as == "spillover"
    others: list[PolicyName] = ["spillover", "crossover", "round_robin"]
    for policy in others:
        assert world(policy=policy).decider.deciding_as == policy


@pytest.mark.parametrize("seed", range(5))
def test_the_kept_views_follow_the_tracker_on_random_leases(seed: int) -> None:
    """The decider keeps each pool's view between decisions and patches only the loads that
    moved: after any series of leases taken and released, the view it hands the policy is the
    tracker's counts, and the decision is the one over a view built from scratch."""
    rng = random.Random(seed)
    w = world()
    held: list[Lease] = []
    for _ in range(300):
        if held and rng.random() < 0.45:
            held.pop(rng.randrange(len(held))).release()
        else:
            held.append(w.tracker.acquire(rng.choice([S1, S2, B1])))
        snap = w.decider.snapshot()
        for pool in (snap.speculative, snap.baseline):
            urls = POOL_URLS[pool.name]
            assert [b.url for b in pool.backends] == urls
            assert [b.load for b in pool.backends] == [w.tracker.by_backend[u] for u in urls]
            assert pool.load == sum(w.tracker.by_backend[u] for u in urls)
        plain = snap._replace(
            speculative=PoolView(SPECULATIVE, snap.speculative.backends),
            baseline=PoolView(BASELINE, snap.baseline.backends),
        )
        assert choose("spillover", snap) == choose("spillover", plain)
    for lease in held:
        lease.release()
