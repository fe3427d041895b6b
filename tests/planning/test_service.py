"""``FleetPlanner`` over plain stand-ins for the router's parts, on a clock of its own: what it
reads, what it advises, how it follows the switch an actuator makes, and what it publishes (the
document and the gauges). The planner in a real router over real sockets: test_plan_e2e.py."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from prometheus_client import CollectorRegistry

from router.health.engines import EngineSample
from router.health.state import BackendHealth, State
from router.members.member import Member
from router.plan import Setting, observe_round
from router.plan.values import Curve, CurveLike, Mix
from router.planning.fleet import SLOT
from router.planning.metrics import PlanCollector
from router.planning.service import (
    ACCEPT_MIN_REQUESTS,
    CURVE_REFRESH,
    CURVE_REFRESH_ROUNDS,
    Accepted,
    FleetPlanner,
    Sample,
    beyond_noise,
    counted_curve,
    counted_steps,
    curve_drift,
    decide,
    holt_document,
    mean_curve,
    mix_moved,
    sample_of,
    state_of,
)
from router.pools import BASELINE, SPECULATIVE, Pool
from router.settings import Settings
from tests.plan.fixtures import BASE, EAGLE3, MIX

INTERVAL = 60.0
CURVES: dict[Pool, CurveLike] = {SPECULATIVE: EAGLE3, BASELINE: BASE}
# what the engines count per request (the mix's means)
PROMPT = sum(MIX.prompts) / len(MIX.prompts)
OUTPUT = sum(MIX.outputs) / len(MIX.outputs)


class Usage(NamedTuple):
    prompt_tokens: int
    completion_tokens: int


class Done(NamedTuple):
    status: int
    usage: Usage | None
    sampling: bool
    error: str | None = None
    client_gone: bool = False


@dataclass
class World:
    """The router's parts the planner reads, as plain values the test moves."""

    now: float = 1000.0
    members: dict[str, Member] = field(default_factory=dict)
    states: dict[str, BackendHealth] = field(default_factory=dict)
    samples: dict[str, EngineSample] = field(default_factory=dict)
    by_backend: dict[str, int] = field(default_factory=dict)
    started: dict[str, int] = field(default_factory=dict)
    models: dict[Pool, CurveLike] | None = field(default_factory=lambda: dict(CURVES))
    incarnation: int = 0

    def clock(self) -> float:
        return self.now

    def join(self, pool: Pool, url: str, healthy: bool = True) -> None:
        self.incarnation += 1
        self.members[url] = Member(pool, url, "admin", None, self.incarnation, self.now)
        state = State.HEALTHY if healthy else State.STARTING
        self.states[url] = BackendHealth(self.now, state, failures=0 if healthy else 1)
        self.samples[url] = EngineSample("sglang", 0.0, 0.0, None, requests_total=0.0,
                                         prompt_total=0.0, generated_total=0.0)  # fmt: skip

    def healthy(self, url: str) -> None:
        self.states[url] = BackendHealth(self.now, State.HEALTHY)

    def drain(self, url: str) -> None:
        self.members[url] = self.members[url].draining(self.now, self.now + 30)

    def remove(self, url: str) -> None:
        del self.members[url], self.states[url], self.samples[url]

    def serve(self, requests: int) -> None:
        """``requests`` end on the engines up, spread evenly (their counters move)."""
        urls = [u for u, m in self.members.items() if m.active]
        for i, url in enumerate(urls):
            n = requests // len(urls) + (i < requests % len(urls))
            s = self.samples[url]
            assert s.requests_total is not None and s.prompt_total is not None
            assert s.generated_total is not None
            self.samples[url] = replace(s, requests_total=s.requests_total + n,
                                        prompt_total=s.prompt_total + PROMPT * n,
                                        generated_total=s.generated_total + OUTPUT * n)  # fmt: skip


def planner(world: World, tmp: Path | None = None, **settings: Any) -> FleetPlanner:
    s = Settings(planner=settings.pop("planner", "autoscale"), plan_interval=INTERVAL,
                 restart_s=500.0, plan_state_path=tmp, **settings)  # fmt: skip
    p = FleetPlanner(s, world, world.states, world, world, world, world.clock,
                     wall=lambda: 1.7e9 + world.now)  # fmt: skip
    # a shorter horizon keeps each plan cheap; the rule is the same (tests/plan)
    p.params = p.params._replace(horizon=3600.0 * p.settings.plan_time_scale)
    for i in range(200):  # the mix: this router's recent requests
        prompt, output = MIX.prompts[i % 4], MIX.outputs[i % 4]
        p.observe(Done(200, Usage(int(prompt), int(output)), sampling=i % 5 != 0))
    p.observe(Done(500, Usage(1, 1), True))  # (failures do not count)
    p.look()  # (the lifecycle's first look, a second after the start)
    return p


def minutes(world: World, p: FleetPlanner, n: int, rate: float) -> None:
    for _ in range(n):
        world.now += INTERVAL
        world.serve(round(rate * INTERVAL))
        p.tick()


def gauges(p: FleetPlanner) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(PlanCollector(p.document))
    return registry


def test_the_planner_waits_for_curves_and_says_so() -> None:
    world = World(models=None)
    world.join(BASELINE, "http://b0")
    p = planner(world)
    minutes(world, p, 2, 1.0)
    doc = p.document()
    assert doc["status"].startswith("waiting for curves")
    assert doc["traffic"]["arrivals"] == 60 and doc["traffic"]["source"] == "engines"
    assert "desired" not in doc and doc["running"] == {SPECULATIVE: 0, BASELINE: 1}


