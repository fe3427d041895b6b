"""``bench/lab_sim.py``'s router learns as ``spec-router serve`` does: each finished request
carries its backend's in-flight integral as the lease goes (``Proxy.release``), so the keeper
makes its decode and concurrency samples (from 1df2b2f until session 14 the lab recorded none,
and every lab run routed on the calibrated table alone)."""

from __future__ import annotations

import sys
from pathlib import Path

from router.pools import BASELINE, SPECULATIVE
from router.sim.model import BASELINE as BASE_PRESET
from router.sim.model import EAGLE3
from router.tools.traffic import Arrival

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
import lab_sim as lab  # noqa: E402


def test_a_lab_run_with_learning_on_samples_both_pools_curves() -> None:
    # 60 requests over 30 s, alternating pools under round robin: both pools serve some
    arrivals = [Arrival(0.5 * i, 200, 64, 0.0) for i in range(60)]
    made = []

    def make(urls):  # type: ignore[no-untyped-def]
        made.append(lab.Router("round_robin", urls, lab.TABLE, learn=True))
        return made[-1]

    reqs = lab.run(arrivals, make, seed=3, presets=(EAGLE3, BASE_PRESET),
                   pools=(SPECULATIVE, BASELINE))  # fmt: skip
    assert all(r.done for r in reqs)
    keeper = made[0].keeper
    keeper.settle()
    samples = keeper.status()["samples"]
    assert samples[SPECULATIVE] > 0 and samples[BASELINE] > 0, samples
    learned = keeper.curves()["learned"]
    assert learned[SPECULATIVE] and learned[BASELINE], learned
    # every finished request's integral was taken as its lease went, at its end
    for r in reqs:
        assert r.out is not None and r.out.area_end is not None
        assert r.out.area_at == r.last
