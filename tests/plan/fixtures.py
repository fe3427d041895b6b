"""Plain values for the planner's tests: engines like the sims' presets, a small mix."""

from __future__ import annotations

from router.plan import Curve, EngineState, Mix, Setting
from router.pools import BASELINE, SPECULATIVE, Pool


def linear(a: float, b: float, tau: tuple[float, float] = (1.0, 1.0), cap: int = 256,
           per_request_context: float = 0.0) -> Curve:  # fmt: skip
    """Seconds per iteration ``a + b * batch`` (plus a context cost), like the sims' model."""
    spi = tuple(a + (b + per_request_context) * max(1, n) for n in range(cap + 1))
    return Curve(spi, tau[0], tau[1], 0.0324, 1.08 / 2500, cap)


# the seed's regime (router/sim/model.py: EAGLE3 and BASELINE, ~1250 tokens held per request)
EAGLE3 = linear(0.02727, 0.007341, (2.8, 2.4), 48, 2.5e-5)
CHAIN = linear(0.0317, 0.0029, (2.8, 2.4), 256, 2.5e-5)
BASE = linear(0.01871, 0.001294, (1.0, 1.0), 256, 2.5e-5)._replace(
    prefill_base=0.03, prefill_per_token=1 / 2500
)
SEED = Setting(EAGLE3, BASE, 550.0, 510.0)
CHAINED = Setting(CHAIN, BASE, 550.0, 510.0)
# a chat-like mix in a few bins (the Azure conversation trace's shape, coarsely), 80% at T=1
MIX = Mix((150.0, 400.0, 1000.0, 2400.0), (40.0, 100.0, 200.0, 500.0), 0.8)


def fleet(speculative: int, baseline: int, **states: tuple[Pool, str]) -> tuple[EngineState, ...]:
    """``speculative`` + ``baseline`` engines up (e0, e1, ...), and named others as given."""
    out = [EngineState(f"e{i}", SPECULATIVE) for i in range(speculative)]
    out += [EngineState(f"e{speculative + i}", BASELINE) for i in range(baseline)]
    out += [EngineState(name, mode, status, 300.0) for name, (mode, status) in states.items()]  # type: ignore[arg-type]
    return tuple(out)
