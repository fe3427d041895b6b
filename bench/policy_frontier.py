"""Static load-threshold policies on a few of the family's workloads: is there any point where
one policy has both the best simple policy's strict and its relaxed goodput?

For a workload of ``bench/policy_family.py`` (its arrivals, lengths, engines and seeds), each
policy of a grid sends a request to the least-loaded speculative engine while that runs fewer
than ``K`` requests, else to the least-loaded baseline engine while that runs fewer than
``M``, else to the least-loaded engine of ``last`` (a pool). The grid spans what the simple
policies and the default do in those cells (``predictive`` holds the speculative engine near
its strict capacity, ``round_robin`` fills both, the default fills both to their relaxed
capacities): ``K`` 2-20, 24, 28, 32; ``M`` 6-40 and unbounded; ``last`` either pool. Each point
is scored as the family scores (``policy_lab.score``) and set against the best simple
policy's strict and relaxed goodput from the family's cache; the output is each workload's
frontier (the points no other point beats on both) and the point closest to both bests.

    python bench/policy_frontier.py --only 1,41,51,117,206,215,18,119,204

The router around the thresholds is the lab's (``lab_sim.Router``: tracker, keeper, clock),
with its decision replaced by the thresholds (no exploration). CPU-heavy, not timing-sensitive:
under ``flock -s``; about 0.1 s of CPU per point.
"""

from __future__ import annotations

import argparse
import json
import sys
from multiprocessing import Pool as Processes
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import policy_family as family  # noqa: E402
from lab_sim import TABLES, Engine, Req, Router, run  # noqa: E402
from policy_lab import score  # noqa: E402

from router.account.outcome import Outcome  # noqa: E402
from router.decide.policy import Decision  # noqa: E402
from router.pools import BASELINE, SPECULATIVE, Pool  # noqa: E402

KS = (*range(2, 21), 24, 28, 32)
MS = (6, 10, 14, 18, 22, 26, 30, 40, 10_000)


class Thresholds(Router):
    """The lab's router with its decision replaced by ``(K, M, last)``."""

    limits: tuple[int, int, Pool] = (1, 1, BASELINE)

    def route(self, r: Req, engines: dict[str, Engine]) -> None:
        k, m, last = self.limits
        pool: Pool
        r.out = Outcome("/v1/chat/completions", self.clock.now, stream=True)
        r.out.read(True, r.arrival.temperature > 0, 0)

        def least(pool: Pool) -> Engine:
            return min((engines[u] for u in self.urls[pool]), key=lambda e: e.load)

        spec, base = least(SPECULATIVE), least(BASELINE)
        if spec.load < k:
            pool, engine = SPECULATIVE, spec
        elif base.load < m:
            pool, engine = BASELINE, base
        else:
            pool, engine = last, least(last)
        self._send(r, Decision(pool, engine.url, "within_slo"), engines)


def run_point(args: tuple[int, int, int, Pool]) -> dict[str, Any]:
    seed, k, m, last = args
    w = family.draw(seed)
    arrivals = family.arrivals(w)
    presets, pools = family.layout(w)

    def make(urls: dict[Pool, list[str]]) -> Router:
        router = Thresholds("round_robin", urls, TABLES[w.regime])
        router.limits = (k, m, last)
        return router

    reqs = run(arrivals, make, seed=1000 * w.seed + 7, presets=presets, pools=pools,
               drain=family.DRAIN)  # fmt: skip
    s = score(reqs, arrivals, family.WARMUP, family.DRAIN)
    return {"seed": seed, "k": k, "m": m, "last": last, "strict": s.strict, "relaxed": s.relaxed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", required=True, help="the workloads' seeds, N,N,...")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument(
        "--cache",
        type=Path,
        default=ROOT / "bench" / "results" / "policy-family-runs.jsonl",
        help="the family's runs (the simple policies)",
    )
    ap.add_argument("--out", type=Path, help="also write every point here (JSON lines)")
    args = ap.parse_args(argv)
    seeds = [int(x) for x in args.only.split(",")]
    lasts: tuple[Pool, ...] = (SPECULATIVE, BASELINE)
    todo = [
        (s, k, m, last)
        for s in seeds
        for k in KS
        for m in MS
        for last in lasts
        if not (m == MS[-1] and last == SPECULATIVE)  # (unbounded M: last is never reached)
    ]
    with Processes(args.jobs) as procs:
        points = list(procs.imap_unordered(run_point, todo, chunksize=4))
    if args.out:
        args.out.write_text("".join(json.dumps(p) + "\n" for p in points))
    rows = family.load_cache(args.cache)
    for seed in seeds:
        simple = [rows[(seed, p, "")] for p in family.SIMPLE]
        best_s = max(s["strict"] for s in simple)
        best_r = max(s["relaxed"] for s in simple)
        mine = [p for p in points if p["seed"] == seed]

        def short(p: dict[str, Any], s: float = best_s, r: float = best_r) -> float:
            return float(100 * max(s - p["strict"], r - p["relaxed"]))

        near = min(mine, key=short)
        front = sorted(
            {(round(100 * p["strict"], 1), round(100 * p["relaxed"], 1)) for p in mine
             if not any(o["strict"] >= p["strict"] and o["relaxed"] >= p["relaxed"]
                        and (o["strict"], o["relaxed"]) != (p["strict"], p["relaxed"])
                        for o in mine)}
        )  # fmt: skip
        within = {g: sum(1 for p in mine if short(p) <= g) for g in (2, 5)}
        print(
            f"{family.draw(seed).name}: best simple {100 * best_s:.1f}/{100 * best_r:.1f}; "
            f"{len(mine)} points, within 2 on both {within[2]}, within 5 {within[5]}; closest "
            f"K={near['k']} M={near['m']} last={near['last']} {100 * near['strict']:.1f}/"
            f"{100 * near['relaxed']:.1f} (short by {short(near):.1f})"
        )
        print("  frontier (strict/relaxed %): " + " ".join(f"{s}/{r}" for s, r in front))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
