"""The planner's goodput model against the lab: flat loads, every split, several workloads.

For each regime, workload (trace, temperature-1 share), split ``k`` of ``n`` engines and rate
(shares of the all-baseline fleet's SLO capacity), one static lab run of ``hours`` at that
constant Poisson rate (the first ``WARMUP`` seconds unscored) against
``router.plan.split_goodput`` on the same mix. The errors are what the planner's judgement of a
split is worth; the ranking error (does the model's best split score within a point of the
lab's best?) is what its decisions are worth.

    python bench/lab/fleet_calibrate.py --regimes eagle3 --workloads conv:0.8
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lab_sim (fleet_router's decider)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fleet_control import setting_for  # noqa: E402
from fleet_regimes import REGIMES, regime  # noqa: E402
from fleet_router import DeciderRouter  # noqa: E402
from fleet_score import score  # noqa: E402
from fleet_sim import run  # noqa: E402
from fleet_workloads import (  # noqa: E402
    Envelope,
    arrivals,
    engine_slo_capacity,
    mean_lengths,
)

from router.plan import (  # noqa: E402
    Mix,
    ModelParams,
    Slo,
    mix_of,
    spill_threshold,
    split_goodput,
)

SPILLOVER = ModelParams(router="spillover")

WARMUP = 300.0
LOADS = (0.1, 0.25, 0.4, 0.55, 0.7, 0.85, 1.0, 1.15)


@dataclass
class Row:
    regime: str
    kind: str
    hot: float
    k: int
    load: float
    lab: tuple[float, float]
    model: tuple[float, float]  # the planner's model (the slo router: its best threshold)
    spill_model: tuple[float, float] = (0.0, 0.0)  # the model of spillover at the crossover


def workload_mix(kind: str, hot: float, seed: int = 0) -> Mix:
    """The mix a router would have measured: from a sample of the workload's requests."""
    sample = arrivals(Envelope("flat", hours=1.0, hi=1.0), 2.0, kind, hot, seed + 999)
    return mix_of([r.prompt for r in sample], [r.output for r in sample], hot)


def calibrate(reg: str, kind: str, hot: float, n: int, loads: Sequence[float], hours: float,
              seed: int, router: str = "slo") -> list[Row]:  # fmt: skip
    spec, base = regime(reg)
    capacity = n * engine_slo_capacity(base, kind, hot)
    prompt, output = mean_lengths(kind)
    setting = setting_for(spec, base, prompt + output / 2)
    mix = workload_mix(kind, hot)
    theta = spill_threshold(setting.speculative, setting.baseline, mix, Slo())
    rows = []
    for load in loads:
        reqs = arrivals(Envelope("flat", hours=hours, hi=load), capacity, kind, hot, seed)
        for k in range(n + 1):
            rt = None if router == "spillover" else DeciderRouter(spec, base, prompt, output)
            res = run(reqs, spec, base, n, k, theta, seed=seed, router=rt)
            s = score(res.requests, WARMUP, hours * 3600)
            g = split_goodput(setting.speculative, setting.baseline, mix, Slo(), k, n - k,
                              load * capacity)  # fmt: skip
            sg = split_goodput(setting.speculative, setting.baseline, mix, Slo(), k, n - k,
                               load * capacity, SPILLOVER)  # fmt: skip
            rows.append(Row(reg, kind, hot, k, load, (s.strict, s.relaxed), (g.strict, g.relaxed),
                            (sg.strict, sg.relaxed)))  # fmt: skip
    return rows


