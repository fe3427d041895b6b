"""The pure performance model against values worked out by hand."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest

from router.sim.model import (
    BASELINE,
    EAGLE3,
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
    for preset in (EAGLE3, BASELINE):
        pts = [closed_loop(preset, n, 128, 256) for n in (1, 2, 4, 8, 16, 32)]
        assert all(a.per_request_tps > b.per_request_tps for a, b in pairwise(pts))
        assert all(a.total_tps < b.total_tps for a, b in pairwise(pts))


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


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        closed_loop(EAGLE3, 0.5, 128, 256)
    with pytest.raises(ValueError):
        closed_loop(EAGLE3, 4, 128, 1)
    with pytest.raises(ValueError):
        crossover(EAGLE3, BASELINE, 128, 256, metric="total")
    assert math.isfinite(closed_loop(EAGLE3, 4, 0, 2).per_request_tps)
