"""The decision shell: snapshots built from the tracker, health, keeper and engine loads.

Real ``InflightTracker`` and ``HealthRegistry``, a plain stand-in for the keeper, a dict of
``EngineLoad`` and a clock the test moves: no sockets, no sleeping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pytest

from router.account.inflight import InflightTracker, Lease
from router.account.outcome import Outcome
from router.decide.policy import Decision, offered, pool_slo_capacity
from router.decide.predict import Gain, PoolModel, Request
from router.decide.snapshot import Traffic
from router.forward.decider import Decider
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


def slo_world() -> World:

    w = world(policy="slo")
    w.tuning.models = {SPECULATIVE: preset_model(EAGLE3), BASELINE: preset_model(BASE_PRESET)}
    return w


def test_expected_load_is_arrival_rate_times_measured_stay() -> None:
    w = slo_world()
    req = Request(100.0, 50.0, False, 1.0, 0.025)
    # one request a second for 30 s, each held 2 s (on whichever backend it was sent to)
    held: list[tuple[float, Lease]] = []
    for _ in range(30):
        d = w.decider.decide(req)
        assert d is not None
        held.append((w.clock.now + 2.0, w.tracker.acquire(d.backend)))
        for _ in range(10):
            w.clock.now += 0.1
            for end, lease in held:
                if end <= w.clock.now:
                    lease.release()
    status = w.decider.status()
    expected = sum(b["expected_load"] or 0.0 for b in status["backends"].values())
    # Little's law: 1 request/s x 2 s = 2 requests in flight across the backends
    assert expected == pytest.approx(2.0, rel=0.25)
    shares = [b["prefill_share"] for b in status["backends"].values()]
    # each request's 100-token prefill (~0.07 s) over a second: a few percent in all
    assert 0.02 < sum(shares) < 0.2
    # what arrives against what the usable backends can serve, as the policy's pressure rule
    # measures it for the next request: one request a second is far from overload
    assert w.tuning.models is not None
    assert status["offered"] == pytest.approx(
        offered(w.decider.snapshot(req), w.tuning.models), abs=0.001
    )
    assert 0.05 < status["offered"] < 0.5
    # and what each pool serves within the relaxed SLO, at the traffic's size (requests/s)
    within = status["within_slo"]
    snap = w.decider.snapshot(req)
    for view in (snap.speculative, snap.baseline):
        model = w.tuning.models[view.name]
        h = pool_slo_capacity(view, model)
        assert within[view.name] == {
            "requests_per_s": pytest.approx(h.rate / model.scale, abs=0.001),
            "running": h.running,
        }
        assert h.rate > 0 and h.running >= 1


def test_the_slo_policy_sees_each_request_in_flight_and_the_stream() -> None:
    w = slo_world()
    req = Request(1000.0, 200.0, True, 1.0, 0.025)
    streamed = Outcome("/v1/chat/completions", w.clock.now, stream=True)
    streamed.request = req
    whole = Outcome("/v1/chat/completions", w.clock.now, stream=False)
    whole.request = req._replace(sampling=False)
    held = [w.tracker.acquire(B1, streamed), w.tracker.acquire(B1, whole), w.tracker.acquire(B1)]
    w.clock.now += 0.2
    flights = w.decider.snapshot(req).baseline.backends[0].flights
    # two known (the third lease carries nothing: it counts in the load only), none decoding yet
    assert [(f.prompt, f.sampling, f.decoding) for f in flights] == [
        (1000.0, True, None),
        (1000.0, False, None),
    ]
    assert all(f.age == pytest.approx(0.2) for f in flights)
    streamed.first_bytes(w.clock.now, 0.0)
    w.clock.now += 1.0
    by_class = {f.sampling: f for f in w.decider.snapshot(req).baseline.backends[0].flights}
    # a stream decodes from its first byte; a whole answer's progress is guessed from the model
    # (its prefill of 1,000 tokens and one iteration: about 0.45 s after it was sent)
    assert by_class[True].decoding == pytest.approx(1.0)
    model = preset_model(BASE_PRESET)
    assert by_class[False].decoding == pytest.approx(1.2 - model.prefill(1000) - model.iteration(1))
    for lease in held:
        lease.release()
    assert w.decider.snapshot(req).baseline.backends[0].flights == ()
    # the stream: what was sent there recently, at the mean size of what was routed
    for _ in range(20):
        d = w.decider.decide(req)
        assert d is not None
        w.clock.now += 0.5
    views = w.decider.snapshot(req).speculative.backends + w.decider.snapshot(req).baseline.backends
    streams = [b.stream for b in views]
    assert all(s is not None for s in streams)
    total = sum(s.rate for s in streams if s is not None)
    # 2 requests a second, over the larger of the 5 s and the 30 s windows (10 s of them)
    assert 1.0 < total < 3.0
    s = next(s for s in streams if s is not None)
    assert (s.prompt, s.output, s.slo_ttft, s.slo_tpot) == (1000.0, 200.0, 1.0, 0.025)
