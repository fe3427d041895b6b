"""The fleet's day: a rate envelope over a fleet's SLO capacity, Poisson arrivals under it. Pure.

The envelope is given as shares of the all-baseline fleet's SLO capacity (issue 37's day):

- ``diurnal``: ``lo + (hi - lo) * (1 - cos(2 pi t / day)) / 2``, a day that starts at its
  trough, peaks half way and comes back (default 10% to 110%);
- ``surge``: the diurnal day with ``factor`` times the load for ``length`` seconds from ``at``;
- ``flat``: a constant share (``hi``).

Capacity per engine is the bench lab's (``bench/lab/fleet_workloads.py``, kept equal to it so
``spec-router fleet`` and the lab run the same day): the most requests per second the engine's
performance model (``router.sim.model``) serves in its steady state with the mean time per
output token within the relaxed target. Lengths are resampled as (prompt, output) pairs from a
trace (its joint distribution), or drawn from the replay's lognormals.

Times here are *day* seconds. ``spec-router fleet --compress C`` plays the day C times faster
than the engines run (a restart and the planner's minutes shrink with it, the requests do not):
``at(day)`` / C is an arrival's time on the engines' clock.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from router.sim.model import Preset, prefill_time, step_time
from router.tools.traffic import Arrival, Lengths

HOUR = 3600.0
SHAPES = ("diurnal", "surge", "flat")


@dataclass(frozen=True)
class Envelope:
    """Shares of capacity over a day (see the module's docstring)."""

    shape: str = "diurnal"
    hours: float = 8.0
    lo: float = 0.10
    hi: float = 1.10
    surge_at: float = 1.5 * HOUR  # day seconds (surge only)
    surge_length: float = 600.0
    surge_factor: float = 3.0

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; known: {', '.join(SHAPES)}")
        if self.hours <= 0 or self.lo < 0 or self.hi <= 0:
            raise ValueError("need hours > 0, lo >= 0 and hi > 0")

    @property
    def duration(self) -> float:
        return self.hours * HOUR

    def share(self, t: float) -> float:
        if self.shape == "flat":
            return self.hi
        s = self.lo + (self.hi - self.lo) * (1 - math.cos(2 * math.pi * t / self.duration)) / 2
        if self.shape == "surge" and self.surge_at <= t < self.surge_at + self.surge_length:
            s *= self.surge_factor
        return s

    def peak(self) -> float:
        top = self.hi if self.shape == "flat" else max(self.lo, self.hi)
        return top * (self.surge_factor if self.shape == "surge" else 1.0)

    def label(self) -> str:
        if self.shape == "flat":
            return f"flat {100 * self.hi:.0f}% for {self.hours:g} h"
        text = f"diurnal {100 * self.lo:.0f}-{100 * self.hi:.0f}% over {self.hours:g} h"
        if self.shape == "surge":
            text += (f", x{self.surge_factor:g} for {self.surge_length / 60:.0f} min at "
                     f"{self.surge_at / HOUR:.2f} h")  # fmt: skip
        return text


def engine_slo_capacity(
    p: Preset, prompt: float, output: float, hot: float, tpot: float = 0.05
) -> float:
    """Requests per second (model time) one engine of preset ``p`` serves with its mean time
    per output token within ``tpot``, requests of these mean lengths, a share ``hot`` of them
    at temperature 1 (the bench lab's ``engine_slo_capacity``)."""
    tau = 1.0 / (hot / p.tau_sampling + (1 - hot) / p.tau)
    stall = prefill_time(p, prompt)
    context = prompt + output / 2
    best = 0.0
    for b in range(1, p.max_running + 1):
        per_token = step_time(p, b, b * context) / tau
        rate = b / (stall + output * per_token)
        for _ in range(8):  # the stalls stretch the life, which lowers the rate: a fixed point
            stretched = per_token / (1 - min(0.95, rate * stall))
            rate = b / (stall + output * stretched)
        if per_token / (1 - min(0.95, rate * stall)) > tpot:
            break
        best = max(best, rate)
    return best


class LengthSource:
    """Where (prompt, output) pairs come from: a trace's pairs, or two lognormals."""

    def __init__(
        self,
        pairs: Sequence[tuple[int, int]] = (),
        prompt: Lengths | None = None,
        output: Lengths | None = None,
    ) -> None:
        if not pairs and (prompt is None or output is None):
            raise ValueError("need a trace's pairs or both lognormals")
        self.pairs = tuple(pairs)
        self.prompt = prompt
        self.output = output

    def draw(self, rng: random.Random) -> tuple[int, int]:
        if self.pairs:
            return self.pairs[rng.randrange(len(self.pairs))]
        assert self.prompt is not None and self.output is not None
        return self.prompt.draw(rng), self.output.draw(rng)

    def means(self, samples: int = 20000) -> tuple[float, float]:
        """Mean prompt and output lengths (exact for a trace; sampled for lognormals)."""
        if self.pairs:
            n = len(self.pairs)
            return sum(p for p, _ in self.pairs) / n, sum(o for _, o in self.pairs) / n
        rng = random.Random("means")
        drawn = [self.draw(rng) for _ in range(samples)]
        return sum(p for p, _ in drawn) / samples, sum(o for _, o in drawn) / samples


def arrivals(
    env: Envelope, capacity: float, lengths: LengthSource, hot: float, seed: int
) -> list[Arrival]:
    """Poisson arrivals at ``env.share(t) * capacity`` requests per *day* second over the day,
    each at temperature 1 with probability ``hot``. (Scaled to the engines' clock by the
    caller: ``at / C`` and the rate times C.)"""
    if capacity <= 0:
        raise ValueError("capacity must be > 0")
    times = random.Random(f"fleet:{seed}:times")
    draw = random.Random(f"fleet:{seed}:lengths")
    temp = random.Random(f"fleet:{seed}:temperature")
    peak = env.peak() * capacity
    out: list[Arrival] = []
    t = 0.0
    while True:
        t += times.expovariate(peak)
        if t >= env.duration:
            return out
        if times.random() * peak < env.share(t) * capacity:
            prompt, output = lengths.draw(draw)
            out.append(Arrival(t, prompt, max(2, output), 1.0 if temp.random() < hot else 0.0))


def rescale(xs: Sequence[Arrival], compress: float) -> list[Arrival]:
    """The arrivals on the engines' clock: a day played ``compress`` times faster."""
    return [Arrival(a.at / compress, a.prompt_tokens, a.output_tokens, a.temperature) for a in xs]


def expected_per_minute(env: Envelope, capacity: float, step: float = 60.0) -> tuple[float, ...]:
    """The envelope's mean rate (per day second) over each ``step`` of the day."""
    n = max(1, math.ceil(env.duration / step))
    fine = 12
    return tuple(
        sum(env.share((i + (j + 0.5) / fine) * step) for j in range(fine)) / fine * capacity
        for i in range(n)
    )


def per_minute(xs: Sequence[Arrival], seconds: float, step: float = 60.0) -> tuple[float, ...]:
    """Arrivals per second in each ``step`` of ``seconds`` (what the planner counts)."""
    n = max(1, math.ceil(seconds / step))
    counts = [0] * n
    for a in xs:
        counts[min(n - 1, int(a.at // step))] += 1
    return tuple(c / step for c in counts)
