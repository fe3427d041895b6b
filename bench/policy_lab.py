"""Policy lab: routing policies against open-loop traffic on the simulated engines, in-process.

A discrete-event copy of the sims and of the router around a policy (``bench/lab_sim.py``),
driven by the same pure policy functions the router runs (``router.decide.policy``), on the
same workloads ``bench/traffic.py`` replays over HTTP (the Azure conversation trace's window at
600-720 s thinned to the rate, and the bursty mix), scored as it scores them (10 s warm-up
unscored, requests unfinished 60 s after the last arrival count as failures). It answers in
seconds what the HTTP bench answers in minutes; ``bench/traffic.py`` then checks the
conclusions over real sockets.

    python bench/policy_lab.py --workload azure-conv --loads 0.3,0.7,1.1
    python bench/policy_lab.py --workload bursty --loads 0.7 --policies slo,round_robin

``--seeds N`` runs N engine seeds (the acceptance draws) on the HTTP bench's workload (seed 1);
``--workload-seeds`` also varies the workload (the thinning, the bursty generator) with them.

``--regime eagle3-chain`` (or ``eagle3-tree``) runs that speculative preset against the baseline
instead of eagle3 (docs/regimes.md); give it a ``--table`` calibrated on that pair, or use
``--models truth`` (the default table was calibrated on eagle3 + baseline).

``--closed 32,64`` runs closed loops of that many users instead (each sends its next request
when the last ends, all starting together: the demo's workload, ``--closed-sizes`` 32 prompt
and 96 output tokens, greedy), ``CLOSED_DURATION`` model seconds each, scoring the requests
sent from ``CLOSED_WARMUP`` until ``CLOSED_SLACK`` before the end:

    python bench/policy_lab.py --closed 24,32,40,64 --policies slo,round_robin --seeds 6
"""

from __future__ import annotations

import argparse
import functools
import importlib
import math
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab_sim import TABLE, Req, Router, Truth, run, run_closed  # noqa: E402

from router.pools import SPECULATIVE, Pool  # noqa: E402
from router.sim.model import BASELINE, EAGLE3, PRESETS, REGIMES, Preset  # noqa: E402
from router.tools import traffic  # noqa: E402
from router.tools.traffic import Arrival  # noqa: E402

TRACES = Path("/work/shared/traces")  # as bench/traffic.py
# bench/traffic.py's defaults
START, DURATION, WARMUP, DRAIN = 600.0, 120.0, 10.0, 60.0
CLOSED_DURATION, CLOSED_WARMUP, CLOSED_SLACK = 60.0, 8.0, 20.0
BURSTY_LENGTHS = (traffic.Lengths(1020, 1.0, 16, 8192), traffic.Lengths(129, 0.86, 4, 1000))


def engine_capacity(p: Preset, prompt: float, output: float, hot: float) -> float:
    from router.sim.model import closed_loop

    tau = (1 - hot) * p.tau + hot * p.tau_sampling
    return closed_loop(p, p.max_running, round(prompt), round(output), tau=tau).total_tps / output


def capacity(arrivals: list[Arrival], spec: Preset = EAGLE3) -> float:
    """As ``bench/traffic.py``'s: the ``spec`` + baseline pair's saturation rate, req/s."""
    d = traffic.describe(arrivals)
    args = (d.prompt_mean, d.output_mean, d.hot_share)
    return engine_capacity(spec, *args) + engine_capacity(BASELINE, *args)


@functools.lru_cache(maxsize=4)
def trace(kind: str) -> tuple[Arrival, ...]:
    return tuple(traffic.load_trace(TRACES / f"azure-llm-2023-{kind}.csv"))


def base_workload(name: str, hot: float) -> list[Arrival]:
    """The workload the loads are shares of (its capacity): the trace window, or a long
    sample of the bursty generator."""
    if name == "bursty":
        return traffic.on_off(1.0, 20000.0, *BURSTY_LENGTHS, temperature_share=0.5, seed=0)
    kind = name.split("-")[1]
    window = traffic.window(trace(kind), START, DURATION)
    return traffic.with_temperatures(window, hot, 1) if hot else window