def test_a_quiet_baseline_fleet_is_advised_a_switch_followed_to_its_landing() -> None:
    world = World()
    for i in range(4):
        world.join(BASELINE, f"http://b{i}")
    world.by_backend = {"http://b0": 3, "http://b1": 0, "http://b2": 2, "http://b3": 5}
    # a strict TPOT of 18 ms: the baseline's ~20 ms misses it at any load, the speculative
    # engines meet it when quiet, so one engine to speculation is clearly worth its restart
    p = planner(world, gpu_budget=4, slo_tpot_ms=18.0)
    minutes(world, p, 4, 1.0)
    assert p.document()["switch"] is None and "warming up" in p.document()["reason"]
    minutes(world, p, 2, 1.0)
    doc = p.document()
    assert doc["status"] == "planning"
    assert doc["traffic"] == {
        "seconds": 60.0, "arrivals": 60, "rate": 1.0, "intervals": 1, "source": "engines",
        "prompt_mean": PROMPT, "output_mean": OUTPUT, "mix_requests": 200,
    }  # fmt: skip
    # what the planner was given: 60 arrivals a minute are enough on their own (the window is
    # the interval), the token means over every request counted so far (fewer than 400)
    est = doc["estimate"]
    assert (est["arrivals"], est["seconds"], est["rate"]) == (60, 60.0, 1.0)
    assert est["lower"] < 1.0 < est["upper"] and est["means_over"] == 6 * 60
    assert (est["prompt_mean"], est["output_mean"]) == (PROMPT, OUTPUT)
    sw = doc["switch"]
    assert sw is not None and doc["action"] is not None, doc["reason"]
    # the least loaded baseline engine, into speculative; the baseline pool lowered first
    assert (sw["engine"], sw["from"], sw["into"], sw["phase"]) == (
        "http://b1",
        BASELINE,
        SPECULATIVE,
        "advised",
    )
    assert doc["action"] == {"engine": "http://b1", "into": SPECULATIVE, "switch_id": sw["id"]}
    assert doc["targets"] == doc["desired_engines"] == {SPECULATIVE: 0, BASELINE: 3}
    assert doc["off_plan_engines"] == 1
    assert doc["desired"][SPECULATIVE] > doc["current"][SPECULATIVE] == 0
    assert doc["next_switch"]["gain"] > 0.01 and doc["next_switch"]["blocked"] == ""
    assert doc["history"][0]["action"] == {"engine": "http://b1", "into": SPECULATIVE}
    assert len(doc["forecast"]["point"]) == len(doc["forecast"]["upper"]) == 60
    json.dumps(doc, allow_nan=False)  # (a plain JSON document)
    reg = gauges(p)
    assert reg.get_sample_value("spec_router_plan_desired_engines", {"pool": BASELINE}) == 3
    assert reg.get_sample_value("spec_router_plan_switches_advised_total") == 1
    assert reg.get_sample_value("spec_router_plan_switch_in_flight") == 0
    # advised again at the next plan: the same switch, the same id
    minutes(world, p, 1, 1.0)
    assert p.document()["switch"]["id"] == sw["id"]
    # the actuator drains b1: seen at the next look (not only at the next plan)
    world.now += 1
    world.drain("http://b1")
    p.look()
    doc = p.document()
    assert doc["switch"]["phase"] == "draining" and doc["switch"]["draining"] == "http://b1"
    assert doc["running"] == doc["targets"] == {SPECULATIVE: 0, BASELINE: 3}
    assert [e["status"] for e in doc["fleet"]].count("draining") == 1
    assert gauges(p).get_sample_value("spec_router_plan_switch_in_flight") == 1
    # removed: now the speculative pool is raised
    world.now += 5
    world.remove("http://b1")
    left = world.now
    p.look()
    doc = p.document()
    assert doc["switch"]["phase"] == "restarting"
    assert doc["targets"] == {SPECULATIVE: 1, BASELINE: 3}
    loading = [e for e in doc["fleet"] if e["status"] == "loading"]
    assert [(e["engine"], e["mode"], e["eta_s"]) for e in loading] == [
        ("http://b1", SPECULATIVE, 500.0)
    ]
    # nothing more is advised while it is in flight, whatever the plans say
    minutes(world, p, 2, 1.0)
    assert p.document()["switch"]["id"] == sw["id"]
    assert "in flight" in p.document()["reason"]
    # it comes back in the speculative pool, loading, then healthy 430 s after it left
    world.join(SPECULATIVE, "http://b1", healthy=False)
    p.look()
    assert p.document()["switch"]["phase"] == "loading"
    world.now = left + 430.0
    world.healthy("http://b1")
    p.look()
    doc = p.document()
    assert doc["switch"] is None
    assert doc["running"] == doc["targets"] == {SPECULATIVE: 1, BASELINE: 3}
    assert doc["restart_s"][SPECULATIVE] == {
        "seconds": 430.0, "source": "observed", "samples": [430.0]
    }  # fmt: skip
    assert doc["restart_s"][BASELINE]["source"] == "configured"


