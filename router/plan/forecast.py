"""The arrival rate ahead: Holt's linear trend (damped) with an upper band from its residuals.

Each planning call feeds one observation, the rate over the interval just past (arrivals /
seconds). The state is a plain value (level, trend, residual variance), so every router replica
that sees the same counts computes the same forecast.

The band is about the *rate*, not about the next count: a count over ``t`` seconds of a Poisson
stream at rate ``r`` has variance ``r / t`` of pure noise, which says nothing of where the rate
is going. So the band's variance is the residuals' variance less that noise (never below
``cv_floor`` of the level, squared), grown with the steps ahead as a smoothed level's errors
grow (``1 + (h - 1) * alpha**2``), plus the level's own error (a smoothed mean of those
counts: ``noise * alpha / (2 - alpha)``, not grown; with few arrivals an interval it is most of
the band). Holt's own formula adds the trend's uncertainty, which
compounds: three hours out it made the band ten times the level, a band no plan can use; the
trend's damping bounds how far it drifts instead. A steady load keeps the band near the floor.

Surges (the error above ``clip`` typical errors; the typical error is learnt slowly from
clipped errors): the level learns from each error clipped to that, so a ten-minute surge moves
it only step by step, and the excess goes to a term of its own (``burst``) that widens the band
at once and fades by ``burst_decay`` a step, as observations come in and over the steps ahead.
While it lasts (above the residuals' variance) the errors teach neither the trend, the variance
nor the scale, and the level may fall back unclipped: ten minutes after a surge ends the
forecast and its band are about where they were before it, not a third wider for hours (the
lab's eagle3-chain day moved an engine to baseline, and back, on such a band). A lasting shift
is still followed within tens of minutes: the level keeps stepping towards it, and once the
residuals catch up the burst is over.

Why Holt: one level and one trend follow a diurnal ramp with no season to fit, and the damped
trend keeps a ramp's end from being extrapolated far. But a ramp does not say where it ends,
and the planner must choose the split for the day's peak while the floor still lets it switch,
hours before: so once a whole season (``season``, a day) has been seen, the shape comes from
it: today's level times yesterday's ratio between then and now (smoothed), which scales to a
busier or quieter day and knows where the peak is. ``bench/results/fleet-lab.md``
scores it on the lab's envelopes and the Azure traces. That scale is believed as far as the
counts behind it allow (``scale_sd``): over sockets a compressed day's window held ~14
arrivals in the morning, the level read twice yesterday's by noise alone, and the plain
ratio forecast twice yesterday's peak.
"""

from __future__ import annotations

import math
from typing import NamedTuple


