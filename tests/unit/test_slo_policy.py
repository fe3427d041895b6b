"""The slo policy's prediction and choice, on plain values (the sims' presets as the models)."""

from __future__ import annotations

import pytest

from router.decide import predict as predict_module
from router.decide.policy import BackendView, PoolView, Snapshot, choose
from router.decide.predict import PoolModel, Request, meets, predict, value
from router.pools import BASELINE, SPECULATIVE, Pool
from router.sim.model import BASELINE as BASE_PRESET
from router.sim.model import EAGLE3, prefill_time, step_time
from tests.support.models import preset_model

SPEC = preset_model(EAGLE3)
BASE = preset_model(BASE_PRESET)
MODELS: dict[Pool, PoolModel] = {SPECULATIVE: SPEC, BASELINE: BASE}


def req(prompt: float = 100, output: float = 200, sampling: bool = False) -> Request:
    return Request(prompt, output, sampling, slo_ttft=1.0, slo_tpot=0.025)


def snap(
    spec_load: int = 0, base_load: int = 0, r: Request | None = None, **views: float
) -> Snapshot:
    spec = BackendView("http://spec", spec_load, prefill_share=views.get("spec_share", 0.0))
    base = BackendView("http://base", base_load, prefill_share=views.get("base_share", 0.0))
    return Snapshot(
        PoolView(SPECULATIVE, (spec,)),
        PoolView(BASELINE, (base,)),
        7,
        request=r or req(),
        models=MODELS,
    )


# -- prediction ---------------------------------------------------------------------------------


def test_an_idle_engine_answers_after_the_prefill_and_one_iteration() -> None:
    p = predict(SPEC, 0, 0.0, req(prompt=1000), 200)
    assert p.ttft == pytest.approx(prefill_time(EAGLE3, 1000) + step_time(EAGLE3, 1, 800))
    assert p.tpot == pytest.approx(step_time(EAGLE3, 1, 800) / EAGLE3.tau)
    assert p.others_tpot == 0 and p.others_delta == 0 and not p.extrapolated


def test_sampled_requests_gain_fewer_tokens_per_iteration() -> None:
    greedy = predict(SPEC, 3, 0.0, req(sampling=False), 200)
    sampled = predict(SPEC, 3, 0.0, req(sampling=True), 200)
    assert sampled.tpot / greedy.tpot == pytest.approx(EAGLE3.tau / EAGLE3.tau_sampling)
    # the baseline engine does not speculate: temperature changes nothing there
    assert predict(BASE, 3, 0.0, req(sampling=True), 200).tpot == pytest.approx(
        predict(BASE, 3, 0.0, req(sampling=False), 200).tpot
    )


def test_prefill_of_other_joiners_stretches_every_iteration() -> None:
    calm = predict(BASE, 4, 0.0, req(), 200)
    busy = predict(BASE, 4, 0.5, req(), 200)
    assert busy.tpot == pytest.approx(2 * calm.tpot)


def test_a_long_prompt_costs_the_requests_already_there() -> None:
    short = predict(BASE, 4, 0.0, req(prompt=50), 200)
    long = predict(BASE, 4, 0.0, req(prompt=4000), 200)
    assert long.others_delta > short.others_delta > 0
    assert long.ttft > short.ttft


def test_past_the_cap_a_request_waits_for_a_slot() -> None:
    below = predict(SPEC, EAGLE3.max_running - 1, 0.0, req(), 200)
    above = predict(SPEC, EAGLE3.max_running + 20, 0.0, req(), 200)
    assert above.ttft > below.ttft + 10 * below.tpot * 200 / EAGLE3.max_running


def test_beyond_the_measured_batch_sizes_is_flagged() -> None:
    narrow = SPEC._replace(measured=8)
    assert not predict(narrow, 6, 0.0, req(), 200).extrapolated
    assert predict(narrow, 8, 0.0, req(), 200).extrapolated


def test_the_wall_clock_scale() -> None:
    fast = SPEC._replace(scale=0.25)
    assert predict(fast, 2, 0.0, req(), 200).tpot == pytest.approx(
        0.25 * predict(SPEC, 2, 0.0, req(), 200).tpot
    )


def test_meets_is_a_soft_step() -> None:
    assert meets(0.5, 1.0) == 1.0 and meets(2.0, 1.0) == 0.0
    assert meets(1.0, 1.0) == pytest.approx(0.5)


