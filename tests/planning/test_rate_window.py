"""The rate and token means the planner is given (router.planning.traffic.Window), on plain
values: Poisson arrivals from a fixed seed, a flat stream, a surge, one interval's few lengths."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.planning.traffic import Count, Window, WindowParams, poisson_band

# a compressed day's planner minute (spec-router fleet --compress 48: 60 s / 48), at the
# rate a flat 50% load gives it there: about two arrivals an interval
STEP = 1.25
RATE = 1.55
COMPRESSED = WindowParams(rate_span=600.0 / 48, means_span=3600.0 / 48)


def poisson_counts(rate: float, step: float, n: int, seed: int) -> list[int]:
    """Arrivals per interval of a Poisson stream (exponential gaps), ``n`` intervals."""
    rng = random.Random(seed)
    out = [0] * n
    t = rng.expovariate(rate)
    while t < n * step:
        out[int(t // step)] += 1
        t += rng.expovariate(rate)
    return out


def fed(window: Window, counts: list[int], step: float = STEP) -> list[tuple[float, float, float]]:
    """(rate, lower, upper) after each interval."""
    out = []
    for c in counts:
        window.add(Count(step, c, c, 1000.0 * c, 300.0 * c))
        e = window.estimate()
        out.append((e.rate, e.lower, e.upper))
    return out


def test_the_band_covers_the_true_rate_of_poisson_arrivals() -> None:
    counts = poisson_counts(RATE, STEP, 2000, seed=11)
    got = fed(Window(COMPRESSED), counts)[20:]  # (once the window has filled)
    covered = sum(lo <= RATE <= hi for _, lo, hi in got) / len(got)
    assert covered >= 0.9  # (two standard deviations: 95% expected)
    # and it is a band, not the whole line: the span (10 intervals) holds ~19 arrivals, which
    # tell the rate within a factor of about 2.6 (one interval's two: a factor of 30)
    ratios = sorted(hi / lo for _, lo, hi in got)
    assert ratios[len(ratios) // 2] < 3.0


def test_a_flat_stream_moves_the_point_less_than_the_band_is_wide() -> None:
    counts = poisson_counts(RATE, STEP, 400, seed=3)
    got = fed(Window(COMPRESSED), counts)[20:]
    width = sum(hi - lo for _, lo, hi in got) / len(got)
    # the point stays within half its band of the true rate (95% expected; this seed has a
    # cluster of 39 arrivals in 10 intervals against 19 expected)
    inside = sum(abs(r - RATE) <= (hi - lo) / 2 for r, lo, hi in got) / len(got)
    assert inside >= 0.9
    # from one plan to the next it moves by a small share of the band ...
    moves = [abs(a[0] - b[0]) for a, b in zip(got, got[1:], strict=False)]
    assert sum(moves) / len(moves) < width / 8
    # ... where one interval's rate, what the planner was given before, jumps by most of it
    raw = [c / STEP for c in counts[20:]]
    jumps = [abs(a - b) for a, b in zip(raw, raw[1:], strict=False)]
    assert sum(jumps) / len(jumps) > width / 2


def test_a_flat_stream_counted_exactly_gives_the_rate_inside_its_band() -> None:
    w = Window(COMPRESSED)
    got = fed(w, [8] * 100, step=1.25)  # 6.4/s exactly
    rate, lo, hi = got[-1]
    assert rate == pytest.approx(6.4) and lo < 6.4 < hi
    e = w.estimate()
    assert e.arrivals == 56 and e.seconds == pytest.approx(7 * 1.25)  # the fewest that hold 50
    # two a minute: the rate span (10 intervals) stops it short of 50
    w = Window(COMPRESSED)
    fed(w, [2] * 100, step=1.25)
    assert w.estimate().arrivals == 20 and w.estimate().seconds == pytest.approx(12.5)


def test_at_a_production_load_the_window_is_the_interval_itself() -> None:
    w = Window()
    for c in poisson_counts(1.5, 60.0, 30, seed=5):
        w.add(Count(60.0, c, c, 0.0, 0.0))
        assert w.estimate().seconds == 60.0  # (90 arrivals a minute: more than enough)


def test_a_surge_shows_within_the_rate_span() -> None:
    w = Window(COMPRESSED)
    before = poisson_counts(RATE, STEP, 100, seed=2)
    surge = poisson_counts(3 * RATE, STEP, 10, seed=4)  # rate_span is 10 intervals
    fed(w, before)
    after = fed(w, surge)
    rate, lo, _ = after[-1]
    assert lo > RATE and rate > 2 * RATE


def test_the_token_means_are_over_enough_requests_not_one_interval() -> None:
    w = Window(COMPRESSED)
    rng = random.Random(9)
    ended = prompt = generated = 0.0
    for _ in range(300):
        n = rng.randrange(0, 5)
        out = sum(rng.lognormvariate(5.0, 1.0) for _ in range(n))
        w.add(Count(STEP, n, n, 1000.0 * n, out))
    e = w.estimate()
    # the means are over the last intervals holding >= 400 requests (or the means' span)
    assert e.ended >= 400 or sum(c.seconds for c in w.counts) >= COMPRESSED.means_span
    for c in reversed(w.counts):
        if ended >= e.ended:
            break
        ended, prompt, generated = ended + c.ended, prompt + c.prompt, generated + c.generated
    assert ended == e.ended
    assert e.prompt_mean == pytest.approx(1000.0)
    assert e.output_mean == pytest.approx(generated / ended)


def test_no_token_counter_gives_no_means() -> None:
    w = Window()
    w.add(Count(60.0, 30, 0.0, 0.0, 0.0))  # (llama.cpp: the router's own count, no tokens)
    e = w.estimate()
    assert (e.arrivals, e.prompt_mean, e.output_mean) == (30, None, None)


def test_an_estimate_needs_an_interval() -> None:
    with pytest.raises(ValueError):
        Window().estimate()


def test_zero_arrivals_give_a_band_from_zero() -> None:
    lo, hi = poisson_band(0, 10.0, z=2.0)
    # P(no arrival at rate hi over 10 s) is the one-sided 2-sigma tail
    assert lo == 0.0 and math.exp(-hi * 10.0) == pytest.approx(0.5 * math.erfc(2 / math.sqrt(2)))


@given(st.integers(min_value=0, max_value=5000), st.floats(min_value=0.01, max_value=1e4))
def test_the_band_brackets_the_count_and_narrows_as_it_grows(n: int, seconds: float) -> None:
    lo, hi = poisson_band(n, seconds)
    assert 0.0 <= lo <= n / seconds < hi
    lo2, hi2 = poisson_band(4 * n + 4, 4 * seconds)  # four times the exposure at the same rate
    assert (hi2 - lo2) < (hi - lo)


@pytest.mark.parametrize("n", [1, 3, 10, 50, 200])
def test_the_band_is_garwoods_within_a_few_percent(n: int) -> None:
    # Garwood's exact 2-sigma (97.725%) bounds: the rate at which P(X <= n) (upper) or
    # P(X >= n) (lower) is the tail, solved here by bisection on the Poisson CDF
    tail = 0.5 * math.erfc(2 / math.sqrt(2))

    def cdf(k: int, mu: float) -> float:
        term = total = math.exp(-mu)
        for i in range(1, k + 1):
            term *= mu / i
            total += term
        return total

    def solve(f: Callable[[float], float], lo: float, hi: float) -> float:
        for _ in range(200):
            mid = (lo + hi) / 2
            if f(mid) > 0:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    upper = solve(lambda mu: cdf(n, mu) - tail, 0.0, 10.0 * n + 10)
    lower = solve(lambda mu: tail - (1 - cdf(n - 1, mu)), 0.0, 10.0 * n + 10)
    lo, hi = poisson_band(n, 1.0)
    assert hi == pytest.approx(upper, rel=0.03)
    assert lo == pytest.approx(lower, rel=0.05)