class ForecastParams(NamedTuple):
    alpha: float = 0.3  # level smoothing
    beta: float = 0.1  # trend smoothing
    damping: float = 0.99  # trend damping per step
    # Residual variance (and count noise) smoothing: about twenty observations. Surges have
    # their own term (burst), so the variance need not follow within minutes; at 0.2 (five
    # observations) its noise, grown x6-x17 over a three-hour horizon, set the band at the
    # lab's peak anywhere from +15% to +50% of the point, and so the split planned for it.
    gamma: float = 0.05
    # Past ``settle``, the residual variance is learnt robustly: its standard deviation is a
    # running median of the absolute errors (times 1.4826, a normal's), moved up or down by
    # this share each observation (the errors' squares averaged, as before settle, when 0).
    # A surge that passes the clip unseen (at two arrivals an interval a 3x surge's counts
    # can all stay under it, through a window of ten a ramp up and down) then widens the
    # variance by at most (1 + var_step)**2 a step, not by its squared errors: over sockets
    # the mean of squares took up to twenty times its variance from one such surge, and its
    # process part, grown over three hours ahead, put the band's top at the day's peak at
    # +30-50% of the point for hours (+13-15% before the surge). 0.025: on a steady Poisson
    # load its noise is the squares' at ``gamma`` (the log variance's standard deviation 0.23
    # against 0.23; at 0.05, 0.34), and a surge's twenty-odd steps at most double it.
    var_step: float = 0.025
    z: float = 2.0  # band width in standard deviations
    cv_floor: float = 0.03  # the band's standard deviation is at least this share of the level
    clip: float = 3.0  # level and trend learn from errors clipped to this many deviations
    scale_gamma: float = 0.05  # how fast the clipping scale learns (about 20 observations)
    # A surge's excess over the clip widens the band in a term of its own, fading by this
    # factor a step (observed and ahead): a surge of minutes is a near risk, not an hour's.
    burst_decay: float = 0.7
    # Observations before a surge is told apart from the rate's own noise: the clip's scale
    # and the variance mean little before about 1 / scale_gamma of them (a cold start whose
    # first minutes held no arrival had a clip of nothing, and every arrival after was a
    # "surge" that froze what the forecast learns). Until then every error teaches it all.
    settle: int = 20
    # Observations per season (a day of one-minute intervals); 0: none. With a whole season
    # seen, the point forecast is today's level times the ratio of yesterday's smoothed rate
    # then to yesterday's now.
    season: int = 1440
    season_smooth: int = 5  # yesterday's rates are averaged over this many steps either side
    # Today's scale against yesterday is (level + w * mean) / (yesterday now + w * mean), the
    # mean the season's: w = 0 is the plain ratio, right for a day busier in proportion; at
    # a trough it divides two small, noisy rates and multiplies the whole day by their ratio
    # (the lab's day with a 30% floor against yesterday's 10% looked three times as busy).
    # w = 1 shrinks the scale towards one: the lab's days' forecast error 3 h ahead halves,
    # but a day busier in proportion is under-forecast (bench/results/fleet-lab.md). 0 until
    # the planner's choices are judged with it in the lab.
    seasonal_prior: float = 0.0
    # How far (standard deviation of its log) a day's scale against yesterday is expected to
    # be from one: today's scale is shrunk towards one by its own noise, precision-weighted
    # (a level from a few arrivals twice yesterday's says little; one from thousands says
    # the day is busier). 0: no shrinkage, the plain ratio.
    scale_sd: float = 0.25
    # Today's scale against yesterday is the median, over the last this many observations,
    # of each one's ratio to yesterday's smoothed rate at its time (not the level's ratio
    # now): a surge of ten minutes moves a median of an hour little, where over sockets (a
    # window of ~9 intervals a rate, so the surge reached the level step by step, under the
    # clip) it put the level, and so the day's peak, at twice the truth for minutes, and a
    # day busier than yesterday still shows within half of it. 0: the level's ratio.
    scale_span: int = 60


DEFAULT = ForecastParams()


class Holt(NamedTuple):
    level: float  # requests per second
    trend: float  # change per step
    var: float  # smoothed squared one-step residual
    noise: float  # smoothed Poisson variance of one observation (rate / seconds)
    seen: int  # observations so far
    scale: float = 0.0  # smoothed absolute residual, itself clipped (what errors are clipped to)
    history: tuple[float, ...] = ()  # the last season + 1 observations, oldest first
    burst: float = 0.0  # squared excess of recent errors above the clip, fading (a surge's)
    overlap: float = 1.0  # intervals one observation spans (smoothed): a window's overlap
    # seconds since the end of the newest interval whose own count was past the clip (its
    # arrivals stay in an overlapping window's rate until they leave it); inf: none
    surged: float = math.inf


class Forecast(NamedTuple):
    step: float  # seconds between points
    point: tuple[float, ...]  # expected rate 1, 2, ... steps ahead
    upper: tuple[float, ...]  # the band's top
    # of the band's standard deviation, the part that is the level's count noise (how well
    # today's rate is known now, as against where it is going); none if not given
    known: tuple[float, ...] = ()

    def peak(self, seconds: float, upper: bool = True) -> float:
        """The highest rate expected within ``seconds`` from now (at least the first step)."""
        series = self.upper if upper else self.point
        n = max(1, min(len(series), math.ceil(seconds / self.step)))
        return max(series[:n])

    def at(self, seconds: float, upper: bool = False) -> float:
        series = self.upper if upper else self.point
        i = min(len(series) - 1, max(0, math.ceil(seconds / self.step) - 1))
        return series[i]


