"""What the slo policy learns of its engines: prefill, tokens per iteration by temperature,
prompt sizing; and how a request's prompt is sized from its body."""

from __future__ import annotations

from dataclasses import replace

import pytest

from router.forward.request import inspect, prompt_size
from router.learn.models import EngineModels, PrefillFit, Sample, decode_only_spi
from router.pools import BASELINE, SPECULATIVE
from router.sim.model import BASELINE as BASE_PRESET
from router.sim.model import EAGLE3, closed_loop, prefill_time
from tests.support.tables import model_table


def test_a_prefill_line_is_recovered_from_samples() -> None:
    fit = PrefillFit(base=0.5, per_token=0.0)  # a wrong seed
    for tokens in (50, 400, 1200, 3000) * 40:
        fit.add(tokens, 0.03 + tokens / 2500)
    assert fit.per_token == pytest.approx(1 / 2500, rel=0.05)
    assert fit.base == pytest.approx(0.03, abs=0.02)


def test_bad_prefill_samples_are_ignored() -> None:
    fit = PrefillFit()
    before = (fit.base, fit.per_token)
    fit.add(100, float("nan"))
    fit.add(100, -1.0)
    assert (fit.base, fit.per_token, fit.samples) == (*before, 0)


def test_closed_loop_stalls_are_taken_out_of_a_calibration_point() -> None:
    # the model's closed loop at 8 clients, 1K prompts: what calibration measures, and the
    # decode-only iteration it should leave once the joiners' prefills are taken out
    point = closed_loop(BASE_PRESET, 8, 1024, 256)
    measured_spi = 1 / point.per_request_tps
    pure = decode_only_spi(measured_spi, 8, 256, 1.0, prefill_time(BASE_PRESET, 1024))
    joins = (8 - 1) / (point.iterations + 1)
    assert pure == pytest.approx(measured_spi - joins * prefill_time(BASE_PRESET, 1024))
    assert pure < measured_spi


def test_models_from_a_calibrated_table() -> None:
    models = EngineModels(model_table(400, 200)).models()
    assert models is not None
    spec, base = models[SPECULATIVE], models[BASELINE]
    assert spec.tau_greedy == pytest.approx(EAGLE3.tau)
    assert spec.tau_sampling == spec.tau_greedy  # not measured: no worse than greedy
    assert base.tau_greedy == base.tau_sampling == 1.0
    assert spec.measured == base.measured == 32
    # one iteration of a lone request, and the prefill, from the table's points
    assert spec.iteration(1) == pytest.approx(0.0346, rel=0.05)
    assert base.prefill(400) == pytest.approx(prefill_time(BASE_PRESET, 400), rel=0.25)


def sample(
    pool: str = SPECULATIVE, sampling: bool = True, spt: float = 0.02, **kw: float
) -> Sample:
    fields: dict[str, object] = dict(
        pool=pool, concurrency=2.0, spt=spt, ttft=0.3, sampling=sampling, prompt_tokens=400,
        prompt_chars=1600, output_tokens=200, load_at_start=1, prefill_share=0.0,
    )  # fmt: skip
    fields.update(kw)
    return Sample(**fields)  # type: ignore[arg-type]


def test_the_engines_acceptance_is_split_by_the_calibrated_ratio() -> None:
    table = model_table(400, 200)
    fit = table.speculative.fit
    assert fit is not None
    # calibration's probe found 2.0 tokens per iteration at temperature 1 against 2.8 greedy
    engines = EngineModels(replace(table, speculative=replace(
        table.speculative, fit=replace(fit, tau=2.8, tau_sampling=2.0))))  # fmt: skip
    assert (engines.tau_of(False), engines.tau_of(True)) == (2.8, 2.0)
    # half the speculative pool's requests sample; the engine reports the mean per verify step
    for i in range(400):
        engines.record(sample(sampling=i % 2 == 0))
    engines.observe_accept(2.4 * 0.9)  # acceptance fell by a tenth
    assert engines.tau_of(False) == pytest.approx(2.8 * 0.9, rel=0.02)
    assert engines.tau_of(True) == pytest.approx(2.0 * 0.9, rel=0.02)
    engines.observe_accept(None)  # no reading: nothing changes
    engines.observe_accept(0.0)  # an idle engine's 0 is not an acceptance
    assert engines.tau_of(False) == pytest.approx(2.8 * 0.9, rel=0.02)


