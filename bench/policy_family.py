"""The default policy against the simple ones on a family of drawn workloads, in the lab.

Each workload is drawn from its seed (``draw``): the engine regime (``eagle3``, ``eagle3-chain``,
``eagle3-tree``, each paired with the baseline preset), one or two engines per pool, lengths
like chat, the Azure conversation trace, the Azure code trace (short outputs), retrieval (long
prompts, short answers) or short prompts with long answers, a share at temperature 1 from 0 to
100%, Poisson, bursty (on/off) or diurnal arrivals, and a rate from 10% to 150% of the pool
pair's capacity (its engines' saturation rates at the workload's mean lengths, as
``bench/traffic.py`` computes it). 120 s of arrivals, the first 10 s unscored, 60 s to drain,
scored as ``router.tools.goodput`` scores (``bench/policy_lab.py``'s ``score``).

Every router runs as ``spec-router serve`` does by default (learning and exploration on), from
the calibrated table of its regime's pair (``lab_sim.TABLES``). Against each workload, the
default policy (``slo``) is set against the best of ``spillover``, ``round_robin`` and
``predictive`` on it, strict and relaxed goodput apart.

    python bench/policy_family.py --workloads 240 --cache bench/results/policy-family.jsonl
    python bench/policy_family.py --workloads 80 --variant overload=0.75 --set overload=0.75
    python bench/policy_family.py --workloads 240 --variant queue --set queue=64,1
    python bench/policy_family.py --workloads 240 --summary-only   # from the cache, no runs
    python bench/policy_family.py --workloads 240 --variant "sim seed 1" --sim-seed 1  # noise

At ``--sim-seed`` k the simple policies run at k too (their rows' variant "sim seed k"; "" at 0),
so that each comparison is paired: the same arrivals on the same draw of the engines.

Results are cached by workload and variant in ``--cache`` (a JSON lines file), so that a
change to the default policy re-runs only its own cells (``--fresh`` runs everything again).
Runs in ``--jobs`` processes. CPU-heavy, not timing-sensitive: under ``flock -s``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import random
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from multiprocessing import Pool as Processes
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lab_sim import TABLES, Req, Router, run  # noqa: E402
from policy_lab import score  # noqa: E402

from router.decide.params import DEFAULT, Params  # noqa: E402
from router.pools import BASELINE, SPECULATIVE, Pool  # noqa: E402
from router.sim.model import BASELINE as BASE_PRESET  # noqa: E402
from router.sim.model import PRESETS, REGIMES, Preset, closed_loop  # noqa: E402
from router.tools import traffic  # noqa: E402
from router.tools.traffic import Arrival, Lengths  # noqa: E402

TRACES = Path("/work/shared/traces")
DURATION, WARMUP, DRAIN = 120.0, 10.0, 60.0
# A workload runs at least DURATION, and long enough for about this many arrivals (at most
# LONGEST): a light one of a few dozen requests would weigh each request at several points.
ARRIVALS_AT_LEAST, LONGEST = 200, 600.0
SIMPLE = ("spillover", "round_robin", "predictive")
DEFAULT_POLICY = "slo"
# Synthetic lengths (prompt, output): lognormal, clipped.
SYNTHETIC = {
    "chat": (Lengths(400, 0.8, 16, 4096), Lengths(200, 0.6, 8, 1024)),
    "retrieval": (Lengths(3000, 0.4, 512, 8192), Lengths(80, 0.6, 8, 512)),
    "long": (Lengths(100, 0.8, 8, 1024), Lengths(800, 0.5, 64, 4096)),
}
LENGTHS = ("chat", "conv", "code", "retrieval", "long")
ARRIVALS = ("poisson", "bursty", "diurnal")


@dataclass(frozen=True)
class Workload:
    """One drawn workload (``draw``)."""

    seed: int
    regime: str
    per_pool: int  # engines in each pool
    lengths: str
    arrivals: str
    hot: float  # share at temperature 1
    load: float  # share of the pair's capacity

    @property
    def name(self) -> str:
        return (
            f"#{self.seed} {self.regime} {self.per_pool}+{self.per_pool} {self.lengths} "
            f"{self.arrivals} T1 {self.hot:.0%} load {self.load:.0%}"
        )


def draw(seed: int) -> Workload:
    """The workload of ``seed``: every axis drawn uniformly."""
    rng = random.Random(f"family:{seed}")
    return Workload(
        seed,
        rng.choice(REGIMES),
        rng.choice((1, 2)),
        rng.choice(LENGTHS),
        rng.choice(ARRIVALS),
        round(rng.random(), 2),
        round(rng.uniform(0.1, 1.5), 3),
    )


@functools.lru_cache(maxsize=2)
def trace_pairs(kind: str) -> tuple[tuple[int, int], ...]:
    rows = traffic.load_trace(TRACES / f"azure-llm-2023-{kind}.csv")
    return tuple((a.prompt_tokens, a.output_tokens) for a in rows)


def lengths(w: Workload, n: int, rng: random.Random) -> list[tuple[int, int]]:
    if w.lengths in ("conv", "code"):
        pairs = trace_pairs(w.lengths)
        return [pairs[rng.randrange(len(pairs))] for _ in range(n)]
    prompt, output = SYNTHETIC[w.lengths]
    return [(prompt.draw(rng), output.draw(rng)) for _ in range(n)]


def mean_lengths(w: Workload) -> tuple[float, float]:
    sample = lengths(w, 20000, random.Random(f"mean:{w.lengths}"))
    return (sum(p for p, _ in sample) / len(sample), sum(o for _, o in sample) / len(sample))


def engine_capacity(p: Preset, prompt: float, output: float, hot: float) -> float:
    """Requests/s at which one engine's decode throughput saturates (``bench/traffic.py``)."""
    tau = (1 - hot) * p.tau + hot * p.tau_sampling
    point = closed_loop(p, p.max_running, round(prompt), max(2, round(output)), tau=tau)
    return point.total_tps / output