def test_advisory_holds_the_gauge_autoscalers_follow_at_what_runs() -> None:
    world = World()
    for i in range(4):
        world.join(BASELINE, f"http://b{i}")
    p = planner(world, planner="advisory", slo_tpot_ms=18.0)  # (the switch's worth: above)
    minutes(world, p, 7, 1.0)
    doc = p.document()
    assert doc["switch"] is not None  # the advice is there all the same
    assert doc["targets"] == {SPECULATIVE: 0, BASELINE: 3}
    assert doc["desired_engines"] == doc["running"] == {SPECULATIVE: 0, BASELINE: 4}
    reg = gauges(p)
    assert reg.get_sample_value("spec_router_plan_desired_engines", {"pool": BASELINE}) == 4
    assert reg.get_sample_value("spec_router_plan_advised_engines", {"pool": BASELINE}) == 3


def test_the_forecast_is_kept_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "plan-state.json"
    world = World()
    world.join(BASELINE, "http://b0")
    p = planner(world, path)
    minutes(world, p, 3, 2.0)
    saved = json.loads(path.read_text())
    assert saved["holt"]["seen"] == 3 and saved["interval_s"] == INTERVAL
    again = planner(world, path)
    assert again.state.holt is not None and again.state.holt.seen == 3
    kept = holt_document(again.state.holt, INTERVAL, again.mix, again.mix_sample)
    assert json.loads(json.dumps(kept)) == saved
    # a surge's band term, mid-fade, is kept too
    saved["holt"]["burst"] = 0.75
    path.write_text(json.dumps(saved))
    fading = planner(world, path).state.holt
    assert fading is not None and fading.burst == 0.75
    # so is how long ago an interval's own count last tripped the clip (none: null in JSON)
    assert saved["holt"]["surged"] is None
    saved["holt"]["surged"] = 120.0
    path.write_text(json.dumps(saved))
    held = planner(world, path).state.holt
    assert held is not None and held.surged == 120.0
    # another interval: it starts afresh rather than misread the rates
    assert planner(world, path, plan_time_scale=0.5).state.holt is None
    path.write_text("{not json")
    assert planner(world, path).state.holt is None


@pytest.mark.parametrize("scale", [1.0, 0.01])
def test_durations_are_wall_seconds_at_the_time_scale(scale: float) -> None:
    world = World()
    world.join(BASELINE, "http://b0")
    p = planner(world, plan_time_scale=scale)
    assert p.interval == INTERVAL * scale
    assert p.restart(SPECULATIVE) == 500.0 * scale
    assert p.params.dwell_to_speculative == 1800.0 * scale


def test_a_gpu_of_the_budget_no_engine_holds_is_started_and_its_pool_raised_at_once() -> None:
    world = World()
    for i in range(3):
        world.join(BASELINE, f"http://b{i}")
    p = planner(world, gpu_budget=4)
    minutes(world, p, 1, 3.0)
    assert [(e["engine"], e["status"]) for e in p.document()["fleet"]][-1] == (
        "gpu-slot-1", "down"
    )  # fmt: skip
    minutes(world, p, 7, 3.0)
    doc = p.document()
    sw = doc["switch"]
    assert sw is not None and (sw["engine"], sw["phase"]) == ("gpu-slot-1", "restarting")
    assert doc["targets"][sw["into"]] == doc["running"][sw["into"]] + 1
    assert sum(doc["targets"].values()) == 4  # (the budget, not more)
    # a new pod joins that pool: the start lands once it is healthy
    world.now += 10
    world.join(sw["into"], "http://new", healthy=False)
    p.look()
    assert p.document()["switch"]["landed"] == "http://new"
    world.now += 300
    world.healthy("http://new")
    p.look()
    doc = p.document()
    assert doc["switch"] is None and sum(doc["running"].values()) == 4
    assert "gpu-slot-1" not in {e["engine"] for e in doc["fleet"]}


class StubWorker(NamedTuple):
    pid: int | None = 4242
    restarts: int = 1
    failures: int = 1
    last_failure: str | None = "the plan worker died (exit -9)"


def test_a_lost_round_leaves_the_last_plan_marked_stale_until_the_next() -> None:
    world = World()
    for i in range(2):
        world.join(BASELINE, f"http://b{i}")
    p = planner(world)
    minutes(world, p, 2, 1.0)
    made = p.document()
    assert made["status"] == "planning" and made["stale"] is False
    world.now += INTERVAL
    world.serve(60)
    p.failed(p.gather(), "the plan worker died (exit -9)", StubWorker())
    doc = p.document()
    assert doc["stale"] is True and doc["status"].startswith("stale: the plan worker died")
    assert doc["desired"] == made["desired"] and doc["reason"] == made["reason"]
    assert doc["worker"] == {"pid": 4242, "restarts": 1, "failures": 1,
                             "last_failure": "the plan worker died (exit -9)"}  # fmt: skip
    reg = gauges(p)
    assert reg.get_sample_value("spec_router_plan_stale") == 1
    assert reg.get_sample_value("spec_router_plan_worker_restarts_total") == 1
    minutes(world, p, 1, 1.0)
    assert (
        p.document()["stale"] is False and gauges(p).get_sample_value("spec_router_plan_stale") == 0
    )


def scaled(curve: Curve, by: float) -> Curve:
    return curve._replace(spi=tuple(x * by for x in curve.spi))


