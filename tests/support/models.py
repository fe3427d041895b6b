"""Engine models (``router.decide.predict.PoolModel``) of the simulated presets, as a perfect
calibration would know them: for tests and the policy lab."""

from __future__ import annotations

from router.decide.predict import PoolModel, peak_throughput
from router.sim.model import Preset, step_time


def preset_model(p: Preset, context: float = 800.0, limit: int = 256) -> PoolModel:
    """Iteration cost per batch size (at ``context`` tokens per request), acceptance, prefill
    and cap of a sim preset."""
    spi = tuple(step_time(p, max(1, b), max(1, b) * context) for b in range(limit + 1))
    model = PoolModel(
        spi,
        tau_greedy=p.tau,
        tau_sampling=p.tau_sampling,
        prefill_base=p.prefill_factor * p.p0,
        prefill_per_token=p.prefill_factor / p.r_pre,
        cap=p.max_running,
        measured=limit,
    )
    return model._replace(peak=peak_throughput(model))