def capacity(w: Workload) -> float:
    prompt, output = mean_lengths(w)
    spec = PRESETS[w.regime]
    per_pair = engine_capacity(spec, prompt, output, w.hot)
    per_pair += engine_capacity(BASE_PRESET, prompt, output, w.hot)
    return per_pair * w.per_pool


def duration(w: Workload) -> float:
    """Seconds of arrivals: at least ``DURATION``, whole 30 s cycles of the bursty pattern."""
    rate = w.load * capacity(w)
    return min(LONGEST, max(DURATION, 30.0 * math.ceil(ARRIVALS_AT_LEAST / rate / 30.0)))


def arrivals(w: Workload) -> list[Arrival]:
    rate = w.load * capacity(w)
    one = Lengths(1, 0.0)
    seed = w.seed
    span = duration(w)
    if w.arrivals == "poisson":
        times = traffic.poisson(rate, span, one, one, seed=seed)
    elif w.arrivals == "bursty":
        times = traffic.on_off(rate, span, one, one, burst=4.0, on_s=10.0, off_s=20.0,
                               seed=seed)  # fmt: skip
    else:
        # one period over the run: from the mean up to the peak, down past the trough, back
        times = traffic.diurnal(rate, span, one, one, period_s=span, amplitude=0.7,
                                seed=seed)  # fmt: skip
    sizes = lengths(w, len(times), random.Random(f"lengths:{seed}"))
    out = [Arrival(a.at, p, o) for a, (p, o) in zip(times, sizes, strict=True)]
    return traffic.with_temperatures(out, w.hot, seed)


@dataclass(frozen=True)
class Variant:
    """The default policy as run: its parameters, and the router's queue."""

    name: str = "default"
    params: Params = DEFAULT
    queue: tuple[int, float] | None = None
    lifo: bool = False
    # the queue holds only under measured overload (``router.forward.admission``); False: every
    # overflowing request (sessions 3-6's queue)
    measured: bool = True
    # another draw of the engines' randomness (the arrivals and lengths kept): 0 is the
    # family's; the spread over a few is the default's run-to-run noise (``--sim-seed``)
    sim_seed: int = 0


def simple_variant(sim_seed: int) -> str:
    """The cache's variant name of a simple policy's run at ``sim_seed`` ("" at 0, as since
    session 1): the default at sim seed k is compared with the simple policies at sim seed k."""
    return "" if sim_seed == 0 else f"sim seed {sim_seed}"


def layout(w: Workload) -> tuple[list[Preset], list[Pool]]:
    spec = PRESETS[w.regime]
    presets = [spec] * w.per_pool + [BASE_PRESET] * w.per_pool
    spec_pool: Pool = SPECULATIVE
    base_pool: Pool = BASELINE
    pools = [spec_pool] * w.per_pool + [base_pool] * w.per_pool
    return presets, pools