def test_plans_hold_their_curves_until_they_move_and_a_refresh_is_due() -> None:
    world = World()
    world.join(BASELINE, "http://b0")
    p = planner(world)
    first = p.setting()
    assert first is not None and first.speculative == EAGLE3 and p.curve_updates == 0

    def rounds(n: int = CURVE_REFRESH_ROUNDS) -> Setting:
        for _ in range(n):
            s = p.setting()
        assert s is not None
        return s

    # learning moves them a little: the plan keeps what it had (its model's caches stay warm)
    world.models = {SPECULATIVE: scaled(EAGLE3, 1.01), BASELINE: BASE}
    world.now += CURVE_REFRESH + 1
    assert rounds().speculative == EAGLE3
    # the readings' mean moves past the tolerance (at the 11th reading of 1.05: 30 at 1.01
    # and 11 at 1.05 average 1.0207, 10 average 1.0203 < 1 / 0.98): replaced by that mean, a
    # refresh being due
    world.models = {SPECULATIVE: scaled(EAGLE3, 1.05), BASELINE: BASE}
    rounds(10)
    assert p.curve_updates == 0
    taken = rounds(1).speculative
    assert p.curve_updates == 1
    assert taken.spi == pytest.approx(scaled(EAGLE3, (30 * 1.01 + 11 * 1.05) / 41).spi)
    # more than the tolerance, but the last replacement is recent: still held
    world.models = {SPECULATIVE: scaled(EAGLE3, 1.10), BASELINE: BASE}
    world.now += CURVE_REFRESH / 2
    assert rounds().speculative == taken
    world.now += CURVE_REFRESH / 2
    due = rounds(1)
    assert due.speculative.spi == pytest.approx(scaled(EAGLE3, 1.10).spi) and p.curve_updates == 2
    # a new shape (another running cap) is taken at once, its reading as it is
    world.models = {SPECULATIVE: EAGLE3._replace(cap=32), BASELINE: BASE}
    world.now += 1
    new = p.setting()
    assert new is not None and new.speculative == EAGLE3._replace(cap=32) and p.curve_updates == 3


def test_one_reading_far_off_does_not_move_the_curves_their_readings_mean_does() -> None:
    """The acceptance is a gauge of the engines' last few iterations: one reading 9% low
    among readings that agree with the held curves moves their mean 0.3%."""
    world = World()
    world.join(BASELINE, "http://b0")
    p = planner(world)
    p.setting()
    world.now += CURVE_REFRESH + 1
    low = EAGLE3._replace(tau_greedy=EAGLE3.tau_greedy * 0.91,
                          tau_sampling=EAGLE3.tau_sampling * 0.91)  # fmt: skip
    for i in range(CURVE_REFRESH_ROUNDS + 1):
        world.models = {SPECULATIVE: low if i == CURVE_REFRESH_ROUNDS else EAGLE3, BASELINE: BASE}
        s = p.setting()
    assert s is not None and s.speculative == EAGLE3 and p.curve_updates == 0
    # readings that stay low move the mean past the tolerance: then they are taken
    world.models = {SPECULATIVE: low, BASELINE: BASE}
    while p.curve_updates == 0:
        s = p.setting()
    assert s is not None and len(p.readings[SPECULATIVE]) == 0
    assert 0.91 * EAGLE3.tau_sampling < s.speculative.tau_sampling < 0.98 * EAGLE3.tau_sampling


def test_the_mean_of_curves_is_number_by_number_with_the_newest_cap() -> None:
    a = Curve((0.01, 0.02), 3.0, 2.0, 0.03, 0.0004, 16)
    b = Curve((0.03, 0.04), 2.0, 1.0, 0.05, 0.0002, 32)
    assert mean_curve([a]) == a
    m = mean_curve([a, b])
    assert m.spi == pytest.approx((0.02, 0.03)) and m.cap == 32
    assert (m.tau_greedy, m.tau_sampling) == (2.5, 1.5)
    assert (m.prefill_base, m.prefill_per_token) == pytest.approx((0.04, 0.0003))


def test_a_round_carries_the_curves_its_own_replaced() -> None:
    world = World()
    world.join(BASELINE, "http://b0")
    p = planner(world)
    first = p.setting()
    # the first curves replace none: nothing to agree with
    assert first is not None and p.replaced(first) is None
    taken = first.speculative
    for i, by in enumerate((1.05, 1.10), start=1):
        world.models = {SPECULATIVE: scaled(EAGLE3, by), BASELINE: BASE}
        world.now += CURVE_REFRESH + 1
        for _ in range(CURVE_REFRESH_ROUNDS + 1):
            now = p.setting()
        assert now is not None and p.curve_updates == i
        assert now.speculative.spi == pytest.approx(scaled(EAGLE3, by).spi)
        before = p.replaced(now)
        assert before is not None and before.baseline == now.baseline == BASE
        assert before.speculative == taken
        taken = now.speculative
    world.now += INTERVAL
    world.serve(60)
    r = p.gather()
    assert r.replaced == p.replaced(r.setting) and r.replaced is not None
    assert r.replaced.speculative.spi == pytest.approx(scaled(EAGLE3, 1.05).spi)