def observe(state: Holt | None, rate: float, seconds: float, p: ForecastParams = DEFAULT,
            steps: int = 1, overlap: float = 1.0,
            fresh: tuple[float, float] | None = None) -> Holt:  # fmt: skip
    """The state after one more observation: ``rate`` over the last ``seconds``, standing for
    ``steps`` planning intervals (more than one when the observation comes late: a plan that
    took longer than its interval, a round lost). The steps it stands for are fed the rate
    moving in a line from the level to ``rate``: the trend stays per step, and yesterday's
    shape stays aligned with the clock. Taken as one step, a plan of 30 intervals learnt a
    trend 30 times too steep and read the season 30 times too slowly (over sockets, the
    compressed day's 3-hour forecast went from 3.6 to 33 requests a second, and the planner
    moved an engine to baseline for a load that never came).

    ``overlap``: the planning intervals the observation's ``seconds`` span (a window over the
    last ten intervals: 10). Consecutive observations then share most of their arrivals, and
    the level is known only about as well as one of them, not as a smoothed mean of
    independent ones (``level_noise``).

    ``fresh``: the newest interval's own count as (rate, seconds), the arrivals new since the
    last observation (by default the observation itself: no overlap). The clip and the
    burst judge it, not the window: a window's rate takes a surge in a ninth at a time, each
    step within the clip of a level that follows it, so a 3x surge never tripped it (over
    sockets the level went to 2.5 times the truth and the band learnt the surge's errors).
    While an interval that tripped it is still in the window (``surged``), the window's
    errors are the surge's as well: they teach neither the trend, the variance nor the clip's
    scale."""
    if rate < 0 or seconds <= 0:
        raise ValueError("need rate >= 0 and seconds > 0")
    if steps < 1:
        raise ValueError("need steps >= 1")
    if not overlap >= 1.0:
        raise ValueError("need overlap >= 1")
    if fresh is not None and (fresh[0] < 0 or not 0 < fresh[1] <= seconds * (1 + 1e-9)):
        raise ValueError("need a fresh rate >= 0 over 0 < seconds <= the observation's")
    n = min(steps, max(p.season, MAX_STEPS))
    start = rate if state is None else state.level
    for j in range(1, n + 1):
        r = start + (rate - start) * j / n
        state = _observe(state, r, seconds, p, fresh if fresh is not None else (r, seconds))
    assert state is not None
    if state.seen == 1:
        return state._replace(overlap=float(overlap))
    return state._replace(overlap=(1.0 - p.gamma) * state.overlap + p.gamma * overlap)


def level_noise(state: Holt, p: ForecastParams = DEFAULT) -> float:
    """The variance of the level from the counts' noise alone: the level smooths
    observations each spanning ``overlap`` intervals, so it is the variance of an
    exponentially weighted mean of moving sums (``alpha / (2 - alpha)`` of one observation's
    noise when they do not overlap; about all of it when each spans many intervals)."""
    k = max(1, round(state.overlap))
    if k == 1:
        return state.noise * p.alpha / (2.0 - p.alpha)
    # one interval's count has k times a k-interval observation's variance; the level's
    # weight on the interval m steps back is the EWMA's weights over the windows holding it
    a = p.alpha
    total, m = 0.0, 0
    while True:
        lo = max(0, m - k + 1)
        w = (1.0 - a) ** lo - (1.0 - a) ** (m + 1)  # sum of a (1 - a)^j, j = lo..m
        total += (w / k) ** 2
        m += 1
        if m >= k and w < 1e-6:
            break
    return state.noise * k * total


# The most steps one observation stands for without a season (with one: a season's worth).
MAX_STEPS = 1440


