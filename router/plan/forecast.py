"""The arrival rate ahead: Holt's linear trend (damped) with an upper band from its residuals.

Each planning call feeds one observation, the rate over the interval just past (arrivals /
seconds). The state is a plain value (level, trend, residual variance), so every router replica
that sees the same counts computes the same forecast.

The band is about the *rate*, not about the next count: a count over ``t`` seconds of a Poisson
stream at rate ``r`` has variance ``r / t`` of pure noise, which says nothing of where the rate
is going. So the band's variance is the residuals' variance less that noise (never below
``cv_floor`` of the level, squared), grown with the steps ahead as Holt's errors grow
(``1 + sum((alpha * (1 + i * beta))**2)``). A surge makes the residuals, and the band, jump at
once; a steady load keeps them near the floor.

Why Holt: one level and one trend follow a diurnal ramp with no season to fit (a day of
history is not needed, and the traces are shorter than a day), and the damped trend keeps a
ramp's end from being extrapolated past a restart's horizon. ``bench/results/fleet-lab.md``
scores it on the lab's envelopes and the Azure traces.
"""

from __future__ import annotations

import math
from typing import NamedTuple


class ForecastParams(NamedTuple):
    alpha: float = 0.3  # level smoothing
    beta: float = 0.1  # trend smoothing
    damping: float = 0.995  # trend damping per step
    gamma: float = 0.2  # residual variance smoothing
    z: float = 2.0  # band width in standard deviations
    cv_floor: float = 0.03  # the band's standard deviation is at least this share of the level


DEFAULT = ForecastParams()


class Holt(NamedTuple):
    level: float  # requests per second
    trend: float  # change per step
    var: float  # smoothed squared one-step residual
    noise: float  # smoothed Poisson variance of one observation (rate / seconds)
    seen: int  # observations so far


class Forecast(NamedTuple):
    step: float  # seconds between points
    point: tuple[float, ...]  # expected rate 1, 2, ... steps ahead
    upper: tuple[float, ...]  # the band's top

    def peak(self, seconds: float, upper: bool = True) -> float:
        """The highest rate expected within ``seconds`` from now (at least the first step)."""
        series = self.upper if upper else self.point
        n = max(1, min(len(series), math.ceil(seconds / self.step)))
        return max(series[:n])

    def at(self, seconds: float, upper: bool = False) -> float:
        series = self.upper if upper else self.point
        i = min(len(series) - 1, max(0, math.ceil(seconds / self.step) - 1))
        return series[i]


def observe(state: Holt | None, rate: float, seconds: float, p: ForecastParams = DEFAULT) -> Holt:
    """The state after one more observation: ``rate`` over the last ``seconds``."""
    if rate < 0 or seconds <= 0:
        raise ValueError("need rate >= 0 and seconds > 0")
    noise = rate / seconds
    if state is None:
        return Holt(rate, 0.0, noise, noise, 1)
    expected = state.level + p.damping * state.trend
    err = rate - expected
    level = p.alpha * rate + (1.0 - p.alpha) * expected
    trend = p.beta * (level - state.level) + (1.0 - p.beta) * p.damping * state.trend
    if state.seen == 1:
        trend = level - state.level
    var = (1.0 - p.gamma) * state.var + p.gamma * err * err
    noise = (1.0 - p.gamma) * state.noise + p.gamma * noise
    return Holt(level, trend, var, noise, state.seen + 1)


def forecast(state: Holt, steps: int, step: float, p: ForecastParams = DEFAULT) -> Forecast:
    """``steps`` points ``step`` seconds apart."""
    point, upper = [], []
    drift = 0.0
    grow = 1.0
    damp = 1.0
    # the one-step residuals hold the count's noise and the smoothed level's (alpha / (2 -
    # alpha) of it): what is left is the rate's own movement
    noise = state.noise * (1.0 + p.alpha / (2.0 - p.alpha))
    process = max(state.var - noise, (p.cv_floor * state.level) ** 2)
    for i in range(1, steps + 1):
        damp *= p.damping
        drift += damp * state.trend
        mean = max(0.0, state.level + drift)
        sd = math.sqrt(process * grow)
        grow += (p.alpha * (1.0 + i * p.beta)) ** 2
        point.append(mean)
        upper.append(max(mean, mean + p.z * sd))
    return Forecast(step, tuple(point), tuple(upper))