def test_a_switch_goes_ahead_only_if_the_curves_it_replaced_agree() -> None:
    """Two readings of the curves in a row must both advise it (``agreed``): one alone can be
    the noise of the engines' last window."""
    world = World()
    for i in range(4):
        world.join(BASELINE, f"http://b{i}")
    # as above: the baseline misses a TPOT of 18 ms, the speculative engines meet it
    p = planner(world, gpu_budget=4, slo_tpot_ms=18.0)
    minutes(world, p, 6, 1.0)
    world.now += INTERVAL
    world.serve(60)
    r = p.gather()
    assert r.setting is not None and r.replaced is None
    _, alone, _ = decide(r)
    assert alone is not None and alone.action is not None and alone.action.mode == SPECULATIVE
    # the curves it replaced agree: the same plan
    same = decide(r._replace(replaced=r.setting))
    assert same == decide(r)
    # under the curves it replaced speculation was no faster than the baseline: held
    slow = r.setting._replace(speculative=scaled(EAGLE3, 3.0))
    status, held, state = decide(r._replace(replaced=slow))
    assert status == "planning" and held is not None and held.action is None
    assert held.reason.startswith("holding: not a switch under the curves these replaced")
    assert held.desired == alone.desired and held.values == alone.values
    blocked = [o for o in held.options if o.action == alone.action]
    assert len(blocked) == 1 and blocked[0].blocked.startswith("not a switch under the curves")
    # no switch taken: the state is the one a round without an action leaves
    assert state == held.state and state.switched == r.state.switched
    assert state.direction == r.state.direction and state.holt == alone.state.holt
    assert state.history[-1].action is None and state.history[-1].desired == alone.desired
    assert state.history[:-1] == alone.state.history[:-1]


def test_curves_are_replaced_at_most_once_in_so_many_rounds_at_any_time_scale() -> None:
    """On a compressed day the refresh period passes within one plan: the rounds bound it."""
    world = World()
    world.join(BASELINE, "http://b0")
    p = planner(world)
    p.setting()
    for i in range(1, 3 * CURVE_REFRESH_ROUNDS + 1):
        world.models = {SPECULATIVE: scaled(EAGLE3, 1.0 + 0.05 * i), BASELINE: BASE}
        world.now += CURVE_REFRESH + 1  # (every round: a refresh period has passed)
        p.setting()
    assert p.curve_updates == 2


def test_the_mix_is_held_like_the_curves() -> None:
    world = World()
    p = planner(world)
    assert p.hold_mix(None) is None
    assert p.hold_mix(MIX) == MIX
    wider = MIX._replace(outputs=tuple(1.5 * x for x in MIX.outputs))
    near = MIX._replace(outputs=tuple(1.05 * x for x in MIX.outputs))
    taken = [p.hold_mix(wider if i % 2 else near) for i in range(3 * CURVE_REFRESH_ROUNDS)]
    # moved past the tolerance every other round: taken once in so many rounds, not each time
    assert sum(a != b for a, b in zip([MIX, *taken], taken, strict=False)) == 2
    assert p.hold_mix(None) in (MIX, wider, near)  # (no request seen lately: the one held)


def test_the_mix_is_kept_across_restarts_and_planned_on_from_the_start(tmp_path: Path) -> None:
    """A router that served yesterday plans from its first round on the mix it kept, not
    after PLAN_MIN_REQUESTS of today's requests (over sockets the first plan came at ~1.1 h
    of a compressed day, the surge next)."""
    path = tmp_path / "plan-state.json"
    world = World()
    for i in range(4):
        world.join(BASELINE, f"http://b{i}")
    p = planner(world, path)
    minutes(world, p, 2, 1.0)
    saved = json.loads(path.read_text())
    # (200 requests seen; their means scaled to the engines' over the first minute's 60)
    assert saved["mix"]["requests"] == 60 and saved["mix"]["sampling"] == pytest.approx(0.8)
    holt, mix, kept = state_of(saved, INTERVAL)
    assert holt == p.state.holt and mix == p.mix and kept == p.mix_sample
    assert kept.requests == 60 and kept.prompt_sd > 0 and kept.output_sd > 0
    s = Settings(planner="autoscale", plan_interval=INTERVAL, restart_s=500.0,
                 plan_state_path=path)  # fmt: skip
    fresh = FleetPlanner(s, world, world.states, world, world, world, world.clock,
                         wall=lambda: 1.7e9 + world.now)  # fmt: skip
    fresh.params = fresh.params._replace(horizon=3600.0 * s.plan_time_scale)
    fresh.look()
    assert not fresh.recent  # (no request seen today)
    minutes(world, fresh, 1, 1.0)
    assert fresh.document()["status"] == "planning"
    assert fresh.mix == mix
    # a state kept before the mix was: the forecast alone
    del saved["mix"]
    assert state_of(saved, INTERVAL) == (holt, None, Sample(0))
    assert state_of({**saved, "interval_s": 2 * INTERVAL}, INTERVAL) == (None, None, Sample(0))
    with pytest.raises(ValueError):
        state_of({**saved, "mix": {"prompts": [], "outputs": [1.0], "sampling": 0.5}}, INTERVAL)


