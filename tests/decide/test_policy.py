"""Routing policies as pure functions of plain snapshots."""

from __future__ import annotations

from collections.abc import Sequence

from router.decide.policy import (
    BackendView,
    Decision,
    PoolView,
    RoutingState,
    Snapshot,
    choose,
    pick_backend,
    reroute,
)
from router.pools import BASELINE, SPECULATIVE, Pool


def snap(
    spec: Sequence[int | BackendView],
    base: Sequence[int | BackendView],
    crossover: int = 4,
    hysteresis: int = 0,
    state: RoutingState | None = None,
    no_crossover: bool = False,
) -> Snapshot:
    def pool(name: Pool, loads: Sequence[int | BackendView]) -> PoolView:
        views = tuple(
            x if isinstance(x, BackendView) else BackendView(f"http://{name}{i}", x)
            for i, x in enumerate(loads)
        )
        return PoolView(name, views)

    return Snapshot(
        pool(SPECULATIVE, spec),
        pool(BASELINE, base),
        crossover,
        hysteresis,
        state or RoutingState(),
        no_crossover=no_crossover,
    )


def run(policy: str, s: Snapshot) -> tuple[Decision, RoutingState]:
    decision, state = choose(policy, s)
    assert decision is not None
    return decision, state


def test_spillover_fills_speculative_up_to_crossover() -> None:
    assert run("spillover", snap([0], [0]))[0] == Decision(
        "speculative", "http://speculative0", "below_crossover"
    )
    assert run("spillover", snap([3], [0]))[0].pool == "speculative"
    assert run("spillover", snap([4], [0]))[0] == Decision(
        "baseline", "http://baseline0", "above_crossover"
    )


def test_with_no_crossover_measured_the_rest_goes_by_load_not_all_to_the_baseline() -> None:
    # no crossover up to 4: speculation up to 4 per engine, as with a crossover of 4
    d, _ = run("spillover", snap([3], [0], no_crossover=True))
    assert d == Decision("speculative", "http://speculative0", "below_crossover")
    # past it, the least loaded backend of either pool (a tie stays speculative)
    assert run("spillover", snap([4], [0], no_crossover=True))[0] == Decision(
        "baseline", "http://baseline0", "beyond_measured"
    )
    assert run("spillover", snap([4], [4], no_crossover=True))[0] == Decision(
        "speculative", "http://speculative0", "beyond_measured"
    )
    assert run("spillover", snap([6], [5], no_crossover=True))[0].pool == "baseline"
    assert run("spillover", snap([6], [7], no_crossover=True))[0].pool == "speculative"
    # with a crossover of 4 the same load goes to the baseline whatever its load
    assert run("spillover", snap([6], [7]))[0] == Decision(
        "baseline", "http://baseline0", "above_crossover"
    )


def test_by_load_fails_over_when_a_pool_has_no_usable_backend() -> None:
    down = BackendView("http://baseline0", 0, usable=False)
    d, _ = run("spillover", snap([9], [down], no_crossover=True))
    assert d == Decision("speculative", "http://speculative0", "beyond_measured")


def test_the_crossover_policy_places_by_load_past_the_level_measured() -> None:
    d, state = run("crossover", snap([2], [2], crossover=4, no_crossover=True))
    assert d.reason == "beyond_measured" and state.above and d.pool == "speculative"
    d, _ = run("crossover", snap([3], [2], crossover=4, no_crossover=True, state=state))
    assert (d.pool, d.reason) == ("baseline", "beyond_measured")


def test_spillover_crossover_is_per_speculative_replica() -> None:
    d, _ = run("spillover", snap([4, 2], [9]))
    assert d == Decision("speculative", "http://speculative1", "below_crossover")
    assert run("spillover", snap([4, 4], [9]))[0].pool == "baseline"


def test_crossover_policy_uses_total_load_before_the_request() -> None:
    # 16 arrivals one after another with crossover 4: 4 speculative, 12 baseline
    spec = base = 0
    state = RoutingState()
    for _ in range(16):
        d, state = run("crossover", snap([spec], [base], crossover=4, state=state))
        if d.pool == "speculative":
            spec += 1
        else:
            base += 1
    assert (spec, base) == (4, 12)


