"""`spec-router demo`'s comparison, repeated: the closed loop through the default router and
through round-robin, level after level, several times over, with what the router predicted.

The demo runs each level once, after a calibration, so one run says little about a level that
sits at the edge of the SLO (its 32 users). This runs the demo's own steps (the same sims, the
same calibration, the same measure: ``router.tools.demo``) and then the router levels
``--repeat`` times, printing for each phase the demo's numbers and, for the default router,
each pool's median predicted TPOT (the ``x-spec-router-predicted-tpot-ms`` header) against the
measured one, in model time. A later repeat starts from what the router learned in the earlier
ones, so a drift in what it learns shows as a trend down the repeats.

    python bench/lab/demo_repeat.py --router-levels 32,64 --repeat 4
    python bench/lab/demo_repeat.py --log-decisions /tmp/decisions   # every slo decision, JSONL

``--log-decisions DIR`` starts the default router with ``bench/lab/decision_log`` on its
``PYTHONPATH``: its ``sitecustomize`` writes each slo decision's options (load, feasibility,
value, predicted TTFT/TPOT, stream rate) and the models to ``DIR/decisions-<pid>.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
from contextlib import ExitStack
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from router.calibrate.loadgen import RequestResult, decode_tps  # noqa: E402
from router.tools import demo  # noqa: E402
from router.tools.processes import running  # noqa: E402

HEADER = "x-spec-router-predicted-tpot-ms"


def predicted_vs_measured(results: list[RequestResult], scale: float) -> str:
    """Per pool: requests, median predicted and measured TPOT (model ms)."""
    parts = []
    for pool in ("speculative", "baseline"):
        pairs = []
        for r in results:
            tps = decode_tps(r)
            if r.pool != pool or HEADER not in r.headers or not tps:
                continue
            pairs.append((float(r.headers[HEADER]) / 1000 / scale, 1 / tps / scale))
        if pairs:
            pred = statistics.median(p for p, _ in pairs) * 1000
            real = statistics.median(m for _, m in pairs) * 1000
            parts.append(f"{pool} n {len(pairs)} TPOT predicted {pred:.0f} measured {real:.0f} ms")
    return "; ".join(parts)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1,2,4,8,16,32,64", help="calibration levels")
    ap.add_argument("--router-levels", default="32,64")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--time-scale", type=float, default=0.1)
    ap.add_argument("--duration", type=float, default=2.2)
    ap.add_argument("--output-tokens", type=int, default=96)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--log-decisions", type=Path, default=None, metavar="DIR")
    args = ap.parse_args(argv)
    scale = args.time_scale
    sim = ["-m", "router.sim", "--port", "0", "--time-scale", str(scale)]
    serve = ["-m", "router", "serve", "--port", "0"]
    token = secrets.token_hex(8)
    with ExitStack() as stack:
        spec = stack.enter_context(running([*sim, "--preset", "eagle3", "--seed", "1"])).url
        base = stack.enter_context(running([*sim, "--preset", "baseline", "--seed", "2"])).url
        env = demo.router_env(spec, base, None, token, scale)
        if args.log_decisions is not None:
            args.log_decisions.mkdir(parents=True, exist_ok=True)
            env["PYTHONPATH"] = os.pathsep.join(
                [str(ROOT / "bench" / "lab" / "decision_log"), str(ROOT)]
            )
            env["SPEC_ROUTER_BENCH_DECISIONS"] = str(args.log_decisions)
        router = stack.enter_context(running(serve, env)).url
        rr = stack.enter_context(
            running(serve, demo.router_env(spec, base, "round_robin", time_scale=scale))
        ).url
        for url in (router, rr):
            demo.wait_ready(url)
        levels = [int(x) for x in args.levels.split(",")]
        demo.calibrate_router(router, token, {"speculative": spec, "baseline": base}, levels, args)
        table = httpx.get(f"{router}/router/table").json()
        tau = (table["speculative"].get("fit") or {}).get("tau")
        caps = {pool: table[pool].get("cap") for pool in ("speculative", "baseline")}
        print(f"calibrated (acceptance length {tau}, caps {caps}); model time below")
        for repeat in range(1, args.repeat + 1):
            for n in (int(x) for x in args.router_levels.split(",")):
                for name, url in (("slo", router), ("round_robin", rr)):
                    target = "router" if name == "slo" else name  # (the demo's target names)
                    point, run = asyncio.run(demo.run_target(url, target, n, args))
                    line = (
                        f"repeat {repeat} users {n:3d} {name:11s} within SLO "
                        f"{point.strict:4.0%} / {point.relaxed:4.0%}  "
                        f"{point.total_tps:6.1f} tok/s  TTFT p50 {point.ttft_p50 * 1000:5.0f} ms"
                    )
                    if point.spec_share is not None:
                        line += f"  to speculative {point.spec_share:4.0%}"
                    print(line, flush=True)
                    if name == "slo":
                        print(f"    {predicted_vs_measured(run.results, scale)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