def test_a_mix_from_fewer_requests_replaces_the_held_one_only_beyond_their_noise() -> None:
    held = MIX
    off = MIX._replace(prompts=tuple(1.2 * x for x in MIX.prompts))  # 20% longer prompts
    sd = held.prompt_mean  # (conversation prompts: a spread about their mean)
    kept = Sample(1000, sd, sd)  # yesterday's
    few, many = Sample(50, sd, sd), Sample(2000, sd, sd)
    # yesterday's mix of 1000 requests against the morning's first 50: 20% is within noise
    assert not beyond_noise(held, kept, off, few)
    assert not mix_moved(held, kept, off, few, 0.1)
    # ... and beyond it once as many requests say so, or when it is that far off
    assert beyond_noise(held, kept, off, many)
    assert mix_moved(held, kept, off, many, 0.1)
    far = MIX._replace(prompts=tuple(1.6 * x for x in MIX.prompts))
    assert mix_moved(held, kept, far, few, 0.1)
    # the spread is the larger of the two: a few requests that missed the tail do not pass
    assert not beyond_noise(held, kept, far, Sample(50, 0.1 * sd, 0.1 * sd), z=5.0)
    assert beyond_noise(held, Sample(1000), far, Sample(50, 0.1 * sd, 0.1 * sd), z=5.0)
    # a mix from more requests than the held one replaces it past the tolerance, as before
    assert mix_moved(held, Sample(50, sd, sd), off, Sample(200, sd, sd), 0.1)
    assert not mix_moved(held, Sample(50), MIX, Sample(200, sd, sd), 0.1)  # (within it)
    assert mix_moved(held, kept, off, None, 0.1)  # (its size unknown: the tolerance alone)
    hotter = MIX._replace(sampling=0.9)  # (from 0.8: ten points more at temperature 1)
    assert not beyond_noise(held, kept, hotter, Sample(50))
    assert beyond_noise(held, kept, hotter, Sample(2000))


def test_a_sample_is_its_count_and_spreads() -> None:
    assert sample_of([]) == Sample(0)
    assert sample_of([(3, 4, True)]) == Sample(1)
    got = sample_of([(1, 10, True), (3, 30, False)])
    assert got.requests == 2
    assert got.prompt_sd == pytest.approx(math.sqrt(2)) and got.output_sd == pytest.approx(
        10 * math.sqrt(2)
    )
    # scaled as the mix's lengths were (to the engines' means): twice the means, twice the sd
    doubled = sample_of([(1, 10, True), (3, 30, False)], Mix((2.0, 6.0), (20.0, 60.0), 0.5))
    assert doubled.prompt_sd == pytest.approx(2 * math.sqrt(2))
    assert doubled.output_sd == pytest.approx(20 * math.sqrt(2))
    # means scaled to the engines' counts over fewer requests: known as well as those are
    many = [(1, 10, True), (3, 30, False)] * 500
    assert sample_of(many).requests == 1000
    assert sample_of(many, None, 180.6).requests == 180
    assert sample_of(many, None, 5000.0).requests == 1000
    assert sample_of(many, None, 0.0).requests == 1


def test_held_mix_keeps_yesterdays_against_the_mornings_first_requests() -> None:
    world = World()
    p = planner(world)
    off = MIX._replace(prompts=tuple(1.2 * x for x in MIX.prompts))
    sd = MIX.prompt_mean
    p.mix, p.mix_sample = MIX, Sample(1000, sd, sd)
    for _ in range(CURVE_REFRESH_ROUNDS + 1):
        got = p.hold_mix(off, Sample(50, sd, sd))
    assert got == MIX and p.mix_sample.requests == 1000
    assert p.hold_mix(off, Sample(2000, sd, sd)) == off and p.mix_sample.requests == 2000


def test_drift_is_the_largest_relative_move_of_any_number() -> None:
    assert curve_drift(None, EAGLE3) == math.inf
    assert curve_drift(EAGLE3, EAGLE3) == 0.0
    assert curve_drift(EAGLE3, scaled(EAGLE3, 1.03)) == pytest.approx(0.03 / 1.03)
    assert curve_drift(EAGLE3, EAGLE3._replace(tau_sampling=EAGLE3.tau_sampling * 0.9)) == (
        pytest.approx(0.1)
    )
    assert curve_drift(EAGLE3, EAGLE3._replace(cap=16)) == math.inf


def one_switch_advised() -> tuple[World, FleetPlanner, dict[str, Any]]:
    """Four baseline engines and a strict TPOT the baseline misses: after six minutes one
    engine is advised into speculation (as in the first test above)."""
    world = World()
    for i in range(4):
        world.join(BASELINE, f"http://b{i}")
    p = planner(world, gpu_budget=4, slo_tpot_ms=18.0)
    minutes(world, p, 6, 1.0)
    sw = p.document()["switch"]
    assert sw is not None and sw["phase"] == "advised"
    return world, p, sw


def test_a_plan_made_while_a_switch_landed_is_not_acted_on() -> None:
    world, p, sw = one_switch_advised()
    engine = sw["engine"]
    # the next round is gathered while that switch is only advised (every engine up) ...
    world.now += INTERVAL
    world.serve(60)
    r = p.gather()
    # ... and while its plan is made (in the worker: seconds), the switch is carried out
    world.now += 1
    world.drain(engine)
    p.look()
    world.now += 5
    world.remove(engine)
    p.look()
    world.join(SPECULATIVE, engine, healthy=False)
    p.look()
    world.now += 430.0
    world.healthy(engine)
    p.look()
    assert p.switch is None
    out = decide(r)
    stale = out[1]
    assert (
        stale is not None and stale.action is not None
    )  # made on the fleet before: that engine again
    p.publish(r, out, 0.1)
    doc = p.document()
    assert doc["switch"] is None and "not acted on" in doc["status"]
    assert doc["running"] == {SPECULATIVE: 1, BASELINE: 3}
    # the next plan, made on the fleet as it is, is acted on again (whatever it decides)
    minutes(world, p, 1, 1.0)
    assert "not acted on" not in p.document()["status"]


