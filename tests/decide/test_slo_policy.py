"""The slo policy's choice, on plain values (the sims' presets as the models).

The first tests put requests in flight on each engine and check the choice the backend
simulation (router.decide.twin) leads to; the rest check the choice rules on given predictions.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from router.decide import policy as policy_module
from router.decide.policy import BackendView, PoolView, RoutingState, Snapshot, choose
from router.decide.predict import PoolModel, Request
from router.decide.twin import Flight, Placement, Stream, slo_capacity
from router.pools import BASELINE, SPECULATIVE, Pool
from router.sim.model import BASELINE as BASE_PRESET
from router.sim.model import EAGLE3
from tests.support.models import preset_model

SPEC = preset_model(EAGLE3)
BASE = preset_model(BASE_PRESET)
MODELS: dict[Pool, PoolModel] = {SPECULATIVE: SPEC, BASELINE: BASE}
FRESH = RoutingState()


def req(prompt: float = 100, output: float = 200, sampling: bool = False) -> Request:
    return Request(prompt, output, sampling, slo_ttft=1.0, slo_tpot=0.025)


def decoding(since: float, output: float = 200) -> Flight:
    """A greedy request with a 500-token prompt that got its first token ``since`` s ago."""
    return Flight(500, output, False, since + 0.3, since, 1.0, 0.025)


def snap(
    spec: tuple[Flight, ...] | int = (),
    base: tuple[Flight, ...] | int = (),
    r: Request | None = None,
    state: RoutingState = FRESH,
    models: dict[Pool, PoolModel] = MODELS,
) -> Snapshot:
    """Requests in flight on each engine: known ones, or only a count (as another router's)."""

    def view(url: str, flights: tuple[Flight, ...] | int) -> BackendView:
        if isinstance(flights, int):
            return BackendView(url, flights)
        return BackendView(url, len(flights), flights=flights)

    return Snapshot(
        PoolView(SPECULATIVE, (view("http://spec", spec),)),
        PoolView(BASELINE, (view("http://base", base),)),
        7,
        state=state,
        request=r or req(),
        models=models,
        sampling_share=0.0,
    )


def decide(s: Snapshot, reason: str = "predicted_slo") -> str:
    d = choose("slo", s)[0]
    assert d is not None and d.reason == reason
    return d.pool


# -- what the simulation leads to ------------------------------------------------------------------


def test_a_lone_request_goes_to_the_speculative_engine() -> None:
    d = choose("slo", snap())[0]
    assert d is not None and d.pool == SPECULATIVE
    # its predicted TPOT there: one iteration of a lone request over EAGLE-3's 2.8 tokens
    assert d.tpot == pytest.approx(SPEC.iteration(1) / EAGLE3.tau, rel=0.02)


def test_temperature_moves_a_request_off_a_speculative_engine_near_its_slo() -> None:
    # four long requests on each engine: with one more, EAGLE-3 decodes a greedy request at
    # 23 ms per token (2.8 tokens an iteration), a sampled one at 27 ms (2.4), the baseline
    # either at 25 ms. The greedy request meets its SLO speculating; the sampled one comes
    # closer on the baseline, where it also slows the others less.
    four = (decoding(1.0, output=2000),) * 4
    greedy = choose("slo", snap(four, four, req(sampling=False)))[0]
    sampled = choose("slo", snap(four, four, req(sampling=True)))[0]
    assert greedy is not None and sampled is not None
    assert greedy.pool == SPECULATIVE and greedy.tpot < 0.025
    assert sampled.pool == BASELINE


def test_a_long_prompt_goes_where_its_prefill_stalls_nobody() -> None:
    # three requests decoding on EAGLE-3 within their SLO, with about 100 tokens to go: a
    # 6,000-token prefill (2.6 s) would take all three past 25 ms per token. The baseline's
    # five long requests are past it already. A short prompt still goes to speculation.
    spec = (decoding(1.0, output=150),) * 3
    base = (decoding(1.0, output=2000),) * 5
    assert decide(snap(spec, base, req(prompt=30))) == SPECULATIVE
    assert decide(snap(spec, base, req(prompt=6000))) == BASELINE


def test_a_backend_where_it_would_queue_is_not_a_candidate() -> None:
    # the speculative engine is full (its cap is 48): a request there waits for a slot, so it
    # goes to the busy but admitting baseline even though speculation would decode faster
    assert decide(snap(EAGLE3.max_running + 30, 10)) == BASELINE


def test_a_cap_the_engine_showed_counts_like_the_models() -> None:
    # models that know no cap; the speculative engine showed it runs at most 2
    uncapped: dict[Pool, PoolModel] = {
        SPECULATIVE: SPEC._replace(cap=None),
        BASELINE: BASE._replace(cap=None),
    }
    s = snap(3, 4, models=uncapped)
    free = choose("slo", s)[0]
    capped = s._replace(speculative=PoolView(SPECULATIVE, (BackendView("http://spec", 3, cap=2),)))
    full = choose("slo", capped)[0]
    assert free is not None and full is not None
    assert (free.pool, full.pool) == (SPECULATIVE, BASELINE)


def test_a_smaller_cap_seen_does_not_override_the_one_the_engine_reported() -> None:
    # the table says 48 (the engine's own max_running_requests); two scrapes that happened to
    # see 3 running with some queued do not make it 3
    s = snap(3, 4)
    seen = s._replace(speculative=PoolView(SPECULATIVE, (BackendView("http://spec", 3, cap=3),)))
    assert choose("slo", s)[0] == choose("slo", seen)[0]


def test_unknown_requests_count_as_the_traffic_the_router_sees() -> None:
    # the same load, known request by request or only as a count: both slow the batch
    known = snap((decoding(1.0),) * 6, ())
    counted = snap(6, 0)
    for s in (known, counted):
        d = choose("slo", s)[0]
        assert d is not None and d.pool == BASELINE


def test_requests_being_aborted_hold_no_slo() -> None:
    # a closed loop's clients left at the end of a run: 13 of their requests still count on the
    # speculative engine until it aborts them, 20 on the baseline; the next burst's first
    # requests meet their SLO on speculation and go there. Counted as requests with an SLO to
    # keep, they would make it look too busy to take any.
    def leaving(spec: int, base: int, left: float = 0.2) -> Snapshot:
        def view(url: str, n: int) -> BackendView:
            return BackendView(url, n, leaving=(left,) * n)

        return snap()._replace(
            speculative=PoolView(SPECULATIVE, (view("http://spec", spec),)),
            baseline=PoolView(BASELINE, (view("http://base", base),)),
        )

    d = choose("slo", leaving(13, 20))[0]
    assert d is not None and (d.pool, d.reason) == (SPECULATIVE, "predicted_slo")
    # ... while the same counts of requests that are not leaving (another router's) are busy
    busy = choose("slo", snap(13, 20))[0]
    assert busy is not None and busy.tpot > d.tpot * 2
    # they hold their places in the batch while they stay: the longer, the slower its start
    soon, late = choose("slo", leaving(13, 20, 0.01))[0], choose("slo", leaving(13, 20, 2.0))[0]
    assert soon is not None and late is not None
    assert soon.pool == late.pool == SPECULATIVE
    assert soon.tpot < late.tpot


def test_a_ramp_handicaps_a_backend_only_against_the_others() -> None:
    # a recovered speculative engine ramped back in at a tenth of its weight counts as nine
    # requests busier than it is; when every backend ramps (the router has just started) none
    # is handicapped (nor one a hair behind the other: its ramp started a poll later), and a
    # lone request goes to speculation with its TPOT predicted as if idle
    def ramping(spec_weight: float, base_weight: float) -> Snapshot:
        return snap()._replace(
            speculative=PoolView(SPECULATIVE, (BackendView("http://spec", 0, weight=spec_weight),)),
            baseline=PoolView(BASELINE, (BackendView("http://base", 0, weight=base_weight),)),
        )

    idle = choose("slo", snap())[0]
    both = choose("slo", ramping(0.3859, 0.3863))[0]
    alone = choose("slo", ramping(0.1, 1.0))[0]
    assert idle is not None and both is not None and alone is not None
    assert (both.pool, both.tpot) == (SPECULATIVE, idle.tpot)
    assert alone.pool == BASELINE


def test_a_backend_with_recent_traffic_is_not_shunned_when_every_slo_is_met() -> None:
    # both engines idle; the speculative one has been getting a request a second, the baseline
    # none. The forecast arrivals would share the speculative batch with this request, but
    # where they go is decided when they come: with every SLO met either way (3 s, 100 ms),
    # the request goes where it is fastest
    r = Request(100, 200, False, slo_ttft=3.0, slo_tpot=0.1)

    def stream(rate: float) -> Stream:
        return Stream(rate, 100, 200, 0.5, 3.0, 0.1)

    s = snap(r=r)._replace(
        speculative=PoolView(SPECULATIVE, (BackendView("http://spec", 0, stream=stream(1.0)),)),
        baseline=PoolView(BASELINE, (BackendView("http://base", 0, stream=stream(0.0)),)),
    )
    assert decide(s) == SPECULATIVE


def test_beyond_the_measured_batch_sizes_is_flagged() -> None:
    narrow: dict[Pool, PoolModel] = {
        SPECULATIVE: SPEC._replace(measured=4),
        BASELINE: BASE._replace(measured=4),
    }
    inside = choose("slo", snap(1, 1, models=narrow))[0]
    beyond = choose("slo", snap(8, 8, models=narrow))[0]
    assert inside is not None and not inside.extrapolated
    assert beyond is not None and beyond.extrapolated


def test_the_wall_clock_scale() -> None:
    fast: dict[Pool, PoolModel] = {pool: m._replace(scale=0.25) for pool, m in MODELS.items()}
    # SLO targets are wall seconds: a quarter of them on engines four times as fast is the same
    quick = Request(100, 200, False, slo_ttft=0.25, slo_tpot=0.025 / 4)
    d = choose("slo", snap(r=quick, models=fast))[0]
    same = choose("slo", snap())[0]
    assert d is not None and same is not None
    assert d.pool == same.pool and d.tpot == pytest.approx(same.tpot / 4)


def test_without_models_it_decides_as_predictive() -> None:
    s = snap()._replace(models=None)
    d = choose("slo", s)[0]
    assert d is not None and d.reason == "below_crossover"  # predictive without gain: spillover


def test_no_usable_backend_no_decision() -> None:
    s = snap()
    down = s._replace(
        speculative=PoolView(SPECULATIVE, (BackendView("http://spec", 0, usable=False),)),
        baseline=PoolView(BASELINE, (BackendView("http://base", 0, usable=False),)),
    )
    assert choose("slo", down)[0] is None


# -- the choice rules, on given predictions --------------------------------------------------------


def predicting(monkeypatch: pytest.MonkeyPatch, by_pool: dict[str, Placement]) -> None:
    """Make the simulation answer ``by_pool[pool]`` for each backend (``strict``, ``relaxed``:
    what the placement adds; ``own``: the request's own chances)."""

    def fake(model: PoolModel, *args: object, **kw: object) -> Placement:
        return by_pool[SPECULATIVE if model is SPEC else BASELINE]

    place: Callable[..., Placement] = fake
    monkeypatch.setattr(policy_module, "place", place)


def p(strict: float, relaxed: float, own: tuple[float, float]) -> Placement:
    return Placement(strict, relaxed, own, 0.5, 0.02, 1)


def test_the_most_goodput_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    predicting(monkeypatch, {SPECULATIVE: p(1, 1, (1, 1)), BASELINE: p(0, 1, (0, 1))})
    assert decide(snap()) == SPECULATIVE
    predicting(monkeypatch, {SPECULATIVE: p(0.2, 0.6, (1, 1)), BASELINE: p(0, 1, (0, 1))})
    assert decide(snap()) == BASELINE  # the others would lose more there than it gains


def test_a_placement_that_costs_the_others_is_taken_only_when_nothing_else_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # speculation: it meets its SLO (+2) but takes the relaxed tier from one of the others
    # (-1): worth +1 in all. The baseline: it meets only the relaxed tier and costs nobody.
    costly = p(1.0, 0.0, (1, 1))
    predicting(monkeypatch, {SPECULATIVE: costly, BASELINE: p(0.0, 0.9, (0, 0.9))})
    assert decide(snap()) == BASELINE
    # where the baseline cannot meet even the relaxed tier, the best value is taken
    predicting(monkeypatch, {SPECULATIVE: costly, BASELINE: p(0.0, 0.1, (0, 0.1))})
    assert decide(snap()) == SPECULATIVE


def test_under_sustained_overload_the_excess_goes_to_the_most_throughput(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # nothing is feasible: by value, speculation; once the pressure says it has lasted,
    # the pool with the most throughput (the baseline, 256 running at most against 48)
    assert BASE.capacity() > SPEC.capacity()
    costly = p(1.0, 0.0, (1, 1))
    predicting(monkeypatch, {SPECULATIVE: costly, BASELINE: p(0.0, 0.1, (0, 0.1))})
    calm = choose("slo", snap())
    assert calm[0] is not None and calm[0].pool == SPECULATIVE
    assert calm[1].pressure == pytest.approx(policy_module.PRESSURE_KEEP)
    pressed = choose("slo", snap(state=RoutingState(pressure=0.9)))
    assert pressed[0] is not None and pressed[0].pool == BASELINE
    # it builds up over infeasible decisions and fades over feasible ones
    state = RoutingState()
    for _ in range(40):
        state = choose("slo", snap(state=state))[1]
    assert state.pressure > policy_module.PRESSURE_LIMIT
    predicting(monkeypatch, {SPECULATIVE: p(1, 1, (1, 1)), BASELINE: p(0, 1, (0, 1))})
    for _ in range(40):
        state = choose("slo", snap(state=state))[1]
    assert state.pressure < policy_module.PRESSURE_LIMIT


def arriving(s: Snapshot, rate: float) -> Snapshot:
    """``s`` with ``rate`` requests a second (model time) arriving at each backend, of 100
    prompt and 200 output tokens."""

    def fed(view: PoolView) -> PoolView:
        stream = Stream(rate, 100, 200, 0.0, 1.0, 0.025)
        return view._replace(backends=tuple(b._replace(stream=stream) for b in view.backends))

    return s._replace(speculative=fed(s.speculative), baseline=fed(s.baseline))


def test_what_is_offered_is_the_arrivals_against_what_the_engines_serve() -> None:
    assert policy_module.offered(snap(), MODELS) is None  # no stream known: no measure
    # each engine serves a request of the stream's size in its prefill and its output at its
    # peak throughput
    served = sum(1 / (m.prefill(100) + 200 / m.capacity()) for m in (SPEC, BASE))
    assert policy_module.offered(arriving(snap(), 1.0), MODELS) == pytest.approx(2 / served)
    assert policy_module.offered(arriving(snap(), 0.0), MODELS) == 0.0


def test_no_sustained_overload_while_the_engines_could_serve_what_arrives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing feasible, pressure past its limit, and still by value: the requests are not
    arriving faster than the engines serve them, and not for long enough to be a closed loop
    of users past the SLO's edge (``SATURATED``)."""
    costly = p(1.0, 0.0, (1, 1))
    predicting(monkeypatch, {SPECULATIVE: costly, BASELINE: p(0.0, 0.1, (0, 0.1))})
    pressed = snap(state=RoutingState(pressure=policy_module.SATURATED - 0.1))
    assert pressed.state.pressure > policy_module.PRESSURE_LIMIT
    served = sum(1 / (m.prefill(100) + 200 / m.capacity()) for m in (SPEC, BASE))
    light = arriving(pressed, served / 2 * 0.5)  # half of what the pair serves
    assert decide(light) == SPECULATIVE
    heavy = arriving(pressed, served / 2 * 1.1)
    assert decide(heavy) == BASELINE


def test_a_closed_loop_past_the_slos_edge_keeps_the_pool_that_serves_more_within_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Users in a closed loop past the SLO's edge: no feasible backend for most requests
    (past ``SATURATED``), yet not arriving faster than the engines serve. By least harm each
    request would go where the requests are lost already, so whichever pool tipped first
    stays sacrificed; instead the pool that serves fewer within the relaxed SLO takes them
    (here speculation), so the baseline keeps serving more within it, as long as the excess
    (all in flight, less what the baseline holds within its SLO) fits in the speculative
    engines (``FIT`` of their cap); beyond that, to the pool with the most throughput, as
    under overload (the baseline here, which by value would have had it too)."""
    stream = Stream(1.0, 100, 200, 0.0, 1.0, 0.025)
    assert slo_capacity(SPEC, stream).rate < slo_capacity(BASE, stream).rate
    # by value: the baseline, whose requests are past their SLO already
    predicting(monkeypatch, {SPECULATIVE: p(-1, -2, (0.2, 0.2)), BASELINE: p(0, -0.1, (0, 0.1))})
    served = sum(1 / (m.prefill(100) + 200 / m.capacity()) for m in (SPEC, BASE))

    def loop(spec: int, pressure: float) -> Snapshot:
        return arriving(snap(spec, 20, state=RoutingState(pressure=pressure)), served / 2 * 0.5)

    assert decide(loop(10, policy_module.SATURATED - 0.05)) == BASELINE
    assert decide(loop(10, 0.95)) == SPECULATIVE
    held = policy_module.pool_slo_capacity(loop(10, 0.95).baseline, BASE).running
    fits = math.floor(policy_module.FIT * EAGLE3.max_running) + held - 20
    assert 10 < fits < EAGLE3.max_running
    assert decide(loop(fits, 0.95)) == SPECULATIVE
    assert decide(loop(fits + 1, 0.95)) == BASELINE
    # beyond the fit, the most throughput even where each request's least harm is elsewhere
    predicting(monkeypatch, {SPECULATIVE: p(0, -0.1, (0, 0.1)), BASELINE: p(-1, -2, (0.2, 0.2))})
    assert decide(loop(fits + 1, policy_module.SATURATED - 0.05)) == SPECULATIVE
    assert decide(loop(fits + 1, 0.95)) == BASELINE


def test_overflow_is_a_request_that_meets_nothing_anywhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    predicting(monkeypatch, {SPECULATIVE: p(0, 0.01, (0, 0.01)), BASELINE: p(0, 0.02, (0, 0.02))})
    assert decide(snap(), "overflow") == BASELINE
    predicting(monkeypatch, {SPECULATIVE: p(0, 0.3, (0, 0.3)), BASELINE: p(0, 0.02, (0, 0.02))})
    assert decide(snap()) == SPECULATIVE  # a chance somewhere: placed, not held


def test_only_the_least_loaded_replicas_of_a_pool_are_simulated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[int] = []

    def fake(model: PoolModel, flights: object, *args: object, **kw: object) -> Placement:
        seen.append(len(flights))  # type: ignore[arg-type]
        return p(0, 1, (0, 1))

    monkeypatch.setattr(policy_module, "place", fake)
    loads = (7, 0, 30, 3)
    spec = PoolView(SPECULATIVE, tuple(BackendView(f"http://s{i}", n) for i, n in enumerate(loads)))
    s = snap()._replace(speculative=spec)
    d = choose("slo", s)[0]
    assert d is not None
    # the two least loaded speculative replicas (0 and 3 in flight) and the one baseline
    assert sorted(seen) == [0, 0, 3]
