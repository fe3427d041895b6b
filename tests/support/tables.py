"""Crossover tables computed from the simulated engines' analytic model (what a perfect
calibration would measure), for tests that need a table without running a sweep."""

from __future__ import annotations

import math
from dataclasses import replace

from router.decide.table import Point, PoolCurve, Table, Workload, crossing, fit_points
from router.sim.model import BASELINE, EAGLE3, Preset, closed_loop


def model_points(preset: Preset, levels: list[int], prompt: int, output: int) -> tuple[Point, ...]:
    out = []
    for n in levels:
        lp = closed_loop(preset, n, prompt, output)
        e2e = lp.ttft + (output - 1) / lp.per_request_tps
        out.append(Point(n, lp.per_request_tps, lp.ttft, lp.ttft, e2e, lp.total_tps, 50))
    return tuple(out)


def model_table(
    prompt: int,
    output: int,
    levels: list[int] | None = None,
    crossover: int | None = None,
    time_scale: float = 1.0,
    tau_sampling: float | None = None,
    spec_preset: Preset = EAGLE3,
) -> Table:
    levels = levels or [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    spec = model_points(spec_preset, levels, prompt, output)
    base = model_points(BASELINE, levels, prompt, output)
    found = crossing(spec, base)
    value = found.crossover if crossover is None else crossover
    assert not math.isnan(spec[0].decode_tps_p50)
    return Table(
        crossover=value,
        measured_up_to=found.measured_up_to,
        margin=found.margin,
        reason=found.reason if value is None else "",
        source="calibrated",
        measured_at="2026-12-02T00:00:00+00:00",
        workload=Workload(prompt, output),
        speculative=PoolCurve(
            spec, replace(fit_points(spec, tau=spec_preset.tau), tau_sampling=tau_sampling)
        ),
        baseline=PoolCurve(base, fit_points(base)),
        notes="from the analytic model of the simulated presets",
        time_scale=time_scale,
    )
