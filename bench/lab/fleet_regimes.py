"""The engine regimes the fleet lab runs: a speculative preset paired with the baseline one.

``eagle3`` is the seed's pair (router/sim/model.py). ``eagle3-chain`` and ``eagle3-tree`` are
interim stand-ins until the regimes branch adds its fitted presets to router/sim/model.py; once
it has, ``regime`` looks them up there (the one line marked below) and these go.

- ``eagle3-chain``: a healthy EAGLE-3 chain draft as issue 33 states it (``a`` 31.7 ms, ``b``
  2.9 ms, running cap 256): no crossover up to 64 (x1.35 per request at 32, decode bound).
- ``eagle3-tree``: a wide draft tree: ``a`` 30 ms, ``b`` 4.74 ms, cap 256, chosen so the
  greedy decode-bound crossover is 20 (x1.61 at 1, x0.85 at 64; SpecDecode-Bench's k=21 tree
  crosses near 20).
"""

from __future__ import annotations

from router.sim.model import BASELINE, EAGLE3, MS, PRESETS, Preset

_INTERIM: dict[str, Preset] = {
    "eagle3-chain": EAGLE3.replace(name="eagle3-chain", a=31.7 * MS, b=2.9 * MS, max_running=256),
    "eagle3-tree": EAGLE3.replace(name="eagle3-tree", a=30.0 * MS, b=4.74 * MS, max_running=256),
}

REGIMES = ("eagle3", "eagle3-chain", "eagle3-tree")


def regime(name: str) -> tuple[Preset, Preset]:
    """(speculative preset, baseline preset) of a regime."""
    if name not in REGIMES:
        raise ValueError(f"unknown regime {name!r}; known: {', '.join(REGIMES)}")
    spec = PRESETS.get(name) or _INTERIM[name]  # the regimes branch's presets win once landed
    return spec, BASELINE
