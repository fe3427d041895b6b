"""``spec-router calibrate`` on one regime's pair: a speculative sim of that preset and a baseline
sim, as ``bench/results/calibration-traffic.json`` was made for eagle3 + baseline (the default
levels, 1,024-token prompts, 256-token outputs, the prefill and temperature probes, the caps).

Sims pinned to core 0, the calibrator to core 1, time scale 0.05. Writes
``bench/results/calibration-<regime>.json`` (and a plot beside it): the table the policy lab and
``bench/traffic.py --regime`` start the router from for that pair. Timing-sensitive: run it
under ``flock -x /work/notes/cpu.lock``.

    python bench/calibrate_regime.py eagle3-chain
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from router.sim.model import REGIMES
from router.tools.processes import pinned, running

RESULTS = Path(__file__).resolve().parent / "results"
SCALE = 0.05


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("regime", choices=REGIMES)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    out = RESULTS / f"calibration-{args.regime}.json"
    sim = ["-m", "router", "sim", "--port", "0", "--time-scale", str(SCALE)]
    seed = ["--seed", str(args.seed)]
    with (
        running([*sim, "--preset", args.regime, *seed], prefix=pinned(0)) as spec,
        running([*sim, "--preset", "baseline", *seed], prefix=pinned(0)) as base,
    ):
        cmd = [*pinned(1), sys.executable, "-m", "router", "calibrate", "--speculative",
               spec.url, "--baseline", base.url, "--time-scale", str(SCALE), "--out", str(out),
               "--plot", str(out.with_suffix(".png"))]  # fmt: skip
        print(" ".join(cmd), flush=True)
        return subprocess.call(cmd)


if __name__ == "__main__":
    raise SystemExit(main())
