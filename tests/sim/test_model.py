"""The pure performance model against values worked out by hand."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest

from router.sim.fit import FITS, PresetFit, ratio, refit
from router.sim.model import (
    BASELINE,
    EAGER_FACTOR,
    EAGLE3,
    EAGLE3_CHAIN,
    EAGLE3_TREE,
    NO_OVERLAP_FACTOR,
    PRESETS,
    closed_loop,
    crossover,
    decode_bound_tps,
    expected_steps,
    gain_pmf,
    mean_gain,
    per_request_tps,
    prefill_time,
    sample_gain,
    solve_alpha,
    step_time,
    total_tps,
)


def test_alpha_solves_the_mean_acceptance_length() -> None:
    alpha = solve_alpha(2.8, 3)
    # alpha + alpha^2 + alpha^3 = 1.8
    assert alpha == pytest.approx(0.765485, abs=1e-6)
    assert alpha + alpha**2 + alpha**3 == pytest.approx(1.8, abs=1e-12)
    assert solve_alpha(1.0, 3) == pytest.approx(0.0, abs=1e-12)
    assert solve_alpha(4.0, 3) == pytest.approx(1.0, abs=1e-12)
    assert solve_alpha(1.0, 0) == 0.0
    with pytest.raises(ValueError):
        solve_alpha(4.5, 3)
    with pytest.raises(ValueError):
        solve_alpha(0.9, 3)


def test_gain_distribution() -> None:
    alpha = solve_alpha(2.8, 3)
    pmf = gain_pmf(alpha, 3)
    assert sum(pmf) == pytest.approx(1.0)
    assert pmf[0] == pytest.approx(1 - alpha)  # first draft rejected: one token
    assert pmf[3] == pytest.approx(alpha**3)  # all three accepted: four tokens
    assert sum((j + 1) * p for j, p in enumerate(pmf)) == pytest.approx(2.8)
    # Inverse-CDF sampling on an even grid of uniforms reproduces the distribution.
    n = 100_000
    gains = [sample_gain(alpha, 3, (i + 0.5) / n) for i in range(n)]
    assert sum(gains) / n == pytest.approx(2.8, abs=1e-3)
    assert {g: gains.count(g) / n for g in range(1, 5)} == pytest.approx(
        {g: pmf[g - 1] for g in range(1, 5)}, abs=1e-4
    )
    assert all(sample_gain(0.0, 0, u) == 1 for u in (0.0, 0.5, 0.999))


def test_iteration_costs() -> None:
    assert step_time(EAGLE3, 1, 0) == pytest.approx(0.027270 + 0.007341)
    assert step_time(BASELINE, 10, 1000) == pytest.approx(0.01871 + 0.01294 + 20e-6)
    assert prefill_time(BASELINE, 1024) == pytest.approx(0.030 + 1024 / 2500)
    assert prefill_time(EAGLE3, 1024) == pytest.approx(1.08 * (0.030 + 1024 / 2500))


def test_preset_checks() -> None:
    per, total = decode_bound_tps(EAGLE3, 1)
    assert per == pytest.approx(2.8 / 0.034611) == pytest.approx(80.9, abs=0.05)
    assert decode_bound_tps(EAGLE3, 48)[1] == pytest.approx(48 * 2.8 / (0.02727 + 0.007341 * 48))
    assert decode_bound_tps(EAGLE3, 48)[1] == pytest.approx(354.0, abs=0.1)
    assert decode_bound_tps(EAGLE3, 100) == decode_bound_tps(EAGLE3, 48)  # queue beyond 48
    assert 1 / BASELINE.b == pytest.approx(772.8, abs=0.1)
    assert decode_bound_tps(BASELINE, 256)[1] < 1 / BASELINE.b
    with pytest.raises(ValueError):
        EAGLE3.replace(tau=4.2)
    assert EAGLE3.replace(tau=3.0).tau == 3.0 and EAGLE3.tau == 2.8
    assert mean_gain(solve_alpha(EAGLE3.tau_sampling, 3), 3) == pytest.approx(2.4)


def test_expected_steps() -> None:
    alpha = solve_alpha(2.8, 3)
    assert expected_steps(0, 2.8, 3) == 0
    assert expected_steps(1, 2.8, 3) == 1
    assert expected_steps(2, 2.8, 3) == pytest.approx(1 + (1 - alpha))  # 1 token first: again
    assert expected_steps(255, 1.0, 0) == 255
    # Renewal theory: E[N(m)] - m/mu tends to (E[G^2] - mu) / (2 mu^2).
    pmf = gain_pmf(alpha, 3)
    eg2 = sum((j + 1) ** 2 * p for j, p in enumerate(pmf))
    limit = (eg2 - 2.8) / (2 * 2.8**2)
    assert expected_steps(5000, 2.8, 3) - 5000 / 2.8 == pytest.approx(limit, abs=1e-9)
    assert expected_steps(50_000, 2.8, 3) - 50_000 / 2.8 == pytest.approx(limit, abs=1e-9)


def test_closed_loop_one_client_by_hand() -> None:
    # Baseline, one client: every decode iteration holds only this request, whose context
    # averages 128 + 255/2 tokens over its 256 iterations; the prefill is not decode time.
    t = 0.01871 + 0.001294 + 20e-9 * (128 + 127.5)
    assert per_request_tps(BASELINE, 1, 128, 256) == pytest.approx(1 / t)
    # Total: 256 tokens per 256 iterations plus one prefill (the engine starts at once).
    assert total_tps(BASELINE, 1, 128, 256) == pytest.approx(256 / (256 * t + 0.030 + 128 / 2500))
    # eagle3 at one client is the decode-bound 80.9 less the truncated last iteration.
    point = closed_loop(EAGLE3, 1, 128, 256)
    d = expected_steps(255, 2.8, 3)
    assert point.per_request_tps == pytest.approx(255 / (d * point.decode_iteration_time))
    assert 80.0 < point.per_request_tps < 80.9


def test_closed_loop_many_clients_by_hand() -> None:
    # Baseline, 16 clients, 256 iterations each plus one spent re-joining.
    p = closed_loop(BASELINE, 16, 128, 256)
    cycle = 257
    assert p.batch == pytest.approx(16 * 256 / cycle)
    assert p.joins == pytest.approx(16 / cycle)
    context = 128 + 127.5
    t_dec = step_time(BASELINE, 1 + 15 * 256 / cycle, (1 + 15 * 256 / cycle) * context)
    t_dec += 15 / cycle * prefill_time(BASELINE, 128)
    assert p.per_request_tps == pytest.approx(1 / t_dec)
    t = step_time(BASELINE, p.batch, p.batch * context) + p.joins * prefill_time(BASELINE, 128)
    assert p.total_tps == pytest.approx(16 * 256 / (cycle * t))
    assert p.client_tps == pytest.approx(p.total_tps / 16)


def test_queueing_beyond_max_running() -> None:
    at_49 = closed_loop(EAGLE3, 49, 128, 256)
    at_64 = closed_loop(EAGLE3, 64, 128, 256)
    # The batch stays at 48: decode speed and total stop changing, the queue grows.
    assert at_64.batch == 48
    assert at_64.per_request_tps == pytest.approx(at_49.per_request_tps)
    assert at_64.total_tps == pytest.approx(at_49.total_tps)
    assert at_64.client_tps == pytest.approx(at_64.total_tps / 64)
    assert at_64.ttft > at_49.ttft > closed_loop(EAGLE3, 48, 128, 256).ttft
    assert at_64.total_tps < decode_bound_tps(EAGLE3, 48)[1]  # prefill stalls cost throughput


def test_curves_are_monotone() -> None:
    for preset in PRESETS.values():
        pts = [closed_loop(preset, n, 128, 256) for n in (1, 2, 4, 8, 16, 32)]
        assert all(a.per_request_tps > b.per_request_tps for a, b in pairwise(pts))
        # past a compute-bound knee the total stops growing (test_settings_change_...)
        grows = [p for p in pts if not preset.knee or p.batch <= preset.knee]
        assert all(a.total_tps < b.total_tps for a, b in pairwise(grows))
        assert all(a.total_tps <= b.total_tps * (1 + 1e-9) for a, b in pairwise(pts))


def test_crossovers() -> None:
    # Decode-bound: 2.8 / (27.27 + 7.341 n) = 1 / (18.71 + 1.294 n).
    expected = (27.27 - 2.8 * 18.71) / (2.8 * 1.294 - 7.341)
    assert crossover(EAGLE3, BASELINE, None, None) == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(6.756, abs=1e-3)
    # 1K-token prompts: prefill stalls pull the crossing earlier, more for short outputs.
    per = [crossover(EAGLE3, BASELINE, 1024, n) for n in (64, 256, 2048)]
    assert per == pytest.approx([6.143, 6.378, 6.819], abs=1e-3)
    client = [crossover(EAGLE3, BASELINE, 1024, n, metric="client") for n in (64, 256, 2048)]
    assert client == pytest.approx([4.222, 5.959, 6.770], abs=1e-3)
    # At the crossing the two per-request speeds agree.
    n = per[1]
    assert n is not None
    assert per_request_tps(EAGLE3, n, 1024, 256) == pytest.approx(
        per_request_tps(BASELINE, n, 1024, 256), rel=1e-6
    )
    # A speculative engine that is never faster has no crossing.
    assert crossover(EAGLE3.replace(tau=1.0), BASELINE, 128, 256) is None


def test_the_regimes_cross_where_their_published_curves_do() -> None:
    # eagle3-chain: no crossover up to 64 (the EAGLE-3 paper's SGLang table), about x1.35 there;
    # decode-bound, and in a closed loop of 128-token prompts and 256-token outputs, per request
    # and per client
    for metric in ("per_request", "client"):
        assert crossover(EAGLE3_CHAIN, BASELINE, None, None, metric=metric, hi=64) is None
        assert crossover(EAGLE3_CHAIN, BASELINE, 128, 256, metric=metric, hi=64) is None
        # and none at all: the slope ratio is below 1
        assert crossover(EAGLE3_CHAIN, BASELINE, None, None, metric=metric) is None
    assert 1.3 <= ratio(EAGLE3_CHAIN, BASELINE, 64) <= 1.4
    assert EAGLE3_CHAIN.b / (EAGLE3_CHAIN.tau * BASELINE.b) < 1
    # eagle3-tree: crosses between 16 and 24 (SpecDecode-Bench's tree k=21)
    for metric in ("per_request", "client"):
        for lengths in ((None, None), (128, 256)):
            at = crossover(EAGLE3_TREE, BASELINE, *lengths, metric=metric, hi=64)
            assert at is not None and 16 < at < 24, (metric, lengths, at)
    assert ratio(EAGLE3_TREE, BASELINE, 64) < 0.75
    # the seed still crosses near 7
    assert crossover(EAGLE3, BASELINE, None, None, hi=64) == pytest.approx(6.756, abs=1e-3)


@pytest.mark.parametrize("fit", FITS, ids=lambda f: f.preset.name)
def test_each_preset_holds_what_its_fit_gives(fit: PresetFit) -> None:
    again = refit(fit)  # least squares from the seed's costs, not the preset's
    for name in fit.free:
        assert getattr(fit.preset, name) == pytest.approx(getattr(again, name), rel=5e-4)
    for name in ("tau", "max_running", "knee", "c_kv", "p0", "r_pre", "prefill_factor"):
        assert getattr(again, name) == getattr(fit.preset, name)  # held fixed


def test_settings_change_the_iteration_cost() -> None:
    # batches above --cuda-graph-max-bs run eagerly: the fixed cost grows by EAGER_FACTOR
    graphs = EAGLE3.replace(cuda_graph_max_bs=8)
    assert step_time(graphs, 8, 0) == step_time(EAGLE3, 8, 0)
    assert step_time(graphs, 9, 0) == pytest.approx(step_time(EAGLE3, 9, 0) + 0.5 * EAGLE3.a)
    assert EAGER_FACTOR == 1.5
    # a mean batch between 8 and 9 pays it for its share of iterations above 8
    assert step_time(graphs, 8.25, 0) == pytest.approx(
        step_time(EAGLE3, 8.25, 0) + 0.125 * EAGLE3.a
    )
    assert closed_loop(graphs, 16, 128, 256).total_tps < closed_loop(EAGLE3, 16, 128, 256).total_tps
    assert closed_loop(graphs, 4, 128, 256) == closed_loop(EAGLE3, 4, 128, 256)
    # --disable-overlap-schedule: a baseline iteration costs 10% more; the speculative presets
    # were measured without the overlap scheduler, so their costs do not change
    no_overlap = BASELINE.replace(disable_overlap_schedule=True)
    assert BASELINE.overlap_schedule and not no_overlap.overlap_schedule
    assert step_time(no_overlap, 10, 1000) == pytest.approx(
        NO_OVERLAP_FACTOR * step_time(BASELINE, 10, 1000)
    )
    spec = EAGLE3.replace(disable_overlap_schedule=True)
    assert not EAGLE3.overlap_schedule
    assert step_time(spec, 10, 1000) == step_time(EAGLE3, 10, 1000)
    # the knee: past 13 running requests the cost is proportional to the batch (a roofline),
    # so the tree's total rate stops growing there and never falls
    t = EAGLE3_TREE
    assert step_time(t, 13, 0) == pytest.approx(t.a + 13 * t.b)
    assert step_time(t, 20, 0) == pytest.approx((t.a / 13 + t.b) * 20)
    totals = [decode_bound_tps(t, n)[1] for n in range(1, 257)]
    assert all(x <= y * (1 + 1e-12) for x, y in pairwise(totals))
    assert totals[-1] == pytest.approx(totals[12])


def test_draft_shape() -> None:
    assert (EAGLE3.spec_k, EAGLE3.eagle_topk, EAGLE3.draft_tokens) == (3, 1, 4)  # a chain
    assert (EAGLE3_TREE.spec_k, EAGLE3_TREE.eagle_topk, EAGLE3_TREE.draft_tokens) == (3, 4, 22)
    assert BASELINE.draft_tokens == 0
    with pytest.raises(ValueError, match="num_draft_tokens"):
        EAGLE3.replace(num_draft_tokens=3)  # fewer than the chain's 3 drafts and the root
    with pytest.raises(ValueError, match="cuda_graph_max_bs"):
        EAGLE3.replace(cuda_graph_max_bs=0)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        closed_loop(EAGLE3, 0.5, 128, 256)
    with pytest.raises(ValueError):
        closed_loop(EAGLE3, 4, 128, 1)
    with pytest.raises(ValueError):
        crossover(EAGLE3, BASELINE, 128, 256, metric="total")
    assert math.isfinite(closed_loop(EAGLE3, 4, 0, 2).per_request_tps)