def workload(name: str, rate: float, seed: int, hot: float = 0.0) -> list[Arrival]:
    """What ``spec-router replay`` sends for bench/traffic.py at ``rate`` with ``--seed``."""
    if name == "bursty":
        return traffic.on_off(rate, DURATION, *BURSTY_LENGTHS, burst=4.0, on_s=10.0, off_s=20.0,
                              temperature_share=0.5, seed=seed)  # fmt: skip
    kind = name.split("-")[1]
    window = traffic.window(trace(kind), START, DURATION)
    out = traffic.thin(window, rate, DURATION, seed=seed)
    return traffic.with_temperatures(out, hot, seed) if hot else out


@dataclass(frozen=True)
class Score:
    strict: float
    relaxed: float
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p90: float
    spec_share: float
    n: int


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def score(done: list[Req], arrivals: list[Arrival], warm: float = WARMUP,
          drain: float = DRAIN) -> Score:  # fmt: skip
    """As ``router.tools.goodput``: over the arrivals at or after ``warm``; a request not
    finished ``drain`` after the last arrival (or refused by the router's queue) is a failure
    (and has no TTFT/TPOT)."""
    end = (arrivals[-1].at if arrivals else 0.0) + drain
    scored = [a for a in arrivals if a.at >= warm]
    rs = [r for r in done if r.arrival.at >= warm and r.last is not None and r.last <= end]
    ttft, tpot, strict, relaxed = [], [], 0, 0
    for r in rs:
        assert r.first is not None and r.last is not None
        t1 = r.first - r.arrival.at
        n = r.arrival.output_tokens
        t2 = (r.last - r.first) / (n - 1) if n > 1 else 0.0
        ttft.append(t1)
        tpot.append(t2)
        strict += t1 <= 1.0 and t2 <= 0.025
        relaxed += t1 <= 3.0 and t2 <= 0.050
    n = max(1, len(scored))
    return Score(strict / n, relaxed / n, pct(ttft, 0.5), pct(ttft, 0.99), pct(tpot, 0.5),
                 pct(tpot, 0.9), sum(r.pool == SPECULATIVE for r in rs) / max(1, len(rs)),
                 len(scored))  # fmt: skip


def mean_score(scores: list[Score]) -> Score:
    return Score(*[sum(getattr(s, f.name) for s in scores) / len(scores) for f in fields(Score)])


def router_for(policy: str, models: str, table: Path, spec: Preset) -> Any:
    """What builds the lab's router over a run's engines: ``models`` "learn" (the table,
    learning on: as ``spec-router serve`` runs), "table" (no learning) or "truth" (the sims'
    own models, no learning)."""

    def make(urls: dict[Pool, list[str]]) -> Router:
        truth = Truth(spec) if models == "truth" else None
        return Router(policy, urls, table, learn=models == "learn", truth=truth)  # type: ignore[arg-type]

    return make


def evaluate(policy: str, name: str, rate: float, seeds: int, models: str = "learn",
             workload_seeds: bool = False, hot: float = 0.0, spec: Preset = EAGLE3,
             table: Path = TABLE) -> Score:  # fmt: skip
    """Mean over ``seeds`` engine seeds (the sims' acceptance draws)."""
    scores = []
    for seed in range(seeds):
        arrivals = workload(name, rate, seed + 1 if workload_seeds else 1, hot)
        done = run(arrivals, router_for(policy, models, table, spec), seed=10 * seed + 1,
                   presets=(spec, BASELINE))  # fmt: skip
        scores.append(score(done, arrivals))
    return mean_score(scores)