def test_meets_width_follows_the_module_constant(monkeypatch: pytest.MonkeyPatch) -> None:
    assert meets(1.05, 1.0) == pytest.approx(0.25)  # width 0.1: 1.05 is a quarter of the way
    monkeypatch.setattr(predict_module, "MEETS_WIDTH", 0.5)
    assert meets(1.05, 1.0) == pytest.approx(0.45)
    assert meets(1.05, 1.0, width=0.1) == pytest.approx(0.25)  # an explicit width wins


def test_harm_weight_scales_what_others_lose(monkeypatch: pytest.MonkeyPatch) -> None:
    r = req()
    p = predict(SPEC, 3, 0.0, r, 200)._replace(others_tpot=0.024, others_delta=0.003)
    alone = value(p._replace(others_delta=0.0), r, 3)
    loss = alone - value(p, r, 3)
    monkeypatch.setattr(predict_module, "HARM_WEIGHT", 2.0)
    assert loss > 0
    assert alone - value(p, r, 3) == pytest.approx(2 * loss)


def test_harm_to_others_lowers_the_value() -> None:
    r = req()
    p = predict(SPEC, 3, 0.0, r, 200)
    alone = value(p, r, 0)
    crowded = value(p._replace(others_tpot=0.025, others_delta=0.003), r, 3)
    assert crowded < alone


# -- the choice ------------------------------------------------------------------------------------


def decide(s: Snapshot, reason: str = "predicted_slo") -> str:
    d = choose("slo", s)[0]
    assert d is not None and d.reason == reason
    return d.pool


def test_a_lone_request_goes_to_the_speculative_engine() -> None:
    assert decide(snap(0, 0)) == SPECULATIVE


def test_temperature_moves_a_request_off_a_speculative_engine_near_its_slo() -> None:
    # with 4 running, EAGLE-3 at tau 2.8 still meets 25 ms per token; at 2.4 it does not, and
    # neither does the baseline with 5: the greedy request is worth speculating, the sampled
    # one is better off not adding to the speculative batch
    assert (
        predict(SPEC, 4, 0.0, req(), 200).tpot
        < 0.025
        < predict(SPEC, 4, 0.0, req(sampling=True), 200).tpot
    )
    assert predict(BASE, 5, 0.0, req(), 200).tpot > 0.025
    assert decide(snap(4, 5, req(sampling=False))) == SPECULATIVE
    assert decide(snap(4, 5, req(sampling=True))) == BASELINE


def test_a_long_prompt_goes_where_its_prefill_stalls_nobody() -> None:
    # a 6,000-token prefill (2.6 s) would stall the four requests decoding on the speculative
    # engine, which have little slack left, past their SLO; the baseline's five are past the
    # strict one already. A short prompt still goes to speculation.
    assert decide(snap(4, 5, req(prompt=30))) == SPECULATIVE
    assert decide(snap(4, 5, req(prompt=6000))) == BASELINE


def test_overload_goes_to_the_pool_with_the_most_throughput() -> None:
    # both far past their SLO: the excess goes to the baseline, never into a queue
    # (and it says so: nothing can meet even the relaxed SLO for it)
    s = snap(60, 120, spec_share=0.5, base_share=0.5)
    assert decide(s, "overflow") == BASELINE


def test_a_backend_where_it_would_queue_is_not_a_candidate() -> None:
    # the speculative engine is full (its cap is 48): a request there waits for a slot, so
    # it goes to the busy but admitting baseline even though speculation would decode faster
    assert decide(snap(EAGLE3.max_running + 30, 10)) == BASELINE


def test_without_models_it_decides_as_predictive() -> None:
    s = snap(0, 0)._replace(models=None)
    d = choose("slo", s)[0]
    assert d is not None and d.reason == "below_crossover"  # predictive without gain: spillover


def test_no_usable_backend_no_decision() -> None:
    s = snap(0, 0)
    down = s._replace(
        speculative=PoolView(SPECULATIVE, (BackendView("http://spec", 0, usable=False),)),
        baseline=PoolView(BASELINE, (BackendView("http://base", 0, usable=False),)),
    )
    assert choose("slo", down)[0] is None


def test_a_cap_the_engine_showed_counts_like_the_models() -> None:
    # models that know no cap; the speculative engine showed it runs at most 2
    uncapped: dict[Pool, PoolModel] = {
        SPECULATIVE: SPEC._replace(cap=None),
        BASELINE: BASE._replace(cap=None),
    }
    s = snap(3, 4)._replace(models=uncapped)
    free = choose("slo", s)[0]
    capped = s._replace(speculative=PoolView(SPECULATIVE, (BackendView("http://spec", 3, cap=2),)))
    full = choose("slo", capped)[0]
    assert free is not None and full is not None
    assert (free.pool, full.pool) == (SPECULATIVE, BASELINE)