def test_a_withdrawn_switch_the_actuator_carried_out_is_followed_again() -> None:
    world, p, sw = one_switch_advised()
    engine = sw["engine"]
    # the next plan holds (here: forced), and withdraws the advice nothing was seen acting on
    assert p.last_plan is not None
    p._advise(p.last_plan._replace(action=None), [], world.now)
    assert p.switch is None
    # ... but the actuator had read it and drains that engine: followed again, not lost
    world.now += 1
    world.drain(engine)
    p.look()
    doc = p.document()
    assert doc["switch"] is not None and doc["switch"]["id"] == sw["id"]
    assert (doc["switch"]["phase"], doc["switch"]["draining"]) == ("draining", engine)
    # gone from the members: counted as loading in its new mode, no free GPU is offered
    world.now += 5
    world.remove(engine)
    p.look()
    doc = p.document()
    assert doc["switch"]["phase"] == "restarting"
    names = [e["engine"] for e in doc["fleet"]]
    assert engine in names and len(names) == 4, names
    assert not any(n.startswith(SLOT) for n in names)
    world.join(SPECULATIVE, engine, healthy=False)
    world.now += 430.0
    world.healthy(engine)
    p.look()
    assert p.switch is None and p.document()["running"] == {SPECULATIVE: 1, BASELINE: 3}


def test_a_withdrawn_switch_nothing_carried_out_is_forgotten() -> None:
    world, p, _ = one_switch_advised()
    assert p.last_plan is not None
    p._advise(p.last_plan._replace(action=None), [], world.now)
    world.now += 3 * INTERVAL
    p.look()
    assert p.withdrawn is None and p.switch is None
    # an engine drained later for a reason of its own is not taken for that switch
    world.drain("http://b0")
    p.look()
    assert p.switch is None


def test_the_forecast_judges_the_windows_newest_interval_by_its_own_count() -> None:
    """A few arrivals a minute: the rate is over a window of several intervals, and the
    forecast's clip is given the newest interval's own count besides (``forecast.observe``)."""
    world = World()
    for i in range(4):
        world.join(BASELINE, f"http://b{i}")
    p = planner(world, gpu_budget=4)
    minutes(world, p, 30, 0.05)  # three arrivals a minute: the window spans several
    world.now += INTERVAL
    world.serve(30)  # ten times as many in the newest
    r = p.gather()
    assert r.estimate.seconds > r.traffic.seconds and r.traffic.arrivals == 30
    _, _, state = decide(r)
    fresh = (r.traffic.arrivals, r.traffic.seconds)
    want, _ = observe_round(r.state, r.now, r.estimate.rate, r.estimate.seconds, r.params, fresh)
    alone, _ = observe_round(r.state, r.now, r.estimate.rate, r.estimate.seconds, r.params)
    assert state.holt == want != alone
    assert want.surged == 0.0 and want.burst > 0.0


def twin_fleets() -> tuple[World, FleetPlanner, World, FleetPlanner]:
    worlds = [World(), World()]
    planners = []
    for w in worlds:
        for i in range(4):
            w.join(BASELINE, f"http://b{i}")
        p = planner(w, gpu_budget=4)
        minutes(w, p, 8, 0.5)
        planners.append(p)
    return worlds[0], planners[0], worlds[1], planners[1]


# a ramp the late plan misses: arrivals per minute, one a minute
RAMP = (40, 55, 70, 90, 110, 130)


def test_a_late_plan_leaves_the_forecast_where_plans_on_time_would() -> None:
    """A plan that takes several intervals (a cold one on a compressed day): each interval
    that ends while it is made is counted as its own and observed by the next round, so the
    forecast is the one rounds on time reach, exactly, not the ramp's mean over one long
    interval."""
    w1, on_time, w2, late = twin_fleets()
    for n in RAMP:
        w1.now += INTERVAL
        w1.serve(n)
        on_time.tick()
    # the late one: a round gathered after the ramp's first minute, planned while all but the
    # last of the others pass
    w2.now += INTERVAL
    w2.serve(RAMP[0])
    r = late.gather()
    out = decide(r)
    for n in RAMP[1:-1]:
        w2.now += INTERVAL
        w2.serve(n)
        late.look_while_planning()
    w2.now += INTERVAL
    w2.serve(RAMP[-1])  # (this minute ends after the plan: the next round's own)
    late.publish(r, out, 0.0)
    r2 = late.gather()
    assert len(r2.missed) == len(RAMP) - 2 and r2.traffic.arrivals == RAMP[-1]
    late.publish(r2, decide(r2), 0.0)
    # the ramp's six minutes, each observed
    assert late.state.holt == on_time.state.holt
    assert late.state.observed == on_time.state.observed


def test_a_lost_rounds_intervals_reach_the_next_round() -> None:
    w1, on_time, w2, lossy = twin_fleets()
    for n in RAMP[:2]:
        w1.now += INTERVAL
        w1.serve(n)
        on_time.tick()
        w2.now += INTERVAL
        w2.serve(n)
        r = lossy.gather()
        if n == RAMP[0]:
            lossy.failed(r, "the plan worker died (exit -9)", StubWorker())
        else:
            assert len(r.missed) == 1
            lossy.publish(r, decide(r), 0.0)
    assert lossy.state.holt == on_time.state.holt