def test_a_decode_sample_is_taken_without_the_prefills_that_stalled_it() -> None:
    engines = EngineModels(model_table(400, 200))
    models = engines.models()
    assert models is not None
    spi4 = models[BASELINE].iteration(4)
    # requests at 4 in flight decoded 199 tokens in 199 iterations of 50 ms, 2 s of which
    # were other requests' prefills: the decode alone was 40 ms per iteration
    for _ in range(300):
        engines.record(sample(BASELINE, concurrency=4.0, spt=0.05, stall=2.0))
    learned = engines.models()
    assert learned is not None
    assert learned[BASELINE].iteration(4) == pytest.approx((0.05 * 199 - 2.0) / 199, rel=0.05)
    assert learned[BASELINE].iteration(4) != pytest.approx(spi4, rel=0.05)
    # a decode that was mostly stalls teaches nothing
    before = learned[BASELINE].iteration(4)
    for _ in range(300):
        engines.record(sample(BASELINE, concurrency=4.0, spt=0.05, stall=9.0))
    after = engines.models()
    assert after is not None and after[BASELINE].iteration(4) == before


def test_learned_iterations_never_get_cheaper_with_more_running() -> None:
    engines = EngineModels(model_table(400, 200))
    for _ in range(300):  # noise: a bin at 16 that reads cheaper than the one at 8
        engines.record(sample(BASELINE, concurrency=16.0, spt=0.005))
    models = engines.models()
    assert models is not None
    spi = models[BASELINE].spi
    assert all(a <= b for a, b in zip(spi[1:-1], spi[2:], strict=True))


def test_tokens_per_character_and_output_length_follow_the_traffic() -> None:
    engines = EngineModels(None)
    for _ in range(400):
        engines.record(sample(prompt_tokens=100, prompt_chars=300, output_tokens=50, spt=0))
    assert engines.tokens_per_char.value == pytest.approx(1 / 3, rel=0.05)
    assert engines.mean_output.value == pytest.approx(50, rel=0.05)
    assert engines.models() is None  # no curves yet: nothing to predict with


def test_prompt_sizes() -> None:
    parts = [{"type": "text", "text": "defg"}, {"type": "image_url", "image_url": {"url": "x"}}]
    chat = {"messages": [{"role": "system", "content": "abc"}, {"role": "user", "content": parts}]}
    assert prompt_size(chat) == (7, None)
    assert prompt_size({"prompt": "hello"}) == (5, None)
    assert prompt_size({"prompt": [1, 2, 3]}) == (0, 3)
    assert prompt_size({"prompt": [[1, 2], [3]]}) == (0, 3)
    assert prompt_size({"prompt": ["ab", "cd"]}) == (4, None)
    assert prompt_size({"input": "xyz"}) == (3, None)
    assert prompt_size({"messages": "bad"}) == (0, None)


def test_a_request_without_temperature_is_sampled() -> None:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    assert inspect("/v1/chat/completions", body, None).sampling
    body0 = b'{"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}'
    info = inspect("/v1/chat/completions", body0, None)
    assert not info.sampling and info.prompt_chars == 2


def test_prefill_is_learned_only_from_requests_that_found_the_engine_idle() -> None:
    engines = EngineModels(model_table(400, 200))
    models = engines.models()
    assert models is not None
    before = engines.prefill[BASELINE].seconds(1000)
    spi1 = models[BASELINE].iteration(1)
    # under load a time to first token also holds other joiners' prefills: not a sample
    for tokens in (200, 1000, 3000) * 30:
        engines.record(sample(BASELINE, prompt_tokens=tokens, ttft=5.0, load_at_start=6))
    assert engines.prefill[BASELINE].seconds(1000) == before
    # alone on an idle engine: prefill + one iteration
    for tokens in (200, 1000, 3000) * 60:
        ttft = 0.05 + tokens / 1000 + spi1
        engines.record(sample(BASELINE, prompt_tokens=tokens, ttft=ttft, load_at_start=0))
    assert engines.prefill[BASELINE].per_token == pytest.approx(1 / 1000, rel=0.1)
    assert engines.prefill[BASELINE].seconds(1000) == pytest.approx(1.05, rel=0.1)