def summary(rows: Sequence[Row], weight: float = 0.2, which: str = "model") -> dict[str, float]:
    """Mean absolute errors (points) and how often, and by how much, the model's best split
    under the objective (the planner's: ``weight`` on strict) misses the lab's best;
    ``which``: the planner's model ("model") or spillover's ("spill_model")."""

    def model(r: Row) -> tuple[float, float]:
        got: tuple[float, float] = getattr(r, which)
        return got

    def obj(x: tuple[float, float]) -> float:
        return weight * x[0] + (1 - weight) * x[1]

    strict = [abs(r.lab[0] - model(r)[0]) for r in rows]
    relaxed = [abs(r.lab[1] - model(r)[1]) for r in rows]
    objective = [abs(obj(r.lab) - obj(model(r))) for r in rows]
    groups: dict[tuple[str, str, float, float], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.regime, r.kind, r.hot, r.load), []).append(r)
    regret = []
    for g in groups.values():
        chosen = max(g, key=lambda r: obj(model(r)))
        best = max(obj(r.lab) for r in g)
        regret.append(best - obj(chosen.lab))
    return {
        "strict_mae": 100 * statistics.fmean(strict),
        "relaxed_mae": 100 * statistics.fmean(relaxed),
        "strict_max": 100 * max(strict),
        "relaxed_max": 100 * max(relaxed),
        "objective_mae": 100 * statistics.fmean(objective),
        "objective_max": 100 * max(objective),
        "regret_mean": 100 * statistics.fmean(regret),
        "regret_max": 100 * max(regret),
        "regret_over_1pt": sum(x > 0.01 for x in regret) / len(regret),
        "cells": float(len(regret)),
    }


def markdown(rows: Sequence[Row], args: argparse.Namespace, argv: list[str] | None) -> str:
    """The planner's model and spillover's against the lab, per regime and workload."""
    command = " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        "# The planner's goodput model against the fleet lab",
        "",
        f"    python bench/lab/fleet_calibrate.py {command}",
        "",
        f"Static splits of {args.engines} engines at flat Poisson loads ("
        + ", ".join(f"{int(100 * x)}%" for x in LOADS)
        + f" of the all-baseline SLO capacity, {args.hours:g} h each, the first "
        f"{WARMUP:.0f} s unscored) behind the lab's router ({args.router}), against "
        "`router.plan.split_goodput`: the planner's model (the slo router as its best spill "
        "threshold) and the model of spillover at the crossover (the planner's model before "
        "session 4). Points of goodput; objective 0.2 strict + 0.8 relaxed; regret: the lab's "
        "objective of the lab's best split minus that of the split the model prefers.",
        "",
        "| regime | workload | model | strict MAE | relaxed MAE | objective MAE | objective "
        "max | regret mean | regret max | loads with regret over 1 pt |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[str, str, float], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.regime, r.kind, r.hot), []).append(r)
    for (reg, kind, hot), got in groups.items():
        for label, which in (("best threshold", "model"), ("crossover", "spill_model")):
            s = summary(got, which=which)
            lines.append(
                f"| {reg} | {kind}, {int(100 * hot)}% at T=1 | {label} | {s['strict_mae']:.1f} "
                f"| {s['relaxed_mae']:.1f} | {s['objective_mae']:.1f} | "
                f"{s['objective_max']:.1f} | {s['regret_mean']:.2f} | {s['regret_max']:.1f} | "
                f"{s['regret_over_1pt'] * s['cells']:.0f} of {s['cells']:.0f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--regimes", default=",".join(REGIMES))
    ap.add_argument("--workloads", default="conv:0.8", help="kind:hot,... e.g. conv:0.8,code:0.5")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--router", default="slo", choices=("slo", "spillover"))
    ap.add_argument("--dump", default="", help="write the rows here (JSON)")
    ap.add_argument("--md", default="", help="write the summary table here (markdown)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    rows: list[Row] = []
    for reg in args.regimes.split(","):
        for w in args.workloads.split(","):
            kind, hot = w.split(":")
            got = calibrate(reg, kind, float(hot), args.engines, LOADS, args.hours, args.seed,
                            args.router)  # fmt: skip
            rows += got
            s = summary(got)
            print(f"{reg:13s} {w:9s} " + " ".join(f"{k} {v:.2f}" for k, v in s.items()),
                  flush=True)  # fmt: skip
            if args.verbose:
                for r in got:
                    print(f"   k={r.k} load {r.load:.2f} lab {r.lab[0]:.3f} {r.lab[1]:.3f} "
                          f"model {r.model[0]:.3f} {r.model[1]:.3f}")  # fmt: skip
    if args.dump:
        Path(args.dump).write_text(json.dumps([asdict(r) for r in rows]))
    if args.md:
        Path(args.md).write_text(markdown(rows, args, argv))
    s = summary(rows)
    print("all " + " ".join(f"{k} {v:.2f}" for k, v in s.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
