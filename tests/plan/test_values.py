"""The planner's plain values: curves, the mix, the SLO."""

from __future__ import annotations

import pytest

from router.decide.predict import PoolModel
from router.plan import Curve, Mix, curve_of, mix_of
from router.plan.values import quantile_means


def test_iteration_interpolates_between_batches_and_extends_past_the_table() -> None:
    c = Curve((0.01, 0.01, 0.02, 0.04))
    assert c.iteration(1) == 0.01
    assert c.iteration(2.5) == pytest.approx(0.03)
    assert c.iteration(0.2) == 0.01  # a batch is at least one
    assert c.iteration(5) == pytest.approx(0.04 + 2 * 0.02)  # the last slope onwards


def test_iteration_past_the_table_never_falls() -> None:
    c = Curve((0.05, 0.05, 0.04))
    assert c.iteration(10) == pytest.approx(0.04)


def test_curve_of_takes_a_pool_model_into_wall_seconds() -> None:
    model = PoolModel((0.02, 0.02, 0.03), 2.8, 2.4, 0.03, 0.0004, cap=48, scale=0.25)
    c = curve_of(model)
    assert c.spi == pytest.approx((0.005, 0.005, 0.0075))
    assert (c.tau_greedy, c.tau_sampling, c.cap) == (2.8, 2.4, 48)
    assert c.prefill(1000) == pytest.approx(0.25 * (0.03 + 0.4))
    assert curve_of(model, scale=1.0).spi == model.spi


def test_limit_is_the_cap_or_the_tables_end() -> None:
    assert Curve((0.1,) * 9, cap=4).limit == 4
    assert Curve((0.1,) * 9).limit == 8


def test_quantile_means_keep_the_mean_and_order() -> None:
    values = [1, 2, 3, 4, 100, 7, 8, 9, 10, 11]
    q = quantile_means(values, 4)
    assert list(q) == sorted(q)
    assert len(q) == 4
    # equal-count bins (10 values in 4 bins: 2, 3, 2, 3) weighted back give the mean
    assert (2 * q[0] + 3 * q[1] + 2 * q[2] + 3 * q[3]) / 10 == pytest.approx(sum(values) / 10)
    assert quantile_means([5], 12) == (5.0,)
    with pytest.raises(ValueError):
        quantile_means([], 3)


def test_mix_of_checks_the_sampling_share() -> None:
    m = mix_of([100, 200], [10, 20], 0.5)
    assert m.sampling == 0.5 and m.prompt_mean == 150 and m.output_mean == 15
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            mix_of([1], [1], bad)


def test_mixes_are_close_within_the_tolerance_only() -> None:
    a = Mix((100.0,), (200.0,), 0.5)
    assert a.close_to(Mix((105.0,), (190.0,), 0.55), 0.1)
    assert not a.close_to(Mix((150.0,), (200.0,), 0.5), 0.1)
    assert not a.close_to(Mix((100.0,), (200.0,), 0.7), 0.1)