def test_the_first_of_a_burst_teaches_no_prefill() -> None:
    """It found the engine idle, but the requests sent right after it joined its prefill
    before its first token: its time to first token holds theirs too (a closed loop's users
    all starting at once made the learned prefill grow phase after phase)."""
    engines = EngineModels(model_table(400, 200))
    before = engines.prefill[BASELINE].seconds(1000)
    for tokens in (200, 1000, 3000) * 30:
        burst = sample(BASELINE, prompt_tokens=tokens, ttft=5.0, load_at_start=0, joined=31)
        engines.record(burst)
    assert engines.prefill[BASELINE].seconds(1000) == before
    engines.record(sample(BASELINE, prompt_tokens=1000, ttft=5.0, load_at_start=0, joined=0))
    assert engines.prefill[BASELINE].seconds(1000) > before  # (alone: it counts)


def test_one_slow_request_at_a_new_concurrency_does_not_set_the_curve() -> None:
    """More running is never cheaper, so a bin reads at least every bin below it: one request
    slowed by something else, alone in a bin of its own, once set the whole curve above it."""
    engines = EngineModels(model_table(400, 200))
    models = engines.models()
    assert models is not None
    calibrated = models[BASELINE].iteration(24)
    engines.record(sample(BASELINE, concurrency=5.0, spt=models[BASELINE].iteration(5) * 10))
    after = engines.models()
    assert after is not None
    assert after[BASELINE].iteration(24) == pytest.approx(calibrated, rel=0.01)
    assert after[BASELINE].iteration(5) < models[BASELINE].iteration(5) * 1.5
    # a real change still shows, within a few requests
    for _ in range(20):
        engines.record(sample(BASELINE, concurrency=5.0, spt=models[BASELINE].iteration(5) * 3))
    learned = engines.models()
    assert learned is not None
    assert learned[BASELINE].iteration(5) == pytest.approx(
        models[BASELINE].iteration(5) * 3, rel=0.2
    )


def test_a_short_decode_counts_for_its_few_iterations() -> None:
    """The first of a burst with a few tokens to give: its one or two iterations held the
    prefills of the burst behind it, which the router cannot all see. Four such samples (two
    iterations each) at 4x must move the curve less than one long decode at 4x would."""
    engines = EngineModels(model_table(400, 200))
    models = engines.models()
    assert models is not None
    before = models[BASELINE].iteration(8)
    for _ in range(4):
        engines.record(sample(BASELINE, concurrency=8.0, spt=before * 4, output_tokens=3))
    short = engines.models()
    assert short is not None
    fresh = EngineModels(model_table(400, 200))
    fresh.record(sample(BASELINE, concurrency=8.0, spt=before * 4, output_tokens=200))
    long = fresh.models()
    assert long is not None
    assert before < short[BASELINE].iteration(8) < long[BASELINE].iteration(8)


def test_a_table_without_an_acceptance_length_is_rescaled_by_the_first_reading() -> None:
    # calibrate found no acceptance length (an engine that reports none there: the table says
    # 1.0, its speculative iterations then one token each); the engine reports 2.8 later
    table = model_table(400, 200)
    fit = table.speculative.fit
    assert fit is not None
    known, unknown = (
        EngineModels(table),
        EngineModels(
            replace(table, speculative=replace(table.speculative, fit=replace(fit, tau=1.0)))
        ),
    )
    unknown.observe_accept(1.0)  # no speculation seen yet: not a reading of its acceptance
    for engines in (known, unknown):
        engines.observe_accept(2.8)
    a, b = known.models(), unknown.models()
    assert a is not None and b is not None
    # the prefill line the table implies (time to first token less one iteration, not one token)
    assert b[SPECULATIVE].prefill(400) == pytest.approx(a[SPECULATIVE].prefill(400))
    # the same engine either way: per-request decode speed as calibrated, not 2.8x faster
    for n in (1, 8, 32):
        speed_a = a[SPECULATIVE].tau_greedy / a[SPECULATIVE].iteration(n)
        speed_b = b[SPECULATIVE].tau_greedy / b[SPECULATIVE].iteration(n)
        assert speed_b == pytest.approx(speed_a)
    assert b[SPECULATIVE].capacity() == pytest.approx(a[SPECULATIVE].capacity())
    # once known, later readings move the speed (acceptance fell: fewer tokens per iteration)
    unknown.observe_accept(1.4)
    c = unknown.models()
    assert c is not None
    assert c[SPECULATIVE].iteration(8) == pytest.approx(b[SPECULATIVE].iteration(8))
    assert c[SPECULATIVE].tau_greedy == pytest.approx(1.4, rel=0.02)