def _observe(state: Holt | None, rate: float, seconds: float, p: ForecastParams,
             fresh: tuple[float, float]) -> Holt:  # fmt: skip
    noise = rate / seconds
    keep = p.season + 1 + p.scale_span if p.season else 0
    if state is None:
        return Holt(rate, 0.0, noise, noise, 1, math.sqrt(noise), (rate,)[:keep])
    expected = state.level + p.damping * state.trend
    err = rate - expected
    # the level learns from the error clipped to ``clip`` typical errors (a surge of minutes
    # moves it step by step); what a rise has beyond the clip goes to ``burst``, which widens
    # the band at once and fades. While a surge lasts (its burst above the residuals'
    # variance) its errors teach neither the trend, the variance nor the clip's scale (they
    # are the surge's, not the rate's movement), and the level may fall back unclipped: when
    # the surge ends, the forecast is where it was before within minutes, its band too.
    limit = p.clip * max(1.25 * state.scale, math.sqrt(state.noise), 1e-6)
    settled = state.seen >= p.settle
    # the newest interval's own count against the clip: its error, and the limit for a count
    # over its seconds (a window of ``seconds`` has ``seconds / fresh_s`` times less noise),
    # with a count's skew ((clip**2 - 1) / 6 arrivals, Cornish-Fisher's for a Poisson count:
    # at one arrival an interval, three standard deviations tripped on one interval in 60)
    fresh_rate, fresh_s = fresh
    fresh_limit = limit * math.sqrt(seconds / fresh_s) + (p.clip**2 - 1.0) / (6.0 * fresh_s)
    excess = max(0.0, fresh_rate - expected - fresh_limit) if settled else 0.0
    burst = max(p.burst_decay * state.burst, excess**2) if settled else 0.0
    surged = 0.0 if excess > 0 else state.surged + fresh_s
    # still in the window: an interval that tripped it, ending ``surged`` seconds ago
    held = excess == 0 and surged + fresh_s <= seconds * (1 + 1e-9)
    surge = burst > state.var or held
    step = max(-math.inf if surge else -limit, min(limit, err))
    level = expected + p.alpha * step
    var, scale = state.var, state.scale
    trend = p.damping * state.trend
    if state.seen == 1:
        trend = level - state.level
    elif not surge:
        trend = p.beta * (level - state.level) + (1.0 - p.beta) * trend
        var = _learn_var(state.var, err, settled, p)
        scale = (1.0 - p.scale_gamma) * state.scale + p.scale_gamma * abs(step)
    noise = (1.0 - p.gamma) * state.noise + p.gamma * noise
    history = (state.history + (rate,))[-keep:] if keep else ()
    return Holt(level, trend, var, noise, state.seen + 1, scale, history, burst, state.overlap,
                surged)  # fmt: skip


# a normal's median absolute deviation over its standard deviation, squared
_MAD2 = 0.6744897501960817**2


def _learn_var(var: float, err: float, settled: bool, p: ForecastParams) -> float:
    """The residual variance after one more error: before ``settle`` (or with no
    ``var_step``) the errors' squares smoothed; after it, a running median: the median absolute
    error (``sqrt(var * _MAD2)``) moves up by ``var_step`` when the error is past it, down when
    not, so a run of large errors raises the variance geometrically, by ``(1 + var_step)**2``
    a step at most, whatever their size. (Its steady state: the error's absolute value is past
    the median as often as not, the median of a normal's, so ``var`` is its variance.)"""
    if not settled or p.var_step <= 0:
        return (1.0 - p.gamma) * var + p.gamma * err * err
    up = err * err > var * _MAD2
    return max(var * (1.0 + p.var_step) ** (2 if up else -2), 1e-12)


