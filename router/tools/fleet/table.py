"""The crossover table a perfect calibration of a regime's sims would measure. Pure.

``spec-router fleet`` starts its router with the table ``spec-router calibrate`` would build on
the fleet's two presets, computed from their performance model (``router.sim.model``) instead
of measured: every row of a fleet run starts from the same curves, and a run does not spend
minutes calibrating. The router learns from there as it does in production.
"""

from __future__ import annotations

from dataclasses import replace

from router.decide.table import (
    Point,
    PoolCurve,
    Prefill,
    Table,
    Workload,
    crossing,
    fit_points,
)
from router.sim.model import Preset, closed_loop

LEVELS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def model_points(p: Preset, prompt: int, output: int, sampling: bool = False) -> tuple[Point, ...]:
    out = []
    for n in LEVELS:
        if n > p.max_running:
            break
        tau = p.tau_sampling if sampling else p.tau
        lp = closed_loop(p, n, prompt, output, tau=tau)
        e2e = lp.ttft + (output - 1) / lp.per_request_tps
        out.append(Point(n, lp.per_request_tps, lp.ttft, lp.ttft, e2e, lp.total_tps, 50))
    return tuple(out)


def curve(p: Preset, prompt: int, output: int) -> PoolCurve:
    points = model_points(p, prompt, output)
    fit = fit_points(points, tau=p.tau)
    if p.spec_k:
        fit = replace(fit, tau_sampling=p.tau_sampling)
    prefill = Prefill(p.prefill_factor * p.p0, p.prefill_factor / p.r_pre)
    return PoolCurve(points, fit, prefill, p.max_running)


def model_table(
    spec: Preset, base: Preset, prompt: int, output: int, time_scale: float = 1.0
) -> Table:
    """Both presets' curves at a workload of these mean lengths (model time), for sims at
    ``time_scale``."""
    prompt, output = max(1, prompt), max(2, output)
    s, b = curve(spec, prompt, output), curve(base, prompt, output)
    c = crossing(s.points, b.points)  # (no crossover within the levels: eagle3-chain)
    return Table(
        crossover=c.crossover,
        measured_up_to=c.measured_up_to,
        margin=c.margin,
        source="calibrated",
        workload=Workload(prompt, output),
        speculative=s,
        baseline=b,
        notes=f"spec-router fleet: {spec.name} and {base.name} from their performance model",
        time_scale=time_scale,
    )
