"""The fleet lab at the sockets' scale: the main day compressed as ``spec-router fleet`` plays it.

``bench/fleet.py`` runs the must-show's day 48 times faster than the engines run (its envelope,
the restarts and the planner's minutes), so the planner counts ~2 arrivals an interval, where
the lab's day (``fleet_lab.py``) gives it ~100. What the forecast makes of so few arrivals (its
level's noise, a surge that passes its clip unseen) moves the plan over sockets and not in the
lab. Here the lab's engines and router play that compressed day, with what the router does over
sockets in front of the planner: yesterday's state seeded with the envelope's mean rate a minute
(``router.tools.fleet``), and each interval the count over the latest intervals holding at least
50 arrivals, at most ten, with the newest interval's own count (``router.planning.traffic``).
No sockets, so none of their noise: rows of a few minutes each.

    python bench/lab/fleet_compressed.py --regimes eagle3-chain --seeds 1,2,3 --splits 3,4
    python bench/lab/fleet_compressed.py --var-step 0 ...    # the forecast's variance as squares

Prints one line per regime, seed and row (strict / relaxed %, switches, the planner's splits
over the day) and writes them as JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

from fleet_calibrate import workload_mix  # noqa: E402
from fleet_control import PlannerController, setting_for  # noqa: E402
from fleet_regimes import regime  # noqa: E402
from fleet_router import DeciderRouter  # noqa: E402
from fleet_score import score  # noqa: E402
from fleet_sim import Observed, run  # noqa: E402
from fleet_workloads import (  # noqa: E402
    HOUR,
    Envelope,
    arrivals,
    engine_slo_capacity,
    mean_lengths,
)

from router.plan import (  # noqa: E402
    Observation,
    Params,
    Slo,
    mix_of,
    spill_threshold,
)
from router.tools.fleet.workload import expected_per_minute  # noqa: E402

ENGINES = 4
COMPRESS = 48.0  # bench/fleet.py's
MIN_ARRIVALS, MAX_INTERVALS = 50, 10  # router.planning.traffic.WindowParams' (600 s of 60)


class WindowedPlanner(PlannerController):
    """The planner given what the router's window gives it over sockets."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.counts: deque[int] = deque(maxlen=MAX_INTERVALS)

    def observation(self, obs: Observed) -> Observation:
        """The window's: the latest intervals holding ``MIN_ARRIVALS``, and the newest's own."""
        self.counts.append(obs.arrivals)
        held, total = 0, 0
        for c in reversed(self.counts):
            held, total = held + 1, total + c
            if total >= MIN_ARRIVALS:
                break
        mix = mix_of(obs.prompts, obs.outputs, obs.hot)
        return Observation(obs.now, total, held * obs.seconds, mix, (obs.arrivals, obs.seconds))


def scaled(params: Params, c: float, season: int) -> Params:
    """``router.planning.service.params_of`` at ``PLAN_TIME_SCALE = 1 / c``."""
    return params._replace(
        interval=params.interval / c,
        horizon=params.horizon / c,
        tail=params.tail / c,
        dwell_to_speculative=params.dwell_to_speculative / c,
        dwell_to_baseline=params.dwell_to_baseline / c,
        forecast=params.forecast._replace(season=season),
    )


def day(reg: str, seed: int, splits: list[int], params: Params, c: float) -> list[dict[str, Any]]:
    spec, base = regime(reg)
    spec, base = replace(spec, startup=spec.startup / c), replace(base, startup=base.startup / c)
    capacity = ENGINES * engine_slo_capacity(base, "conv", 0.8)
    env = Envelope("surge", hours=8.0 / c, surge_at=1.5 * HOUR / c, surge_length=600.0 / c)
    reqs = arrivals(env, capacity, "conv", 0.8, seed)
    prompt, output = mean_lengths("conv")
    setting = setting_for(spec, base, prompt + output / 2)
    theta = spill_threshold(setting.speculative, setting.baseline, workload_mix("conv", 0.8),
                            Slo())  # fmt: skip
    rows = []
    for k in splits:
        t0 = time.time()
        res = run(reqs, spec, base, ENGINES, k, theta, seed=seed,
                  router=DeciderRouter(spec, base, prompt, output))  # fmt: skip
        s = score(res.requests, 0.0, env.duration)
        rows.append({"regime": reg, "seed": seed, "row": f"static {k}", "strict": s.strict,
                     "relaxed": s.relaxed, "switches": 0, "s": time.time() - t0})  # fmt: skip
    calm = Envelope("diurnal", hours=8.0 / c)
    yesterday = list(expected_per_minute(calm, capacity, 60.0 / c))
    p = scaled(params, c, len(yesterday))
    ctl = WindowedPlanner(setting, p)
    ctl.warm_rates(yesterday, p.interval)
    t0 = time.time()
    res = run(reqs, spec, base, ENGINES, ENGINES, theta, seed=seed, controller=ctl,
              interval=p.interval, router=DeciderRouter(spec, base, prompt, output))  # fmt: skip
    s = score(res.requests, 0.0, env.duration)
    hour = HOUR / c
    splits_over = [(round(t / hour, 2), k) for t, k, _ in res.timeline]
    rows.append({"regime": reg, "seed": seed, "row": "planner", "strict": s.strict,
                 "relaxed": s.relaxed, "switches": len(res.switches), "timeline": splits_over,
                 "s": time.time() - t0})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--regimes", default="eagle3-chain")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--splits", default="", help="static splits to run besides the planner")
    ap.add_argument("--compress", type=float, default=COMPRESS)
    ap.add_argument("--var-step", type=float, default=None)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    params = Params()
    if args.var_step is not None:
        params = params._replace(forecast=params.forecast._replace(var_step=args.var_step))
    splits = [int(x) for x in args.splits.split(",") if x]
    out = []
    for reg in args.regimes.split(","):
        for seed in (int(x) for x in args.seeds.split(",")):
            for r in day(reg, seed, splits, params, args.compress):
                out.append(r)
                line = (f"{r['regime']} seed {r['seed']} {r['row']}: {100 * r['strict']:.1f} / "
                        f"{100 * r['relaxed']:.1f}, {r['switches']} switches "
                        f"({r['s']:.0f} s)")  # fmt: skip
                if "timeline" in r:
                    line += f" splits (h, spec): {r['timeline']}"
                print(line, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