def evaluate_closed(policy: str, users: int, sizes: tuple[int, int], seeds: int,
                    models: str, spec: Preset = EAGLE3,
                    table: Path = TABLE) -> tuple[Score, float]:  # fmt: skip
    """Mean over ``seeds`` engine seeds, and the requests per second served."""
    scores, rates = [], []
    for seed in range(seeds):
        reqs = run_closed(users, *sizes, CLOSED_DURATION, router_for(policy, models, table, spec),
                          seed=10 * seed + 1, presets=(spec, BASELINE))  # fmt: skip
        last = CLOSED_DURATION - CLOSED_SLACK
        finished = [r for r in reqs if r.arrival.at <= last]
        scored = [r.arrival for r in finished]
        scores.append(score(finished, scored, CLOSED_WARMUP, CLOSED_SLACK))
        rates.append(scores[-1].n / (CLOSED_DURATION - CLOSED_SLACK - CLOSED_WARMUP))
    return mean_score(scores), sum(rates) / len(rates)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="azure-conv",
                    choices=["bursty", "azure-conv", "azure-code"])  # fmt: skip
    ap.add_argument("--loads", default="0.3,0.7,1.1", help="shares of the pair's capacity")
    ap.add_argument("--rates", help="requests/s instead of --loads")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--workload-seeds", action="store_true")
    ap.add_argument("--temperature-share", type=float, default=0.0, help="azure: share at T=1")
    ap.add_argument("--models", default="learn", choices=["learn", "table", "truth"])
    ap.add_argument("--policies", default="slo,predictive,spillover,round_robin")
    ap.add_argument("--closed", help="closed loops of these many users instead of --workload")
    ap.add_argument("--closed-sizes", default="32,96", help="prompt,output tokens (closed)")
    ap.add_argument("--regime", choices=REGIMES, default="eagle3",
                    help="the speculative preset, paired with the baseline")  # fmt: skip
    ap.add_argument("--table", type=Path, default=TABLE,
                    help="the routers' calibrated table (default: eagle3 + baseline)")  # fmt: skip
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="MODULE.NAME=VALUE",
        help="override a constant of router.decide.{capacity,policy,snapshot} (a sweep)",
    )
    args = ap.parse_args(argv)
    spec = PRESETS[args.regime]
    for item in args.set:
        name, value = item.split("=", 1)
        module, attr = name.split(".", 1)
        target = importlib.import_module(f"router.decide.{module}")
        if not hasattr(target, attr):
            raise SystemExit(f"lab: router.decide.{module} has no {attr}")
        setattr(target, attr, type(getattr(target, attr))(float(value)))
        print(f"lab: router.decide.{module}.{attr} = {getattr(target, attr)}")
    if args.closed:
        sizes = tuple(int(x) for x in args.closed_sizes.split(","))
        print(f"closed loops of {sizes[0]} + {sizes[1]} tokens, models {args.models}, "
              f"{args.seeds} seeds: strict/relaxed goodput %, requests/s, TTFT p50 s, "
              "TPOT p50 ms, share to speculative")  # fmt: skip
        for users in (int(x) for x in args.closed.split(",")):
            for policy in args.policies.split(","):
                s, served = evaluate_closed(policy, users, (sizes[0], sizes[1]), args.seeds,
                                            args.models, spec, args.table)  # fmt: skip
                print(
                    f"users {users:3d} {policy:12s} strict {100 * s.strict:5.1f} relaxed "
                    f"{100 * s.relaxed:5.1f} req/s {served:5.2f} ttft p50 {s.ttft_p50:5.2f} "
                    f"tpot p50 {1000 * s.tpot_p50:6.1f} spec {100 * s.spec_share:4.0f}%",
                    flush=True,
                )
        return 0
    hot = args.temperature_share
    cap = capacity(base_workload(args.workload, hot), spec)
    if args.rates:
        rates = [float(x) for x in args.rates.split(",")]
    else:
        rates = [float(x) * cap for x in args.loads.split(",")]
    print(f"workload {args.workload} (capacity {cap:.3f} req/s), models {args.models}, "
          f"{args.seeds} seeds: strict/relaxed goodput %, TTFT p99 s, TPOT p50 ms, "
          "share to speculative")  # fmt: skip
    for rate in rates:
        for policy in args.policies.split(","):
            s = evaluate(policy, args.workload, rate, args.seeds, args.models,
                         args.workload_seeds, hot, spec, args.table)  # fmt: skip
            print(
                f"load {rate / cap:4.0%} ({rate:5.3f}/s) {policy:12s} strict {100 * s.strict:5.1f} "
                f"relaxed {100 * s.relaxed:5.1f} ttft p99 {s.ttft_p99:6.2f} "
                f"tpot p50 {1000 * s.tpot_p50:6.1f} spec {100 * s.spec_share:4.0f}% n {s.n:.0f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
