"""Online learning of both pools' curves and of the crossover, from the requests the router serves.

Every finished request that streamed at least two tokens becomes a sample: its pool, the mean
number of requests in flight on its backend while it decoded, and its seconds per output token.
Each pool keeps an exponentially weighted least-squares line of seconds per *iteration*
(``spt * tau``, see ``router.crossover``) against concurrency, in which recent samples weigh
more; the calibrated table, if any, is the prior and never fades below a floor, so a pool that
only ever runs at one concurrency still has a slope. Per-concurrency bins keep the learned curve
readable in ``GET /router/table``.

The speculative line is in iterations, so the engine-reported acceptance length rescales it at
once: when acceptance collapses, the target crossover drops on the next update, before enough
slow requests have been seen. The crossover moves toward the target by at most ``max_step`` per
update. All of it is plain data and arithmetic; the app's lifespan calls ``update()`` on a timer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from router.crossover import (
    Fit,
    Line,
    Point,
    PoolCurve,
    Table,
    Workload,
    crossover_from_fits,
)
from router.inflight import BASELINE, POOLS, SPECULATIVE


@dataclass(slots=True)
class _Sums:
    """Decaying weighted sums for a least-squares line."""

    w: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def add(self, x: float, y: float, weight: float) -> None:
        self.w += weight
        self.x += weight * x
        self.y += weight * y
        self.xx += weight * x * x
        self.xy += weight * x * y

    def scale(self, factor: float) -> None:
        self.w *= factor
        self.x *= factor
        self.y *= factor
        self.xx *= factor
        self.xy *= factor

    def merged(self, other: _Sums) -> _Sums:
        return _Sums(
            self.w + other.w,
            self.x + other.x,
            self.y + other.y,
            self.xx + other.xx,
            self.xy + other.xy,
        )

    def line(self) -> Line | None:
        if self.w <= 0:
            return None
        mx, my = self.x / self.w, self.y / self.w
        sxx = self.xx - self.w * mx * mx
        if sxx <= 1e-9 * max(1.0, self.w):
            return None  # no spread in concurrency: no slope to be had
        beta = (self.xy - self.w * mx * my) / sxx
        return Line(my - beta * mx, beta)


@dataclass(slots=True)
class _Bin:
    """A learned point: weighted means at one concurrency."""

    weight: float = 0.0
    samples: int = 0
    tps: float = 0.0
    ttft: float = 0.0
    e2e: float = 0.0

    def add(self, tps: float, ttft: float, e2e: float, keep: float) -> None:
        self.weight = self.weight * keep + 1.0
        k = 1.0 / self.weight
        self.tps += (tps - self.tps) * k
        self.ttft += (ttft - self.ttft) * k
        self.e2e += (e2e - self.e2e) * k
        self.samples += 1


@dataclass(slots=True)
class PoolLearner:
    decay: float  # weight kept per new sample, e.g. 0.99: ~100 samples of memory
    prior: _Sums = field(default_factory=_Sums)
    recent: _Sums = field(default_factory=_Sums)
    bins: dict[int, _Bin] = field(default_factory=dict)
    samples: int = 0

    def add(self, n: float, spi: float, tps: float, ttft: float, e2e: float) -> None:
        self.recent.scale(self.decay)
        self.recent.add(n, spi, 1.0)
        self.bins.setdefault(max(1, round(n)), _Bin()).add(tps, ttft, e2e, self.decay)
        self.samples += 1

    def line(self) -> Line | None:
        return self.prior.merged(self.recent).line()

    def points(self) -> tuple[Point, ...]:
        return tuple(
            Point(n, b.tps, b.ttft, b.ttft, b.e2e, b.tps * n, b.samples)
            for n, b in sorted(self.bins.items())
        )


@dataclass(frozen=True, slots=True)
class LearnConfig:
    decay: float = 0.99
    prior_weight: float = 30.0  # pseudo-samples the calibrated curve counts for, in all
    max_step: int = 1
    min_samples: int = 20  # per pool, before samples (not acceptance alone) move the crossover
    limit: int = 256


class Learner:
    def __init__(self, cfg: LearnConfig, table: Table | None) -> None:
        self.cfg = cfg
        self.pools = {pool: PoolLearner(cfg.decay) for pool in POOLS}
        self.ref_tau = 1.0  # acceptance length the speculative prior was measured at
        self.tau: float | None = None  # latest engine-reported acceptance length
        self.workload = Workload()
        self.objective = "tpot"
        if table is not None:
            self._seed(table)

    def _seed(self, table: Table) -> None:
        self.workload = table.workload
        self.objective = table.objective
        for pool in POOLS:
            curve = table.pool(pool)
            learner = self.pools[pool]
            if curve.fit is not None:
                if pool == SPECULATIVE:
                    self.ref_tau = curve.fit.tau
                levels = [p.concurrency for p in curve.points] or [1, 8, 32]
                weight = self.cfg.prior_weight / len(levels)
                for n in levels:
                    learner.prior.add(float(n), curve.fit.line.at(n), weight)
            for p in curve.points:
                learner.bins[p.concurrency] = _Bin(
                    float(p.samples), p.samples, p.decode_tps_p50, p.ttft_p50, p.e2e_p50
                )

    # -- input ----------------------------------------------------------------------------------
    def observe_accept(self, tau: float | None) -> None:
        if tau is not None and math.isfinite(tau) and tau >= 1.0:
            if self.tau is None and self.pools[SPECULATIVE].prior.w == 0:
                self.ref_tau = tau  # no calibrated prior: the first reading is the reference
            self.tau = tau

    def record(self, pool: str, concurrency: float, spt: float, ttft: float, e2e: float) -> None:
        """One finished request: mean concurrency, seconds per output token, TTFT, e2e."""
        if not (spt > 0 and math.isfinite(spt) and concurrency >= 1):
            return
        tau = (self.tau or self.ref_tau) if pool == SPECULATIVE else 1.0
        self.pools[pool].add(concurrency, spt * tau, 1.0 / spt, ttft, e2e)

    # -- output ---------------------------------------------------------------------------------
    def fits(self) -> dict[str, Fit] | None:
        lines = {pool: self.pools[pool].line() for pool in POOLS}
        if any(line is None for line in lines.values()):
            return None
        spec_tau = self.tau or self.ref_tau
        return {
            SPECULATIVE: Fit(lines[SPECULATIVE], spec_tau),  # type: ignore[arg-type]
            BASELINE: Fit(lines[BASELINE], 1.0),  # type: ignore[arg-type]
        }

    def target(self) -> int | None:
        fits = self.fits()
        if fits is None:
            return None
        return crossover_from_fits(fits[SPECULATIVE], fits[BASELINE], limit=self.cfg.limit)

    def enough_samples(self) -> bool:
        return all(self.pools[p].samples >= self.cfg.min_samples for p in POOLS)

    def step(self, current: int, tau_changed: bool) -> int | None:
        """The crossover after one update, or None to leave it: bounded move toward target."""
        if not (self.enough_samples() or tau_changed):
            return None
        goal = self.target()
        if goal is None or goal == current:
            return None
        move = max(-self.cfg.max_step, min(self.cfg.max_step, goal - current))
        return current + move

    def gain(self, pool: str, load: int) -> float | None:
        """Extra total decode tok/s from one more request on a replica running ``load``."""
        fits = self.fits()
        if fits is None:
            return None
        fit = fits[pool]
        return fit.total_tps(load + 1) - fit.total_tps(load)

    def table(self, crossover: int, source: str, measured_at: str) -> Table:
        fits = self.fits()
        curves = {
            pool: PoolCurve(self.pools[pool].points(), None if fits is None else fits[pool])
            for pool in POOLS
        }
        return Table(
            crossover=crossover,
            source=source,
            objective="tpot" if self.objective != "e2e" else "e2e",
            measured_at=measured_at,
            workload=self.workload,
            speculative=curves[SPECULATIVE],
            baseline=curves[BASELINE],
            notes="learned online: points are decayed means of served requests (decode tok/s); "
            "fits are seconds per iteration against concurrency",
        )