def run_one(w: Workload, policy: str, variant: Variant) -> dict[str, Any]:
    a = arrivals(w)
    presets, pools = layout(w)
    table = TABLES[w.regime]

    def make(urls: dict[Pool, list[str]]) -> Router:
        if policy == DEFAULT_POLICY:
            return Router("slo", urls, table, queue=variant.queue, lifo=variant.lifo,
                          measured=variant.measured, params=variant.params)  # fmt: skip
        return Router(policy, urls, table)  # type: ignore[arg-type]

    started = time.process_time()
    reqs: list[Req] = run(
        a,
        make,
        seed=1000 * w.seed + 7 + 100_000 * variant.sim_seed,
        presets=presets,
        pools=pools,
        drain=DRAIN,
    )
    s = score(reqs, a, WARMUP, DRAIN)
    return {
        "seed": w.seed,
        "policy": policy,
        "variant": variant.name if policy == DEFAULT_POLICY else simple_variant(variant.sim_seed),
        "sim_seed": variant.sim_seed,
        "strict": s.strict,
        "relaxed": s.relaxed,
        "spec_share": s.spec_share,
        "ttft_p99": s.ttft_p99,
        "n": s.n,
        "cpu_s": round(time.process_time() - started, 3),
    }


def _task(args: tuple[Workload, str, Variant]) -> dict[str, Any]:
    return run_one(*args)


def key(row: dict[str, Any]) -> tuple[int, str, str]:
    return (int(row["seed"]), str(row["policy"]), str(row["variant"]))


def load_cache(path: Path) -> dict[tuple[int, str, str], dict[str, Any]]:
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {key(r): r for r in rows}


def measure(
    workloads: Sequence[Workload],
    variants: Sequence[Variant],
    cache: Path,
    jobs: int,
    fresh: bool,
    simple: Iterable[str] = SIMPLE,
) -> dict[tuple[int, str, str], dict[str, Any]]:
    have = {} if fresh else load_cache(cache)
    todo: list[tuple[Workload, str, Variant]] = []
    seeds = sorted({v.sim_seed for v in variants})
    for w in workloads:
        for sim_seed in seeds:
            for policy in simple:
                if (w.seed, policy, simple_variant(sim_seed)) not in have:
                    todo.append((w, policy, Variant(sim_seed=sim_seed)))
        for v in variants:
            if (w.seed, DEFAULT_POLICY, v.name) not in have:
                todo.append((w, DEFAULT_POLICY, v))
    print(f"family: {len(todo)} runs to do ({len(have)} cached)", file=sys.stderr, flush=True)
    done = 0
    with cache.open("a") as f, Processes(jobs) as procs:
        for row in procs.imap_unordered(_task, todo, chunksize=1):
            have[key(row)] = row
            f.write(json.dumps(row) + "\n")
            f.flush()
            done += 1
            if done % 50 == 0:
                print(f"family: {done}/{len(todo)}", file=sys.stderr, flush=True)
    return have


@dataclass(frozen=True)
class Cell:
    workload: Workload
    strict: float  # the default's
    relaxed: float
    best_strict: float  # the best simple policy's
    best_relaxed: float
    best_strict_by: str
    best_relaxed_by: str

    @property
    def d_strict(self) -> float:
        return 100 * (self.strict - self.best_strict)

    @property
    def d_relaxed(self) -> float:
        return 100 * (self.relaxed - self.best_relaxed)

    @property
    def worst(self) -> float:
        return min(self.d_strict, self.d_relaxed)


def cells(
    workloads: Sequence[Workload],
    rows: dict[tuple[int, str, str], dict[str, Any]],
    variant: str,
    sim_seed: int = 0,
) -> list[Cell]:
    """The default's ``variant`` against the simple policies at the same ``sim_seed``."""
    out = []
    for w in workloads:
        mine = rows.get((w.seed, DEFAULT_POLICY, variant))
        simple = [rows.get((w.seed, p, simple_variant(sim_seed))) for p in SIMPLE]
        if mine is None or any(s is None for s in simple):
            continue
        best_s = max((s for s in simple if s is not None), key=lambda s: s["strict"])
        best_r = max((s for s in simple if s is not None), key=lambda s: s["relaxed"])
        out.append(Cell(w, mine["strict"], mine["relaxed"], best_s["strict"],
                        best_r["relaxed"], best_s["policy"], best_r["policy"]))  # fmt: skip
    return out


