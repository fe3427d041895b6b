"""What the slo policy learns of its engines: prefill, tokens per iteration by temperature,
prompt sizing; and how a request's prompt is sized from its body."""

from __future__ import annotations

import pytest

from router.decide.models import EngineModels, PrefillFit, Sample, decode_only_spi
from router.forward.request import inspect, prompt_size
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


def test_sampled_requests_teach_their_own_tokens_per_iteration() -> None:
    engines = EngineModels(model_table(400, 200))
    models = engines.models()
    assert models is not None
    spi2 = models[SPECULATIVE].iteration(2)
    # greedy requests gain 2.8 tokens per iteration, sampled ones 2.0; the engine reports
    # the mean over its iterations, 2.4
    for _ in range(200):
        engines.record(sample(sampling=False, spt=spi2 / 2.8), tau_mix=2.4)
        engines.record(sample(sampling=True, spt=spi2 / 2.0), tau_mix=2.4)
    assert engines.tau_of(True) == pytest.approx(2.0, rel=0.1)
    assert engines.tau_of(False) == pytest.approx(2.8, rel=0.1)


def test_tokens_per_character_and_output_length_follow_the_traffic() -> None:
    engines = EngineModels(None)
    for _ in range(400):
        engines.record(sample(prompt_tokens=100, prompt_chars=300, output_tokens=50, spt=0), None)
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
        engines.record(sample(BASELINE, prompt_tokens=tokens, ttft=5.0, load_at_start=6), None)
    assert engines.prefill[BASELINE].seconds(1000) == before
    # alone on an idle engine: prefill + one iteration
    for tokens in (200, 1000, 3000) * 60:
        ttft = 0.05 + tokens / 1000 + spi1
        engines.record(sample(BASELINE, prompt_tokens=tokens, ttft=ttft, load_at_start=0), None)
    assert engines.prefill[BASELINE].per_token == pytest.approx(1 / 1000, rel=0.1)
    assert engines.prefill[BASELINE].seconds(1000) == pytest.approx(1.05, rel=0.1)
