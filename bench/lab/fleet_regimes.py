"""The engine regimes the fleet lab runs: a speculative preset paired with the baseline one.

The presets are the simulated engines' own (``router/sim/model.py``, docs/regimes.md):
``eagle3`` (the seed's, crossover ~7, cap 48), ``eagle3-chain`` (no crossover, cap 256) and
``eagle3-tree`` (crossover ~20, a compute-bound knee at 13, cap 256).
"""

from __future__ import annotations

from router.sim.model import BASELINE, PRESETS, Preset

REGIMES = ("eagle3", "eagle3-chain", "eagle3-tree")


def regime(name: str) -> tuple[Preset, Preset]:
    """(speculative preset, baseline preset) of a regime."""
    if name not in REGIMES:
        raise ValueError(f"unknown regime {name!r}; known: {', '.join(REGIMES)}")
    return PRESETS[name], BASELINE