def summary(cs: Sequence[Cell]) -> dict[str, Any]:
    n = len(cs)
    if not n:
        return {"workloads": 0}
    ok2 = sum(1 for c in cs if c.d_strict >= -2 and c.d_relaxed >= -2)
    ok5 = sum(1 for c in cs if c.d_strict >= -5 and c.d_relaxed >= -5)
    return {
        "workloads": n,
        "within_2_share": ok2 / n,
        "within_5_share": ok5 / n,
        "min_d_strict": min(c.d_strict for c in cs),
        "min_d_relaxed": min(c.d_relaxed for c in cs),
        "mean_d_strict": sum(c.d_strict for c in cs) / n,
        "mean_d_relaxed": sum(c.d_relaxed for c in cs) / n,
        "mean_strict": 100 * sum(c.strict for c in cs) / n,
        "mean_relaxed": 100 * sum(c.relaxed for c in cs) / n,
        "mean_best_strict": 100 * sum(c.best_strict for c in cs) / n,
        "mean_best_relaxed": 100 * sum(c.best_relaxed for c in cs) / n,
    }


def by_axis(cs: Sequence[Cell], axis: str) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[Cell]] = {}
    for c in cs:
        value = getattr(c.workload, axis)
        if axis == "load":
            value = f"{math.floor(value / 0.25) * 25}-{math.floor(value / 0.25) * 25 + 25}%"
        groups.setdefault(str(value), []).append(c)
    return {k: summary(v) for k, v in sorted(groups.items())}


def print_summary(cs: Sequence[Cell], label: str, worst: int = 10) -> None:
    s = summary(cs)
    if not s["workloads"]:
        print(f"{label}: nothing measured")
        return
    print(
        f"{label}: {s['workloads']} workloads; within 2 points of the best simple policy on "
        f"both: {s['within_2_share']:.1%}, within 5: {s['within_5_share']:.1%}; worst strict "
        f"{s['min_d_strict']:+.1f}, worst relaxed {s['min_d_relaxed']:+.1f}; mean "
        f"{s['mean_strict']:.1f}/{s['mean_relaxed']:.1f} against the best simple's "
        f"{s['mean_best_strict']:.1f}/{s['mean_best_relaxed']:.1f}"
    )
    for axis in ("regime", "per_pool", "lengths", "arrivals", "load"):
        parts = [
            f"{k} {v['within_2_share']:.0%} ({v['min_d_strict']:+.0f}/{v['min_d_relaxed']:+.0f})"
            for k, v in by_axis(cs, axis).items()
        ]
        print(f"  by {axis}: " + ", ".join(parts))
    for c in sorted(cs, key=lambda c: c.worst)[:worst]:
        print(
            f"  {c.workload.name}: strict {100 * c.strict:.1f} vs {100 * c.best_strict:.1f} "
            f"({c.best_strict_by}), relaxed {100 * c.relaxed:.1f} vs {100 * c.best_relaxed:.1f} "
            f"({c.best_relaxed_by})"
        )


def reaches(row: dict[str, Any], c: Cell, points: float) -> bool:
    """``row`` is within ``points`` of the best simple policy's strict and relaxed goodput."""
    gap = points / 100
    return bool(row["strict"] >= c.best_strict - gap and row["relaxed"] >= c.best_relaxed - gap)