def forecast(state: Holt, steps: int, step: float, p: ForecastParams = DEFAULT) -> Forecast:
    """``steps`` points ``step`` seconds apart."""
    point, upper, level_sd = [], [], []
    drift = 0.0
    grow = 1.0
    damp = 1.0
    # the one-step residuals hold the count's noise and the smoothed level's (alpha / (2 -
    # alpha) of it): what is left is the rate's own movement
    noise = state.noise * (1.0 + p.alpha / (2.0 - p.alpha))
    process = max(state.var - noise, (p.cv_floor * state.level) ** 2)
    # the level itself is known only to a smoothed Poisson mean's error, which the steps ahead
    # do not grow (with a few arrivals an interval it is most of the band)
    known = level_noise(state, p)
    shrink = 1.0
    shape, ratio_now = _season(state, p)
    if shape:
        prior = p.seasonal_prior * sum(state.history) / len(state.history)
        now, base = state.level + prior, max(shape[0] + prior, 1e-9)
        if ratio_now is not None:  # the median of today's ratios to yesterday (scale_span)
            now = base * ratio_now
        shrink = _shrink(now, base, known, p)
        if shrink < 1.0:  # today's scale shrunk towards one: the level it stands for
            now = base * (max(now, 1e-9) / base) ** shrink
    burst = state.burst
    for i in range(1, steps + 1):
        burst *= p.burst_decay
        damp *= p.damping
        drift += damp * state.trend
        if shape:
            ratio = shape[min(i, len(shape) - 1)] / base
            mean = now * ratio
            of_level = known * (ratio * shrink) ** 2  # the level scales the day (as believed)
        else:
            mean = max(0.0, state.level + drift)
            of_level = known
        sd = math.sqrt(process * grow + of_level + burst)
        grow += p.alpha**2
        point.append(mean)
        upper.append(max(mean, mean + p.z * sd))
        level_sd.append(math.sqrt(of_level))
    return Forecast(step, tuple(point), tuple(upper), tuple(level_sd))


def _shrink(now: float, base: float, known: float, p: ForecastParams) -> float:
    """The share of today's log scale against yesterday (``now / base``) that is believed:
    ``scale_sd**2`` over itself plus the scale's own noise, a Poisson rate's relative
    variance for both the level (``known``) and yesterday's rate (as noisy per unit rate).
    One where the level comes from many arrivals; towards none from a few, and none at a
    scale of zero (the limit as ``now`` falls to it: a zero read from Poisson counts has no
    bound on its relative variance, so the day is yesterday's, not nothing)."""
    if p.scale_sd <= 0:
        return 1.0
    if now <= 0:
        return 0.0
    per_rate = known / now
    v = per_rate / now + per_rate / base
    prior = p.scale_sd**2
    return prior / (prior + v)


def _season(state: Holt, p: ForecastParams) -> tuple[list[float], float | None]:
    """Yesterday's rates from this time on, smoothed (empty until a whole season is seen),
    and today's scale against yesterday: the median, over the last ``scale_span``
    observations that have a yesterday, of each one's ratio to yesterday's smoothed rate at
    its time (with ``seasonal_prior``'s mean added to both; none without ``scale_span``, or
    before a quarter of it is seen: then the level's).
    ``history[-1 - season]`` is yesterday now, so ``shape[h]`` is yesterday ``h`` steps from
    now."""
    h = state.history
    if not p.season or len(h) < p.season + 1:
        return [], None
    w = p.season_smooth
    n = len(h)
    smooth = []
    for i in range(n):
        lo, hi = max(0, i - w), min(n, i + w + 1)
        smooth.append(sum(h[lo:hi]) / (hi - lo))
    now = n - 1 - p.season  # yesterday now
    if p.scale_span <= 0:
        return smooth[now:], None
    prior = p.seasonal_prior * sum(h) / n
    ratios = sorted((h[now + p.season - m] + prior) / max(smooth[now - m] + prior, 1e-9)
                    for m in range(min(p.scale_span, now + 1)))  # fmt: skip
    k = len(ratios)
    if k < max(1, p.scale_span // 4):  # (too few yet: the level's ratio, smoothed)
        return smooth[now:], None
    median = (ratios[(k - 1) // 2] + ratios[k // 2]) / 2
    return smooth[now:], median
