"""The forecast: a steady load stays put, a ramp is followed, a surge widens the band at once
but does not set the trend, and a day seen gives the next day's shape."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from router.plan import Forecast, ForecastParams, Holt, forecast, observe
from router.plan.forecast import level_noise

P = ForecastParams(season=0)


def feed(rates: list[float], p: ForecastParams = P, seconds: float = 60.0) -> Holt:
    state = None
    for r in rates:
        state = observe(state, r, seconds, p)
    assert state is not None
    return state


def poisson_minutes(rate: float, n: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        count, t = 0, rng.expovariate(rate)
        while t < 60.0:
            count += 1
            t += rng.expovariate(rate)
        out.append(count / 60.0)
    return out


def test_a_steady_load_forecasts_itself_with_a_narrow_band() -> None:
    fc = forecast(feed(poisson_minutes(2.0, 120)), 30, 60.0, P)
    assert all(abs(x - 2.0) < 0.25 for x in fc.point)
    # the count noise (2 req/s over a minute is +-9%) is not the rate's movement
    assert fc.upper[0] < 2.0 * 1.25
    assert all(u >= p for u, p in zip(fc.upper, fc.point, strict=True))


def test_a_ramp_is_followed_and_extrapolated() -> None:
    ramp = [0.5 + 0.02 * i for i in range(60)]
    fc = forecast(feed(ramp), 30, 60.0, P)
    assert fc.point[0] == pytest.approx(ramp[-1] + 0.02, abs=0.05)
    assert fc.point[29] > fc.point[0] + 0.3


def test_a_surge_widens_the_band_at_once_and_moves_the_level_step_by_step() -> None:
    calm = feed([1.0] * 60)
    one = observe(calm, 3.0, 60.0, P)
    # the level learns from the error clipped to a few typical errors
    assert one.level < 1.2
    assert forecast(one, 10, 60.0, P).upper[0] > forecast(calm, 10, 60.0, P).upper[0] * 1.5
    after = feed([1.0] * 60 + [3.0] * 10 + [1.0] * 30)
    assert abs(forecast(after, 60, 60.0, P).point[59] - 1.0) < 0.3


def test_after_a_surge_the_forecast_and_its_band_are_back_within_minutes() -> None:
    """A ten-minute x3 surge on a steady load: ten minutes after it ends the point and the
    whole band, three hours out, are about where they were before it (they must not hold the
    surge's width for hours: the planner prices the band over its whole horizon)."""
    calm = poisson_minutes(1.5, 90, 1)
    before = forecast(feed(calm), 180, 60.0, P)
    during = forecast(feed(calm + poisson_minutes(4.5, 3, 2)), 180, 60.0, P)
    assert during.upper[0] > 4.0  # the floor sees the surge at once
    after = forecast(feed(calm + poisson_minutes(4.5, 10, 2) + poisson_minutes(1.5, 10, 3)),
                     180, 60.0, P)  # fmt: skip
    assert after.point[0] == pytest.approx(before.point[0], rel=0.15)
    for i in (0, 9, 59, 179):
        assert after.upper[i] - after.point[i] <= 1.5 * (before.upper[i] - before.point[i]) + 0.1


def test_a_lasting_shift_is_followed_within_tens_of_minutes() -> None:
    """A rise that stays is not a surge: the level gets there and the burst ends."""
    state = feed(poisson_minutes(1.0, 60, 4) + poisson_minutes(3.0, 40, 5))
    fc = forecast(state, 30, 60.0, P)
    assert fc.point[0] == pytest.approx(3.0, rel=0.15)
    assert state.burst < state.var + 1e-9
    assert fc.upper[0] < 3.0 * 1.5


def test_a_day_seen_gives_the_shape_of_the_next() -> None:
    day = 240
    shape = [1.5 + math.sin(2 * math.pi * i / day) for i in range(day)]
    p = ForecastParams(season=day)
    # yesterday, then today half as busy again, a quarter of the way in
    state = feed(shape + [1.5 * x for x in shape[: day // 4]], p)
    fc = forecast(state, 120, 60.0, p)
    now = day // 4 - 1
    for h in (30, 60, 119):
        expect = 1.5 * shape[(now + h) % day]
        assert fc.point[h - 1] == pytest.approx(expect, rel=0.08)


def test_a_prior_keeps_a_higher_floor_from_multiplying_the_day() -> None:
    """Yesterday 0.1 to 1.1, today 0.3 to 1.3 (the lab's high day): at the trough the plain
    ratio reads today as three times yesterday; with the season's mean as a prior the peak
    forecast stays near the truth."""
    day = 240
    wave = [(1 - math.cos(2 * math.pi * i / day)) / 2 for i in range(day)]
    yesterday = [0.1 + x for x in wave]
    today = [0.3 + x for x in wave]
    peaks = {}
    for w in (0.0, 1.0):
        p = ForecastParams(season=day, seasonal_prior=w, scale_sd=0.0)  # (no shrinkage)
        state = feed(yesterday + today[:10], p)
        peaks[w] = max(forecast(state, 120, 60.0, p).point)
    assert peaks[0.0] > 2 * 1.3
    assert peaks[1.0] == pytest.approx(1.3, rel=0.15)


def test_few_arrivals_an_interval_widen_the_band_by_the_levels_own_error() -> None:
    """Two arrivals a minute: the level is a smoothed mean of counts of about two, known to
    about a third of itself, and the band says so (not the 3% floor of a steady rate)."""
    state = feed([2 / 60] * 60, P)
    fc = forecast(state, 10, 60.0, P)
    assert fc.upper[0] - fc.point[0] >= 2 * 0.25 * fc.point[0]
    busy = forecast(feed([200 / 60] * 60, P), 10, 60.0, P)
    assert busy.upper[0] - busy.point[0] < 0.1 * busy.point[0]


def test_observations_are_checked() -> None:
    with pytest.raises(ValueError):
        observe(None, -1.0, 60.0, P)
    with pytest.raises(ValueError):
        observe(None, 1.0, 0.0, P)
    with pytest.raises(ValueError):
        observe(None, 1.0, 60.0, P, steps=0)


def test_a_late_observation_keeps_the_trend_per_step() -> None:
    """A ramp of 0.02 a minute seen only every 30 minutes (plans that took that long): each
    observation stands for its 30 steps, so the trend is the ramp's, not 30 times it."""
    ramp = [0.5 + 0.02 * i for i in range(301)]
    every = feed(ramp)
    state = None
    for i in range(0, 301, 30):
        state = observe(state, ramp[i], 60.0, P, steps=1 if state is None else 30)
    assert state is not None
    assert state.trend == pytest.approx(every.trend, rel=0.5)
    one_step = feed(ramp[::30])  # (each late observation taken as one step: the bug)
    assert one_step.trend > 10 * every.trend


def test_a_late_observation_keeps_the_season_aligned_with_the_clock() -> None:
    day = 240
    shape = [1.5 + math.sin(2 * math.pi * i / day) for i in range(day)]
    p = ForecastParams(season=day)
    # today as yesterday, seen every 30 minutes to step 90: the shape ahead is yesterday's
    # from step 90 (taken as one step each, it was yesterday's from step 3)
    state = feed(shape, p)
    for i in range(0, 91, 30):
        state = observe(state, shape[i], 60.0, p, steps=30 if i else 1)
    fc = forecast(state, 120, 60.0, p)
    for h in (30, 60, 119):
        assert fc.point[h - 1] == pytest.approx(shape[(90 + h) % day], rel=0.08)


def _morning(today: float, seconds: float, overlap: float, p: ForecastParams) -> Holt:
    """Yesterday's day (0.005 to 0.065 req/s), then today's morning at ``today`` times
    yesterday's rates (the last ten intervals at ``today`` times yesterday's at this hour), each
    observation a window of ``seconds``."""
    day = 240
    wave = [(1 - math.cos(2 * math.pi * i / day)) / 2 for i in range(day)]
    shape = [0.005 + 0.06 * x for x in wave]
    morning = [today * x for x in shape[:15]] + [today * shape[25]] * 10
    state = None
    for r in shape + morning:
        state = observe(state, r, seconds, p, overlap=overlap)
    assert state is not None
    return state


def test_a_level_from_a_few_arrivals_does_not_multiply_the_day() -> None:
    """Over sockets a compressed day's window holds ~14 arrivals in the morning: a level of
    twice yesterday's is noise as often as not. The plain ratio forecast twice yesterday's
    peak (0.065) and more at the band; shrunk by the level's own noise, the band stays within
    60% of it. The same doubled morning from a hundred times the arrivals is believed: the
    day is busier."""
    day = 240
    plain = ForecastParams(season=day, scale_sd=0.0)
    shrunk = ForecastParams(season=day)
    peak = {}
    for name, p in (("plain", plain), ("shrunk", shrunk)):
        state = _morning(2.0, 600.0, 10.0, p)
        assert state.level * 600.0 < 20  # (a window of few arrivals)
        peak[name] = max(forecast(state, 240, 60.0, p).upper)
    assert peak["plain"] > 2.5 * 0.065
    assert peak["shrunk"] < 1.6 * 0.065
    wave = [(1 - math.cos(2 * math.pi * i / day)) / 2 for i in range(day)]
    shape = [0.005 + 0.06 * x for x in wave]
    morning = [min(2.0, 1.0 + i / 20) * x for i, x in enumerate(shape[:60])]  # an hour
    for p in (plain, shrunk):
        state = feed(shape + morning, p, 60000.0)
        assert max(forecast(state, 240, 60.0, p).point) == pytest.approx(2 * 0.065, rel=0.1)


def test_overlapping_observations_leave_the_level_as_noisy_as_one_of_them() -> None:
    """Windows of ten intervals share most of their arrivals: the level's variance is most of
    one observation's, not ``alpha / (2 - alpha)`` of it as for independent ones."""
    rates = [0.02] * 100
    alone = feed(rates, P, 600.0)
    overlapping = alone
    state = None
    for r in rates:
        state = observe(state, r, 600.0, P, overlap=10.0)
    assert state is not None
    overlapping = state
    assert level_noise(alone, P) == pytest.approx(alone.noise * 0.3 / 1.7)
    assert level_noise(overlapping, P) > 3.5 * level_noise(alone, P)
    assert level_noise(overlapping, P) < overlapping.noise
    band = forecast(overlapping, 5, 60.0, P)
    assert band.upper[0] - band.point[0] > forecast(alone, 5, 60.0, P).upper[0] - 0.02


# -- a surge seen through an overlapping window (over sockets: a compressed day's few arrivals)

DAY = 240  # intervals of a day in these tests
WIN = 10  # intervals a window spans


def _counts(rates: list[float], seconds: float, seed: int, paired: bool = False) -> list[int]:
    """Poisson counts of each interval at ``rates`` (per second) over ``seconds``. ``paired``:
    each drawn from one uniform of its own by the inverse of the Poisson distribution, so
    days drawn with the same seed have the same counts wherever their rates are the same (a
    day with a surge and the same day without it differ only in the surge)."""
    rng = random.Random(seed)
    out = []
    for r in rates:
        if paired:
            u, mean = rng.random(), r * seconds
            count, term = 0, math.exp(-mean)
            total = term
            while total < u and term > 0:
                count += 1
                term *= mean / count
                total += term
            out.append(count)
            continue
        count, t = 0, rng.expovariate(1.0)
        while t < r * seconds:
            count += 1
            t += rng.expovariate(1.0)
        out.append(count)
    return out


def _windowed(state: Holt | None, counts: list[int], seconds: float, p: ForecastParams,
              fresh: bool = True) -> list[Holt]:  # fmt: skip
    """Each interval observed as the rate over the last ``WIN`` intervals' counts (a window as
    ``router.planning.traffic`` keeps it), its newest interval as ``fresh``; the states."""
    out = []
    for i in range(len(counts)):
        last = counts[max(0, i - WIN + 1) : i + 1]
        span = len(last) * seconds
        new = (counts[i] / seconds, seconds) if fresh else None
        state = observe(state, sum(last) / span, span, p, overlap=len(last), fresh=new)
        out.append(state)
    return out


def _wave(lo: float, hi: float) -> list[float]:
    return [lo + (hi - lo) * (1 - math.cos(2 * math.pi * i / DAY)) / 2 for i in range(DAY)]


def _surge_day(yesterday: list[float], today: list[float], at: int, factor: float,
               seconds: float, seed: int, fresh: bool = True,
               p: ForecastParams | None = None, paired: bool = False,
               ) -> tuple[list[float], list[Holt], ForecastParams]:  # fmt: skip
    """Yesterday's rates (as the router's saved state holds them), then today's counts with
    a ten-interval surge of ``factor`` from ``at``, through a window: the true rates, the
    states."""
    p = p if p is not None else ForecastParams(season=DAY)
    state = feed(yesterday, p, seconds)
    true = [r * (factor if at <= i < at + 10 else 1.0) for i, r in enumerate(today)]
    counts = _counts(true, seconds, seed, paired)
    return true, _windowed(state, counts, seconds, p, fresh), p


def test_a_surge_through_a_window_neither_lifts_the_day_nor_stays_in_its_band() -> None:
    """The compressed day over sockets: about one to four arrivals an interval, each
    observation a window of ten, and a 3x surge of ten intervals. The window's rate took it
    a ninth at a time, never past the clip, and the day's peak read twice the truth; judged
    on its newest interval's own count (and the day's scale a median of an hour), the peak
    forecast stays within a fifth of the truth, the band widens during the surge and is back
    within half again of its width before, twenty intervals after it."""
    wave = _wave(0.35, 3.85)  # arrivals an interval at seconds = 1
    seconds = 1.0
    for seed in range(3):
        true, states, p = _surge_day(wave, wave, 50, 3.0, seconds, seed)
        # (the old rule: the window's rate judged, and the errors' squares averaged)
        squares = ForecastParams(season=DAY, var_step=0.0)
        _, old, _ = _surge_day(wave, wave, 50, 3.0, seconds, seed, False, squares)
        peak = max(wave)  # (the day's, not the surge's)
        for i in range(45, 90):
            fc = forecast(states[i], 150, seconds, p)
            assert max(fc.point) == pytest.approx(peak, rel=0.2), (seed, i)
        _, calm, _ = _surge_day(wave, wave, 50, 1.0, seconds, seed)  # (the day without it)
        before = forecast(states[49], 150, seconds, p)
        during = [forecast(s, 150, seconds, p) for s in states[50:60]]
        assert max(f.upper[0] - f.point[0] for f in during) > 2 * (
            before.upper[0] - before.point[0]
        )
        for i in (75, 80, 90):
            width = _width(forecast(calm[i], 150, seconds, p))
            assert _width(forecast(states[i], 150, seconds, p)) < 1.5 * width, (seed, i)
        # (the same day by the old rule: the band learnt the surge's errors)
        wide = [
            _width(forecast(old[i], 150, seconds, p)) / _width(forecast(states[i], 150, seconds, p))
            for i in (65, 70, 75, 80)
        ]
        assert max(wide) > 2


def _width(fc: Forecast) -> float:
    return max(u - x for u, x in zip(fc.upper, fc.point, strict=True))


def test_without_a_window_the_fresh_count_is_the_observation() -> None:
    rates = poisson_minutes(2.0, 60, 7) + poisson_minutes(6.0, 10, 8) + poisson_minutes(2.0, 20)
    plain = feed(rates)
    state = None
    for r in rates:
        state = observe(state, r, 60.0, P, fresh=(r, 60.0))
    assert state == plain


def test_a_fresh_count_is_checked() -> None:
    with pytest.raises(ValueError):
        observe(None, 1.0, 60.0, P, fresh=(-1.0, 60.0))
    with pytest.raises(ValueError):
        observe(None, 1.0, 60.0, P, fresh=(1.0, 120.0))  # longer than the window


@settings(max_examples=25, deadline=None)
@example(base=6.5, at=43, seed=4564, flat=True)
# (the shape past yesterday's remaining season is today's early windowed counts: here their
# noise alone put the peak forecast at 3.32 against the truth's 1.875 and the old bound 3.30)
@example(base=1.875, at=143, seed=142, flat=True)
# (half an arrival an interval: the surge's extra arrivals came at its end, 3 and 3 against 1
# and 3, so the band was wider than before it only once they were in the window)
@example(base=0.5, at=53, seed=453, flat=True)
# (half an arrival an interval, flat: the surge never tripped (its counts 2-4 against a limit of
# ~5.8) and was gone from the level twenty intervals after it, but both days' windows over the
# last ten intervals then held 20 arrivals against a true 8.75: the level read 1.77 with the
# surge, 1.86 without it, against a true 0.875. The counts' noise, not the surge)
@example(base=0.875, at=75, seed=728, flat=True)
# (the interval just before the surge drew 4 arrivals against 0.67 and tripped the burst: the
# band before was 0.595 wide on both days, the surge's first count was 0, and its band at most
# 0.500, still above the same day's without the surge once its arrivals were in the window)
@example(base=1.0, at=66, seed=728, flat=False)
# (the window before the surge held 8 arrivals, the surge's ten intervals 8: the level fell
# through it, and the band with it, less than the same day's without the surge, to 0 arrivals)
@example(base=0.5, at=72, seed=630, flat=True)
# (a trough of empty windows: today's median ratio to yesterday went from 0, a day forecast at
# nothing with the level's noise as its band, to 0.23, shrunk to yesterday's with little band)
@example(base=0.5, at=51, seed=77, flat=False)
@given(
    base=st.floats(0.5, 20.0),
    at=st.integers(40, 150),
    seed=st.integers(0, 10_000),
    flat=st.booleans(),
)
def test_a_3x_surge_keeps_the_level_and_scale_near_the_truth(
    base: float, at: int, seed: int, flat: bool
) -> None:
    """Any ten-interval 3x surge on a flat or diurnal day, through a window, at a half to
    twenty arrivals an interval: the surge lifts the peak forecast (the day's scale) by no
    more than a bound throughout, the band is wider than the same day's without the surge (the
    same counts outside it) while the surge's counts are in the window (its ten intervals and
    the ten after), and twenty
    intervals after it the level is within a bound of the same day's without the surge. (Not
    "within three intervals": at 6.5 arrivals an interval the first three surge counts can all
    stay under the clip.)

    Against the same day, not the truth or the band before: the paired days differ only in the
    surge, so that is what the checks judge. The truth is off by the counts' noise on both days
    (at 0.875 an interval a window drew 20 arrivals against 8.75, 3.8 window deviations: no
    bound in deviations holds for every seed), and the band before can hold a noise count's
    burst that the surge's first counts do not repeat, or a window of more arrivals than the
    surge's ten (at half an arrival an interval: 8 before it, 8 in it).

    Lifted from what: the true peak, or the same day's forecast without the surge (the same
    counts outside it) where that is higher. Past yesterday's remaining season the shape is
    today's own early windowed counts, a few arrivals each: their noise alone moves the peak
    forecast, surge or not, and by more than the level's (the example above: 3.32 without
    the surge's part of it against a true 1.875)."""
    yesterday = [base] * DAY if flat else _wave(0.1 * base, 1.1 * base)
    true, states, p = _surge_day(yesterday, yesterday, at, 3.0, 1.0, seed, paired=True)
    _, calm, _ = _surge_day(yesterday, yesterday, at, 1.0, 1.0, seed, paired=True)
    peak = max(yesterday)  # (the day's, not the surge's)
    # the bound: the level's count noise (a window of ten intervals) at two deviations
    noise = 2.0 * math.sqrt(max(yesterday) / WIN) + 0.3 * max(yesterday)
    for i in range(at, at + 30):
        plain = max(forecast(calm[i], 150, 1.0, p).point)
        assert max(forecast(states[i], 150, 1.0, p).point) <= max(peak, plain) + noise, i
    window = range(at, at + 2 * WIN)
    counts, calm_counts = (_counts(r, 1.0, seed, True) for r in (true, yesterday))
    if counts[at : at + WIN] == calm_counts[at : at + WIN]:  # (no extra arrival: the same day)
        assert states == calm
        return
    width, calm_width = (
        [_width(forecast(s, 1, 1.0, p)) for s in days[at - 1 : at + 2 * WIN]]
        for days in (states, calm)
    )
    assert any(width[1 + i - at] > calm_width[1 + i - at] for i in window)
    assert abs(states[at + 30].level - calm[at + 30].level) <= noise


def test_an_unseen_surges_errors_do_not_widen_the_band_for_hours() -> None:
    """The socket-scale day with a 3x surge through the window: its windowed errors (a ramp up
    and down, some of it past the clip, some not) teach the running median of the errors a
    step at a time, so twenty to forty intervals after the surge the band over the next 150
    intervals (the day's peak in it) is within a third of the same day's without the surge
    (the same counts outside it). The errors' squares averaged took one of these days to
    seven times its width."""
    wave = _wave(0.35, 3.85)
    squares = ForecastParams(season=DAY, var_step=0.0)
    worst = {}
    for name, p in (("median", ForecastParams(season=DAY)), ("squares", squares)):
        ratios = []
        for seed in range(12):
            _, states, _ = _surge_day(wave, wave, 50, 3.0, 1.0, seed, p=p, paired=True)
            _, calm, _ = _surge_day(wave, wave, 50, 1.0, 1.0, seed, p=p, paired=True)
            for i in (70, 75, 80, 90):
                width = _width(forecast(states[i], 150, 1.0, p))
                ratios.append(width / _width(forecast(calm[i], 150, 1.0, p)))
        worst[name] = max(ratios)
    assert worst["median"] < 4 / 3
    assert worst["squares"] > 3


@settings(max_examples=50, deadline=None)
@given(
    rates=st.lists(st.floats(0.0, 1000.0), min_size=1, max_size=40),
    seconds=st.floats(1.0, 600.0),
)
def test_a_run_of_errors_moves_the_variance_a_step_at_a_time(
    rates: list[float], seconds: float
) -> None:
    """Past ``settle``, whatever the errors (outside a surge's hold), the variance moves by
    ``(1 + var_step)**2`` an observation at most, up or down (down to its floor)."""
    p = ForecastParams(season=0)
    state = feed(poisson_minutes(2.0, p.settle + 5), p)
    step = (1.0 + p.var_step) ** 2
    for r in rates:
        after = observe(state, r, seconds, p)
        assert after.var <= state.var * step * (1 + 1e-9)
        assert after.var >= min(state.var / step * (1 - 1e-9), 1e-12)
        state = after


def test_on_a_steady_load_the_median_variance_is_the_squares() -> None:
    """The running median of the absolute errors, as a variance, is about the mean of their
    squares on a steady Poisson load, and no noisier (the log variance's spread)."""
    rates = poisson_minutes(2.0, 3000, 1)
    stats = {}
    for name, p in (("median", P), ("squares", P._replace(var_step=0.0))):
        state, logs = None, []
        for i, r in enumerate(rates):
            state = observe(state, r, 60.0, p)
            if i > 300:
                logs.append(math.log(state.var))
        assert state is not None
        mean = sum(logs) / len(logs)
        stats[name] = (math.exp(mean), math.sqrt(sum((x - mean) ** 2 for x in logs) / len(logs)))
    assert stats["median"][0] == pytest.approx(stats["squares"][0], rel=0.2)
    assert stats["median"][1] < 1.1 * stats["squares"][1]


@settings(max_examples=25, deadline=None)
@given(
    base=st.floats(0.5, 200.0),
    windowed=st.booleans(),
    data=st.data(),
)
def test_flat_noise_never_trips_the_burst(base: float, windowed: bool, data: st.DataObject) -> None:
    """Counts of a flat load, each within two standard deviations of its mean (noise, not a
    surge), through a window or not: the burst never trips and nothing is held."""
    sd = math.sqrt(base)
    lo, hi = max(0, math.ceil(base - 2 * sd)), math.floor(base + 2 * sd)
    counts = data.draw(st.lists(st.integers(lo, hi), min_size=60, max_size=120))
    if windowed:
        states = _windowed(None, counts, 1.0, P)
    else:
        states = []
        state = None
        for c in counts:
            state = observe(state, float(c), 1.0, P)
            states.append(state)
    assert all(s.burst == 0.0 and s.surged == math.inf for s in states)


def test_a_trough_of_empty_windows_forecasts_yesterdays_day_not_nothing() -> None:
    """Half an arrival an interval at the day's peak, a tenth in its trough: windows of no
    arrivals put today's median ratio to yesterday at zero. The scale believed falls to none
    as that ratio falls to zero (a few arrivals' ratio is noise), so at zero the day ahead is
    yesterday's, as it is one interval later at a ratio of 0.23; it used to be believed whole,
    a day forecast at nothing (0 against a true peak of 0.55) for seven intervals."""
    yesterday = _wave(0.05, 0.55)
    _, states, p = _surge_day(yesterday, yesterday, 51, 1.0, 1.0, 77, paired=True)
    peaks = [max(forecast(states[i], 150, 1.0, p).point) for i in range(44, 54)]
    assert min(peaks) >= 0.9 * max(yesterday)
    assert max(peaks) - min(peaks) <= 0.05 * max(yesterday)  # (no jump as the ratio leaves 0)
