"""Online learning of both pools' curves and of the crossover, from the requests the router serves.

Every finished request that streamed at least two tokens becomes a sample: its pool, the mean
number of requests in flight on its backend while it decoded, and its seconds per output token.
Samples are kept per pool in bins by concurrency, in seconds per *iteration* (``spt * tau``: for a
speculative engine, time per token times the acceptance length at the time), as decayed means in
which recent samples weigh more. The calibrated table seeds the bins; a bin that never sees a new
sample keeps its calibrated value, so a pool that runs only at low concurrency still knows what
high concurrency costs.

A pool's curve is the piecewise-linear interpolation of its bins (extended past the ends with the
end segments' slopes). Because the speculative curve is in iterations, the engine-reported
acceptance length rescales it at once: when acceptance collapses, the target crossover drops on
the next update, before enough slow requests have been seen. The crossover moves toward the
target by at most ``max_step`` per update. The target is looked for only between the lowest and
the highest concurrency both pools have bins at: when the baseline never catches up there, the
target is "no crossover up to" that level (``router.decide.table.Crossing``), never a crossing
of the curves extended past what was measured. Plain data and arithmetic;
``router.learn.keeper`` drives it.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import NamedTuple

from router.decide.predict import Gain
from router.decide.table import (
    Crossing,
    Fit,
    Point,
    PoolCurve,
    Source,
    Table,
    Workload,
    fit_line,
    no_crossover_reason,
)
from router.pools import BASELINE, POOLS, SPECULATIVE, Pool


@dataclass(frozen=True, slots=True)
class Curve:
    """Seconds per iteration against concurrency, interpolated between measured points."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]  # seconds per iteration
    tau: float = 1.0  # tokens per iteration now

    def spi(self, n: float) -> float:
        xs, ys = self.xs, self.ys
        if len(xs) == 1:
            return ys[0]
        i = bisect_left(xs, n)
        if i == 0:
            return ys[0]  # below the first point: no cheaper than it
        if i >= len(xs):
            # past the last point: extend the last segment, never downhill (more load is
            # never cheaper; a noisy pair of points must not promise free capacity)
            x0, x1, y0, y1 = xs[-2], xs[-1], ys[-2], ys[-1]
            return y1 + max(0.0, (y1 - y0) / (x1 - x0)) * (n - x1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(1e-9, y0 + (y1 - y0) * (n - x0) / (x1 - x0))

    def spt(self, n: float) -> float:
        """Seconds per output token of one request at concurrency ``n``."""
        return self.spi(max(1.0, n)) / self.tau

    def total_tps(self, n: float) -> float:
        return n / self.spt(n) if n > 0 else 0.0


def marginal_gain(curves: dict[Pool, Curve] | None) -> Gain | None:
    """The predictive policy's gain: extra total decode tok/s from one more request on a
    replica of ``pool`` running ``load``, from curves fixed at the last update (cheap)."""
    if curves is None:
        return None

    def gain(pool: Pool, load: int) -> float:
        curve = curves[pool]
        return curve.total_tps(load + 1) - curve.total_tps(load)

    return gain


# A sample moves its bin's seconds per iteration by at most this factor: one request slowed by
# something else (a host starved of CPU, a preempted engine) must not redefine a concurrency;
# a real change still shows within a few samples.
CLIP = 2.0
# What a concurrency seen for the first time starts from (see ``PoolLearner._new_bin``).
NEW_BIN_WEIGHT = 3.0


@dataclass(slots=True)
class _Bin:
    """Decayed means at one concurrency."""

    weight: float = 0.0
    samples: int = 0
    spi: float = 0.0  # seconds per iteration
    ttft: float = 0.0
    e2e: float = 0.0

    def add(self, spi: float, ttft: float, e2e: float, keep: float, weight: float = 1.0) -> None:
        """One sample worth ``weight`` (0 to 1) samples; the bin keeps ``keep`` of its weight
        per whole sample."""
        if self.weight > 0:  # (see CLIP)
            spi = min(max(spi, self.spi / CLIP), self.spi * CLIP)
        self.weight = self.weight * keep**weight + weight
        k = weight / self.weight
        self.spi += (spi - self.spi) * k
        self.ttft += (ttft - self.ttft) * k
        self.e2e += (e2e - self.e2e) * k
        self.samples += 1


@dataclass(slots=True)
class PoolLearner:
    decay: float  # weight a bin keeps per new sample, e.g. 0.99: ~100 samples of memory
    bins: dict[int, _Bin] = field(default_factory=dict)
    samples: int = 0

    def add(self, n: float, spi: float, ttft: float, e2e: float, weight: float = 1.0) -> None:
        key = max(1, round(n))
        b = self.bins.get(key)
        if b is None:
            b = self.bins[key] = self._new_bin(key)
        b.add(spi, ttft, e2e, self.decay, weight)
        self.samples += 1

    def _new_bin(self, n: int) -> _Bin:
        """A concurrency seen for the first time starts where the curve through the others
        puts it, worth ``NEW_BIN_WEIGHT`` samples: its first sample alone must not define it
        (with more running never cheaper, one slow request at a low concurrency would
        otherwise set the whole curve above it)."""
        if len(self.bins) < 2:
            return _Bin()
        ns = sorted(self.bins)
        xs = tuple(float(x) for x in ns)

        def at(values: list[float]) -> float:
            return Curve(xs, tuple(values)).spi(float(n))

        bins = [self.bins[x] for x in ns]
        return _Bin(NEW_BIN_WEIGHT, 0, at([b.spi for b in bins]), at([b.ttft for b in bins]),
                    at([b.e2e for b in bins]))  # fmt: skip

    def curve(self, tau: float) -> Curve | None:
        if len(self.bins) < 2:
            return None  # one concurrency says nothing about the slope
        ns = sorted(self.bins)
        return Curve(tuple(float(n) for n in ns), tuple(self.bins[n].spi for n in ns), tau)

    def points(self, tau: float) -> tuple[Point, ...]:
        return tuple(
            Point(n, tau / b.spi, b.ttft, b.ttft, b.e2e, n * tau / b.spi, b.samples)
            for n, b in sorted(self.bins.items())
            if b.spi > 0
        )


@dataclass(frozen=True, slots=True)
class LearnConfig:
    decay: float = 0.99
    prior_weight: float = 10.0  # pseudo-samples each calibrated point counts for
    max_step: int = 1
    min_samples: int = 20  # per pool, before samples (not acceptance alone) move the crossover


class Held(NamedTuple):
    """The crossover routing holds: ``value`` requests per speculative engine, and whether it
    is a crossover or, with ``no_crossover``, the level measured up to without finding one."""

    value: int
    no_crossover: bool = False


class Learner:
    def __init__(self, cfg: LearnConfig, table: Table | None) -> None:
        self.cfg = cfg
        self.pools = {pool: PoolLearner(cfg.decay) for pool in POOLS}
        self.ref_tau = 1.0  # acceptance length the speculative points were measured at
        # ... or not known: a table without one (the engine reported none to calibrate) says
        # 1.0, its speculative points then in tokens, not iterations (see ``observe_accept``)
        self.ref_known = False
        self.tau: float | None = None  # latest engine-reported acceptance length
        self.seeded = False
        self.time_scale = 1.0  # of the engines: samples are divided by it (see Table)
        self.workload = Workload()
        self.objective = "tpot"
        # what the table says that serving does not measure, written back with what it learns:
        # each pool's prefill line and cap, the speculative acceptance at temperature > 0
        self._kept: dict[Pool, PoolCurve] = {pool: PoolCurve() for pool in POOLS}
        if table is not None:
            self._seed(table)

    def _seed(self, table: Table) -> None:
        self.workload = table.workload
        self.time_scale = table.time_scale
        self.objective = table.objective
        fit = table.speculative.fit
        if fit is not None:
            self.ref_tau = fit.tau
            self.ref_known = fit.tau > 1.0
        for pool in POOLS:
            curve = table.pool(pool)
            self._kept[pool] = PoolCurve((), curve.fit, curve.prefill, curve.cap)
            tau = self.ref_tau if pool == SPECULATIVE else 1.0
            bins = self.pools[pool].bins
            for p in curve.points:
                if p.decode_tps_p50 > 0:
                    weight = min(float(max(1, p.samples)), self.cfg.prior_weight)
                    spi = tau / p.decode_tps_p50
                    bins[p.concurrency] = _Bin(weight, p.samples, spi, p.ttft_p50, p.e2e_p50)
                    self.seeded = True

    # -- input ----------------------------------------------------------------------------------
    def observe_accept(self, tau: float | None) -> None:
        if tau is not None and math.isfinite(tau) and tau >= 1.0:
            if not self.ref_known and tau > 1.0:  # (1.0 is no reading of speculation)
                # The first reading where none was known (no table, or a table without one):
                # what was learned so far is at it, so it becomes the reference, and what was
                # measured in tokens per second is rescaled into iterations. (Left at 1.0, the
                # reading would make every iteration ``tau`` times shorter than measured.)
                for b in self.pools[SPECULATIVE].bins.values():
                    b.spi *= tau / self.ref_tau
                self.ref_tau = tau
                self.ref_known = True
            self.tau = tau

    def record(self, pool: Pool, concurrency: float, spt: float, ttft: float, e2e: float) -> None:
        """One finished request: mean concurrency, seconds per output token, TTFT, e2e."""
        if not (spt > 0 and math.isfinite(spt) and concurrency >= 1):
            return
        tau = (self.tau or self.ref_tau) if pool == SPECULATIVE else 1.0
        scale = self.time_scale
        self.pools[pool].add(concurrency, spt * tau / scale, ttft / scale, e2e / scale)

    # -- output ---------------------------------------------------------------------------------
    def curves(self) -> dict[Pool, Curve] | None:
        spec = self.pools[SPECULATIVE].curve(self.tau or self.ref_tau)
        base = self.pools[BASELINE].curve(1.0)
        if spec is None or base is None:
            return None
        return {SPECULATIVE: spec, BASELINE: base}

    def speeds(self) -> dict[Pool, list[tuple[int, float, int]]]:
        """Each pool's learned points as (concurrency, per-request decode tok/s, samples), the
        speculative one at the acceptance length now: the curves routing uses, in model time."""
        out: dict[Pool, list[tuple[int, float, int]]] = {}
        for pool in POOLS:
            tau = (self.tau or self.ref_tau) if pool == SPECULATIVE else 1.0
            out[pool] = [
                (n, tau / b.spi, b.samples)
                for n, b in sorted(self.pools[pool].bins.items())
                if b.spi > 0
            ]
        return out

    def measured_up_to(self) -> int | None:
        """The highest concurrency both pools have a bin at (None: a pool has none)."""
        spec, base = self.pools[SPECULATIVE].bins, self.pools[BASELINE].bins
        if not spec or not base:
            return None
        return min(max(spec), max(base))

    def crossing(self) -> Crossing | None:
        """Where the learned curves say the baseline becomes at least as fast per request,
        looked for only up to ``measured_up_to`` (see the module docstring)."""
        curves = self.curves()
        top = self.measured_up_to()
        if curves is None or top is None:
            return None
        spec, base = curves[SPECULATIVE], curves[BASELINE]
        margin = round(base.spt(top) / spec.spt(top), 4)
        for n in range(1, top + 1):
            if base.spt(n) <= spec.spt(n):
                return Crossing(
                    n, top, margin,
                    f"learned: the baseline is at least as fast from {n} on (measured up to "
                    f"{top})",
                )  # fmt: skip
        return Crossing(None, top, margin, "learned: " + no_crossover_reason(top, margin, "tpot"))

    def target(self) -> Held | None:
        """What the crossover moves toward (None: not enough known)."""
        found = self.crossing()
        if found is None:
            return None
        return Held(found.limit, found.crossover is None)

    def enough_samples(self) -> bool:
        return all(self.pools[p].samples >= self.cfg.min_samples for p in POOLS)

    def step(self, current: Held, tau_changed: bool) -> Held | None:
        """The crossover after one update, or None to leave it: bounded move toward target
        (whether it is a crossover or none measured follows the target at once)."""
        if not (self.enough_samples() or tau_changed):
            return None
        goal = self.target()
        if goal is None or goal == current:
            return None
        move = max(-self.cfg.max_step, min(self.cfg.max_step, goal.value - current.value))
        return Held(current.value + move, goal.no_crossover)

    def table(self, held: Held, source: Source, measured_at: str) -> Table:
        """The table to write: the crossover in force (``held``; null when none is measured,
        with the range and margin the learned curves show)."""
        pools = {}
        for pool in POOLS:
            tau = self.ref_tau if pool == SPECULATIVE else 1.0
            points = self.pools[pool].points(tau)
            # the fit carries the acceptance length the points are at, for the next start
            xs = [float(p.concurrency) for p in points]
            ys = [tau / p.decode_tps_p50 for p in points]
            kept = self._kept[pool]
            sampling = kept.fit.tau_sampling if kept.fit is not None else None
            fit = Fit(fit_line(xs, ys), tau, sampling) if points else None
            pools[pool] = PoolCurve(points, fit, kept.prefill, kept.cap)
        found = self.crossing()
        top = found.measured_up_to if found is not None else None
        if held.no_crossover and top is None:
            top = held.value
        return Table(
            crossover=None if held.no_crossover else held.value,
            measured_up_to=top,
            margin=found.margin if found is not None else None,
            reason=found.reason if found is not None and held.no_crossover else "",
            source=source,
            objective="tpot" if self.objective != "e2e" else "e2e",
            measured_at=measured_at,
            workload=self.workload,
            speculative=pools[SPECULATIVE],
            baseline=pools[BASELINE],
            time_scale=self.time_scale,
            notes="learned online: points are decayed means of served requests' decode speed "
            "(speculative at the acceptance length in its fit); fits are least-squares lines "
            "of seconds per iteration against concurrency, for reference",
        )