def test_no_plan_is_made_on_the_lengths_of_fewer_than_plan_min_requests() -> None:
    """Over sockets the first plans of a flat day were made on ONE request's lengths and both
    runs switched on them: below PLAN_MIN_REQUESTS lengths the planner waits (the forecast
    learns all the same), and plans on the next round once it has them."""
    world = World()
    for i in range(4):
        world.join(BASELINE, f"http://b{i}")
    s = Settings(planner="autoscale", plan_interval=INTERVAL, restart_s=500.0, gpu_budget=4)
    p = FleetPlanner(s, world, world.states, world, world, world, world.clock,
                     wall=lambda: 1.7e9 + world.now)  # fmt: skip
    p.params = p.params._replace(horizon=3600.0 * p.settings.plan_time_scale)
    p.look()
    need = s.plan_min_requests
    for i in range(need - 1):
        p.observe(Done(200, Usage(int(MIX.prompts[i % 4]), int(MIX.outputs[i % 4])), True))
    minutes(world, p, 6, 1.0)
    doc = p.document()
    assert doc["status"].startswith("waiting for traffic"), doc["status"]
    assert "desired" not in doc and doc["traffic"]["mix_requests"] == need - 1
    assert p.state.holt is not None and p.state.holt.seen == 6  # (the forecast learns)
    p.observe(Done(200, Usage(int(MIX.prompts[0]), int(MIX.outputs[0])), True))
    minutes(world, p, 1, 1.0)
    assert p.document()["status"] == "planning"


def sglang(requests: float, tokens: float, steps: float) -> EngineSample:
    return EngineSample("sglang", 0.0, 0.0, None, requests_total=requests, prompt_total=0.0,
                        generated_total=tokens, verifies_total=steps)  # fmt: skip


def test_the_engines_count_tokens_per_verify_step() -> None:
    assert counted_steps(None, sglang(10, 500, 200)) is None  # (the first sample)
    assert counted_steps(sglang(10, 500, 200), sglang(14, 800, 300)) == Accepted(300, 100, 4)
    # an engine that restarted counts from zero
    assert counted_steps(sglang(10, 500, 200), sglang(2, 90, 30)) == Accepted(90, 30, 2)
    vllm = EngineSample("vllm", 0.0, 0.0, None, accepted_total=150.0, drafts_total=100.0,
                        requests_total=3.0)  # fmt: skip
    later = replace(vllm, accepted_total=330.0, drafts_total=200.0, requests_total=5.0)
    assert counted_steps(vllm, later) == Accepted(280, 100, 2)  # 1 + accepted / drafts
    # no counters (a gauge only): nothing counted
    gauge = EngineSample("sglang", 0.0, 0.0, 2.5)
    assert counted_steps(gauge, gauge) is None


def test_a_counted_acceptance_is_split_at_the_curves_ratio_and_the_mixs_share() -> None:
    c = EAGLE3._replace(tau_greedy=3.0, tau_sampling=2.4)  # ratio 0.8
    got = counted_curve(c, Accepted(2600.0, 1000.0, 50), 0.5)  # 2.6 = 0.5 g + 0.5 * 0.8 g
    assert got.tau_greedy == pytest.approx(2.6 / 0.9) and got.tau_sampling == pytest.approx(
        0.8 * 2.6 / 0.9
    )
    assert got._replace(tau_greedy=3.0, tau_sampling=2.4) == c


def test_the_acceptance_planned_on_is_the_engines_count_not_the_gauge() -> None:
    """The keeper's readings (a gauge of 40 iterations) swing by 5-10%; with counters the
    plan keeps its acceptance until ACCEPT_MIN_REQUESTS requests are counted, then takes it."""
    world = World()
    world.join(SPECULATIVE, "http://s0")
    p = planner(world)
    p.mix = mix = MIX  # (the mix's share at temperature > 0 splits the count)
    first = p.setting()
    assert first is not None and first.speculative == EAGLE3
    # the engine counts: 2.0 tokens a step where the table had more
    n, tokens, steps = 0.0, 0.0, 0.0

    def count(requests: float) -> None:
        nonlocal n, tokens, steps
        n, tokens, steps = n + requests, tokens + 200 * requests, steps + 100 * requests
        world.samples["http://s0"] = sglang(n, tokens, steps)
        p.look()

    count(0)
    # the keeper's reading: 9% low, as a gauge may read
    low = EAGLE3._replace(tau_greedy=EAGLE3.tau_greedy * 0.91,
                          tau_sampling=EAGLE3.tau_sampling * 0.91)  # fmt: skip
    world.models = {SPECULATIVE: low, BASELINE: BASE}
    world.now += CURVE_REFRESH + 1
    count(ACCEPT_MIN_REQUESTS - 1)
    for _ in range(3 * CURVE_REFRESH_ROUNDS):
        held = p.setting()
    # too few counted: the gauge does not move it
    assert held is not None and held.speculative == EAGLE3 and p.curve_updates == 0
    count(1)
    taken = p.setting()
    assert taken is not None and p.curve_updates == 1
    want = counted_curve(EAGLE3, Accepted(200.0, 100.0, 1), mix.sampling)
    assert (taken.speculative.tau_greedy, taken.speculative.tau_sampling) == pytest.approx(
        (want.tau_greedy, want.tau_sampling)
    )
    assert taken.speculative.spi == pytest.approx(EAGLE3.spi) and p.accepted == Accepted()