def print_cells(
    cs: Sequence[Cell],
    rows: dict[tuple[int, str, str], dict[str, Any]],
    worst: int,
    sim_seed: int = 0,
) -> None:
    """Every simple policy's strict and relaxed goodput in the ``worst`` cells, and each losing
    cell's kind: *dominated* (a simple policy at least as good on both goodputs and 2 points
    better on one), *reachable* (a simple policy within 2 points of both bests) or a *trade*
    (none is: the best strict and the best relaxed come from different policies); then, with
    hindsight over every run in the cache (the simple policies and every variant of the
    default), the cells no run reaches within 2 and within 5 points on both."""

    def simple(c: Cell) -> list[dict[str, Any]]:
        return [rows[(c.workload.seed, p, simple_variant(sim_seed))] for p in SIMPLE]

    def kind(c: Cell) -> str:
        if any(
            s["strict"] >= c.strict
            and s["relaxed"] >= c.relaxed
            and max(s["strict"] - c.strict, s["relaxed"] - c.relaxed) > 0.02
            for s in simple(c)
        ):
            return "dominated"
        return "reachable" if any(reaches(s, c, 2) for s in simple(c)) else "trade"

    losing = [c for c in cs if c.worst < -2]
    kinds = [kind(c) for c in losing]
    trades = sum(1 for c in cs if not any(reaches(s, c, 2) for s in simple(c)))
    print(
        f"cells more than 2 points behind: {len(losing)}: dominated {kinds.count('dominated')}, "
        f"reachable by one simple policy {kinds.count('reachable')}, trade {kinds.count('trade')}; "
        f"of all {len(cs)}, no simple policy within 2 points of both bests: {trades}"
    )
    for c in sorted(cs, key=lambda c: c.worst)[:worst]:
        each = " ".join(
            f"{s['policy'][:4]} {100 * s['strict']:4.1f}/{100 * s['relaxed']:5.1f}"
            for s in simple(c)
        )
        print(
            f"  {c.workload.name}: default {100 * c.strict:4.1f}/{100 * c.relaxed:5.1f} "
            f"({c.d_strict:+.1f}/{c.d_relaxed:+.1f}); {each}; {kind(c) if c.worst < -2 else 'ok'}"
        )
    by_seed: dict[int, list[dict[str, Any]]] = {}
    for (seed, _, _), row in rows.items():
        by_seed.setdefault(seed, []).append(row)
    runs = {len(v) for v in by_seed.values()}
    for points in (2, 5):
        missed = [c for c in cs if not any(reaches(r, c, points) for r in by_seed[c.workload.seed])]
        print(
            f"hindsight, the best of every run in the cache per workload ({min(runs)}-{max(runs)} "
            f"runs each): within {points} points on both on {len(cs) - len(missed)} of {len(cs)}; "
            f"none on: {' '.join(f'#{c.workload.seed}' for c in missed)}"
        )


def parse_set(items: Sequence[str]) -> tuple[Params, tuple[int, float] | None, bool, bool]:
    """``--set``: Params fields, and ``queue=SIZE,TIMEOUT_S[,lifo][,unmeasured]``."""
    changes: dict[str, float | str] = {}
    queue = None
    lifo = False
    measured = True
    for item in items:
        name, value = item.split("=", 1)
        if name == "queue":
            size, timeout, *flags = value.split(",")
            queue = (int(size), float(timeout))
            lifo = "lifo" in flags
            measured = "unmeasured" not in flags
            continue
        if name not in {f.name for f in dataclasses.fields(Params)}:
            raise SystemExit(f"family: no parameter {name!r}")
        current = getattr(DEFAULT, name)
        changes[name] = value if isinstance(current, str) else float(value)
    params = dataclasses.replace(DEFAULT, **changes)  # type: ignore[arg-type]
    return params, queue, lifo, measured


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", type=int, default=240)
    ap.add_argument("--first", type=int, default=1, help="the first workload's seed")
    ap.add_argument("--variant", default="default", help="a name for the default policy as run")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a Params field, or queue=SIZE,TIMEOUT_S[,lifo][,unmeasured]")  # fmt: skip
    ap.add_argument(
        "--cache", type=Path, default=ROOT / "bench" / "results" / "policy-family-runs.jsonl"
    )
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--sim-seed", type=int, default=0,
                    help="another draw of the engines' randomness (noise); "
                         "the simple policies are run at it too")  # fmt: skip
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--only", help="only these workloads' seeds, N,N,...")
    ap.add_argument("--regimes", help="only workloads of these regimes, R,R,...")
    ap.add_argument("--worst", type=int, default=10)
    ap.add_argument("--summary-only", action="store_true", help="summarize the cache, run nothing")
    ap.add_argument(
        "--cells", action="store_true", help="every policy in the worst cells, their kinds"
    )
    args = ap.parse_args(argv)
    params, queue, lifo, measured = parse_set(args.set)
    variant = Variant(args.variant, params, queue, lifo, measured, args.sim_seed)
    seeds = range(args.first, args.first + args.workloads)
    if args.only:
        seeds = [int(x) for x in args.only.split(",")]  # type: ignore[assignment]
    workloads = [draw(s) for s in seeds]
    if args.regimes:
        workloads = [w for w in workloads if w.regime in args.regimes.split(",")]
    if args.summary_only:
        rows = load_cache(args.cache)
    else:
        rows = measure(workloads, [variant], args.cache, args.jobs, args.fresh)
    found = cells(workloads, rows, variant.name, args.sim_seed)
    print_summary(found, variant.name, 0 if args.cells else args.worst)
    if args.cells:
        print_cells(found, rows, args.worst, args.sim_seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
