"""Curves learned from a burst alone, then a quiet moment: the lone request still speculates.

A router with no table that has only seen a burst (every request measured at 4-7 in flight, the
burst's prefill stalls inflating the times) knows nothing of its engines below 4: its curves
are held flat there (never cheaper than the lowest point), which says nothing of how the pools
compare for one request. The decision says that it extrapolated, and places the lone request
by its own time per token: on the speculative pool.
"""

from __future__ import annotations

import random

from router.decide.capacity import Mix, Slo, surface
from router.decide.params import DEFAULT
from router.decide.policy import BackendView, PoolView, Snapshot, choose
from router.decide.predict import Request
from router.learn.models import EngineModels, Sample
from router.pools import BASELINE, SPECULATIVE
from router.sim.model import BASELINE as BASE_PRESET
from router.sim.model import EAGLE3, Preset, step_time


def learned_from_a_burst(inflation: float) -> EngineModels:
    models = EngineModels(None)
    models.observe_accept(EAGLE3.tau)
    rng = random.Random(7)
    presets: tuple[tuple[str, Preset], ...] = ((SPECULATIVE, EAGLE3), (BASELINE, BASE_PRESET))
    for _ in range(200):
        for pool, p in presets:
            n = rng.choice((4, 5, 6, 7))
            hot = rng.random() < 0.5
            tau = (p.tau_sampling if hot else p.tau) if pool == SPECULATIVE else 1.0
            spi = step_time(p, n, n * 800) * inflation  # stalls the router did not see
            models.record(Sample(pool, float(n), spi / tau, 0.3, hot, 400, 1600, 200, n - 1, 0.0))  # type: ignore[arg-type]
    return models


def test_a_lone_request_after_a_burst_measured_at_4_to_7_goes_to_speculation() -> None:
    for inflation in (1.0, 1.4, 2.0):
        learned = learned_from_a_burst(inflation).models()
        assert learned is not None
        assert learned[SPECULATIVE].lowest == learned[BASELINE].lowest == 4
        s = surface(learned, Mix(400.0, 200.0, 0.5, 0.6), Slo(1.0, 0.025), DEFAULT)
        for sampling in (False, True):
            snap = Snapshot(
                PoolView(SPECULATIVE, (BackendView("http://s", 0),)),
                PoolView(BASELINE, (BackendView("http://b", 0),)),
                7,
                request=Request(400.0, 200.0, sampling, 1.0, 0.025),
                surface=s,
            )
            d = choose("slo", snap)[0]
            assert d is not None
            assert d.pool == SPECULATIVE, (inflation, sampling, d)
            # and it says its curves were held flat below what was measured
            assert d.extrapolated