def test_crossover_hysteresis_holds_baseline_until_below_band() -> None:
    state = RoutingState()
    d, state = run("crossover", snap([2], [2], crossover=4, hysteresis=2, state=state))
    assert d.reason == "above_crossover" and state.above
    # load fell to 3, inside the band (4 - 2 = 2): still baseline
    d, state = run("crossover", snap([1], [2], crossover=4, hysteresis=2, state=state))
    assert d.pool == "baseline"
    # load 1 < 2: speculation resumes
    d, state = run("crossover", snap([1], [0], crossover=4, hysteresis=2, state=state))
    assert d.pool == "speculative" and not state.above


def test_crossover_without_hysteresis_flips_at_the_edge() -> None:
    d, state = run("crossover", snap([4], [0], crossover=4))
    assert d.pool == "baseline"
    d, _ = run("crossover", snap([3], [0], crossover=4, state=state))
    assert d.pool == "speculative"


def test_round_robin_alternates_over_all_backends() -> None:
    state = RoutingState()
    seen = []
    for _ in range(6):
        d, state = run("round_robin", snap([0], [0, 0], state=state))
        seen.append(d.backend)
    assert seen == ["http://speculative0", "http://baseline0", "http://baseline1"] * 2
    assert all(d for d in seen)


def test_failover_when_chosen_pool_has_no_usable_backend() -> None:
    down = [BackendView("http://s", 0, usable=False)]
    d, _ = run("spillover", snap(down, [0]))
    assert d == Decision("baseline", "http://baseline0", "failover")
    d, _ = run("spillover", snap([9], [BackendView("http://b", 0, usable=False)]))
    assert d == Decision("speculative", "http://speculative0", "failover")


def test_no_usable_backend_anywhere_gives_no_decision() -> None:
    s = snap([BackendView("http://s", 0, usable=False)], [BackendView("http://b", 0, usable=False)])
    for policy in ("spillover", "crossover", "round_robin", "predictive"):
        assert choose(policy, s)[0] is None


def picked(pool: PoolView, rr: int = 0) -> str:
    chosen = pick_backend(pool, rr)
    assert chosen is not None
    return chosen.url


def test_pick_backend_prefers_fewest_in_flight_and_weights_ramping_ones() -> None:
    pool = PoolView(SPECULATIVE, (BackendView("a", 3), BackendView("b", 1), BackendView("c", 2)))
    assert picked(pool) == "b"
    # b is ramping back in at weight 0.1: (1+1)/0.1 = 20 > (3+1)/1
    ramping = PoolView(SPECULATIVE, (BackendView("a", 3), BackendView("b", 1, weight=0.1)))
    assert picked(ramping) == "a"


def test_pick_backend_rotates_ties() -> None:
    pool = PoolView(SPECULATIVE, (BackendView("a", 0), BackendView("b", 0)))
    assert {picked(pool, rr) for rr in range(2)} == {"a", "b"}


def test_reroute_prefers_another_replica_then_the_other_pool() -> None:
    s = snap([0, 0], [0])
    failed = Decision("speculative", "http://speculative0", "below_crossover")
    assert reroute(s, failed, ["http://speculative0"]) == Decision(
        "speculative", "http://speculative1", "retry"
    )
    assert reroute(s, failed, ["http://speculative0", "http://speculative1"]) == Decision(
        "baseline", "http://baseline0", "failover"
    )
    assert (
        reroute(s, failed, ["http://speculative0", "http://speculative1", "http://baseline0"])
        is None
    )


def test_predictive_places_by_marginal_gain() -> None:
    def gain(pool: str, load: int) -> float:
        return {"speculative": 10.0 - load, "baseline": 5.0}[pool]

    s = Snapshot(
        PoolView("speculative", (BackendView("s", 2),)),
        PoolView("baseline", (BackendView("b", 0),)),
        crossover=4,
        gain=gain,
    )
    assert run("predictive", s)[0].pool == "speculative"
    s2 = Snapshot(
        s.speculative.__class__("speculative", (BackendView("s", 6),)), s.baseline, 4, gain=gain
    )
    assert run("predictive", s2)[0].pool == "baseline"


def test_predictive_without_curves_is_spillover() -> None:
    assert run("predictive", snap([4], [0]))[0].reason == "above_crossover"
