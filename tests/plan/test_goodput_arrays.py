"""The goodput model's arrays (a pool's states, decodes and prefills at once) against the
scalar arithmetic they stand for, and against the model's numbers before it took arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.plan import Curve, Slo
from router.plan.goodput import (
    DEFAULT,
    _birth_death,
    _iterations,
    _phis,
    joined,
    joined_within,
    law,
    phi,
    pool_result,
    stall_cdf,
    stall_cdfs,
)
from tests.plan.fixtures import BASE, CHAIN, EAGLE3, MIX

PROPERTY = settings(max_examples=40, deadline=None, derandomize=True, database=None)
SLO = Slo()


@PROPERTY
@given(batches=st.lists(st.floats(-2.0, 400.0), min_size=1, max_size=20))
def test_iterations_are_the_curves_own(batches: list[float]) -> None:
    for curve in (EAGLE3, CHAIN, BASE):
        got = _iterations(np.array(curve.spi), np.array(batches))
        assert got.tolist() == [curve.iteration(b) for b in batches]


@PROPERTY
@given(xs=st.lists(st.floats(-60.0, 60.0), min_size=1, max_size=20))
def test_normal_chances_are_phis_own_to_the_bit(xs: list[float]) -> None:
    # (past |x| = 6 sqrt 2 erf is +-1 exactly, and taken so without calling it)
    assert _phis(np.array(xs)).tolist() == [phi(x) for x in xs]


def _lognormal(h: float, mean: float, sd: float) -> float:
    """P(X <= h), X lognormal with this mean and standard deviation (the scalar formula)."""
    if h <= 0:
        return 0.0
    if sd <= 1e-12 * mean:
        return 1.0 if h >= mean else 0.0
    s2 = math.log1p((sd / mean) ** 2)
    z = (math.log(h) - math.log(mean) + s2 / 2.0) / math.sqrt(s2)
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _stall(h: float, count: float, mean: float, var: float, k: int, spread: float) -> float:
    """``stall_cdf`` as scalar arithmetic (its docstring's formula)."""
    if h < 0:
        return 0.0
    if count < 1e-9 or mean <= 0:
        return 1.0
    pool = k * count
    none = (
        sum(math.exp(-pool) * pool**i / math.factorial(i) for i in range(k)) if pool < 700 else 0.0
    )
    more = 1.0 - none
    if more < 1e-12:
        return 1.0
    total = count * mean
    second = count * (var + mean * mean) * spread + total * total
    m1 = max(total / more, mean)
    sd = math.sqrt(max(0.0, second / more - m1 * m1))
    return min(1.0, none + more * _lognormal(h, m1, sd))


@PROPERTY
@given(
    points=st.lists(
        st.tuples(st.floats(-1.0, 30.0), st.floats(0.0, 800.0)), min_size=1, max_size=12
    ),  # fmt: skip
    engines=st.integers(1, 8),
    spread=st.floats(1.0, 30.0),
)
def test_stall_chances_are_the_scalar_formulas(points: list[tuple[float, float]], engines: int,
                                               spread: float) -> None:  # fmt: skip
    h = np.array([p[0] for p in points])
    count = np.array([p[1] for p in points])
    got = stall_cdfs(np.stack([h, h + 1.0]), count, 0.5, 0.2, engines, spread)
    for i, (x, c) in enumerate(points):
        for row, headroom in ((0, x), (1, x + 1.0)):
            want = _stall(headroom, c, 0.5, 0.2, engines, spread)
            assert got[row, i] == pytest.approx(want, rel=1e-9, abs=1e-12)
            assert stall_cdf(headroom, c, 0.5, 0.2, engines, spread) == got[row, i]


@PROPERTY
@given(windows=st.lists(st.floats(0.0, 5.0), min_size=1, max_size=10),
       rate=st.floats(0.0, 300.0), engines=st.integers(1, 8))  # fmt: skip
def test_joiners_over_an_array_are_each_windows_own(windows: list[float], rate: float,
                                                    engines: int) -> None:  # fmt: skip
    got = joined(np.array(windows), rate, engines)
    for i, w in enumerate(windows):
        pool = rate * engines * w
        if engines == 1 or not pool > 0 or pool > 4.0 * engines**2 + 400.0:
            continue  # (closed forms)
        # the window's own sum: E[N // k] over the count's likely values
        lo = max(0, math.floor(pool - 8.0 * math.sqrt(pool)))
        hi = math.ceil(pool + 8.0 * math.sqrt(pool)) + engines
        terms = [
            math.exp(-pool + j * math.log(pool) - math.lgamma(j + 1.0)) for j in range(lo, hi + 1)
        ]
        want = pool - sum(p * ((lo + j) % engines) for j, p in enumerate(terms)) / sum(terms)
        assert got[i] == pytest.approx(max(0.0, want / engines), rel=1e-9, abs=1e-12)
        assert joined_within(w, rate, engines) == got[i]


@PROPERTY
@given(rate=st.floats(0.01, 40.0), engines=st.integers(1, 4), z=st.floats(1.0, 8.0))
def test_the_birth_death_distribution_is_the_recurrences(rate: float, engines: int,
                                                         z: float) -> None:  # fmt: skip
    mu = law(BASE, MIX).departures
    top = engines * 300
    pi = _birth_death(rate, np.array(mu), engines, top, z)
    assert pi.sum() == pytest.approx(1.0, rel=1e-12)
    # each step's ratio: rate over the departures at n (engines within one of each other)
    for n in range(1, min(len(pi), 60)):
        q, r = divmod(n, engines)
        cap = len(mu) - 1
        out = (engines - r) * mu[min(q, cap)] + r * mu[min(q + 1, cap)]
        if pi[n - 1] > 1e-250:
            assert pi[n] / pi[n - 1] == pytest.approx((rate / out) ** (1.0 / z), rel=1e-9)


# the model's numbers before it took arrays (commit 40fc91c, a loop per state): strict,
# relaxed, blocked, mean batch (12 digits); Poisson with no limit, a limit of 3, and
# peakedness 2.5
BEFORE = {
    (BASE, 1, 1.5): (
        (0, 0, 0.071204350025, 249.474149365),
        (0.125119907894, 0.295477187455, 0.701175529973, 2.62635508049),
        (0, 4.02707114481e-07, 0.0298945859399, 232.870743303),
    ),
    (BASE, 2, 0.5): (
        (0.575196944868, 0.978669090005, 0, 1.31621964654),
        (0.602663524352, 0.946508817212, 0.0393507997627, 1.24015552665),
        (0.511227001086, 0.985601203965, 0, 1.89298128509),
    ),
    (EAGLE3, 4, 3.0): (
        (0.0029984925929, 0.234140513438, 9.24723764376e-12, 10.7043848431),
        (0.389540000462, 0.649020694182, 0.339036303118, 2.59388934951),
        (0.0149535838372, 0.240306061578, 2.77553775099e-06, 12.5716382663),
    ),
    (CHAIN, 2, 0.5): (
        (0.71662914719, 0.988934977624, 0, 0.958178014223),
        (0.710301739511, 0.976420974965, 0.0150534996059, 0.934492777855),
        (0.706248199578, 0.988746974394, 0, 1.52303584325),
    ),
}


@pytest.mark.parametrize("key", list(BEFORE), ids=["base-1", "base-2", "eagle3-4", "chain-2"])
def test_a_pool_is_valued_as_before_arrays(key: tuple[Curve, int, float]) -> None:
    curve, k, rate = key
    got = (
        pool_result(curve, MIX, SLO, k, rate),
        pool_result(curve, MIX, SLO, k, rate, limit=3),
        pool_result(curve, MIX, SLO, k, rate, None, DEFAULT, 2.5),
    )
    for a, b in zip(got, BEFORE[key], strict=True):
        assert tuple(a) == pytest.approx(b, rel=1e-9, abs=1e-15)
