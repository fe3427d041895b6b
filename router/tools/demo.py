"""``spec-router demo``: the whole idea in about a minute, on the built-in simulated engines.

Starts an EAGLE-3-like and a baseline sim on free ports, a router with the default policy and
one with ``round_robin`` in front of them. It ramps a closed-loop load through concurrency
1, 2, 4, ... 64 against each pool alone -- which is also a calibration: the table is built as
``spec-router calibrate`` builds it and loaded into the router with ``PUT /router/table``, as an
operator would -- then through each router. For every level it prints the share of requests
sent to the speculative pool, the per-request decode speed, the median time to first token and
the shares of requests that ended within serve's default SLO (strict: TTFT <= 1 s and TPOT <= 25
ms; relaxed: 3 s and 50 ms; model time), which is what the default policy routes for, and it
draws the speeds as a PNG. The router's live page (``/router/ui``) shows all of it as it
happens; ``--hold SECONDS`` then keeps everything up that long, ramping load up and down through
the router, so there is time to watch it.

The sims run ``--time-scale`` times faster than the model (default 0.1, i.e. 10x): every
number printed is converted back to model time (measured tok/s x time-scale; seconds / scale),
so it can be compared with the presets' figures (80.9 tok/s for EAGLE-3 alone at one request).
On a machine that cannot keep the sims to their model at that scale (``shortfalls``), it starts
again at twice the time scale.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import secrets
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import httpx

from router.calibrate.levels import LevelRun, build_table, point_from_run
from router.calibrate.loadgen import RequestResult, percentile, run_closed_loop, window_stats
from router.calibrate.sweep import acceptance, discover_cap, scrape
from router.decide.table import Table, TableError, Workload, to_json
from router.health.engines import EngineSample
from router.settings import sim_time_env
from router.sim.model import PRESETS, REGIMES, closed_loop
from router.tools.goodput import RELAXED, STRICT, timed_result
from router.tools.processes import running
from router.tools.traffic import Arrival

LEVELS = (1, 2, 4, 8, 16, 32, 64)
# The pool-alone runs double as a check that this machine runs the sims as their model says. A
# sim, or the load generator, that falls behind (a machine too slow or too busy for the time
# scale) delivers less than the model's closed-loop throughput, and then the table built from it
# and every comparison at that level describe the machine, not the engines (2026-12-04, a slow
# 2-core host at 0.1: the baseline sim at 77% of its model at 32 users and 52% at 64, and the
# router behind round-robin there). Below FAITHFUL of the model at any level, the demo starts
# again at twice the time scale (and twice the seconds per level, for the same model time), up to
# MAX_TIME_SCALE, unless the time scale was given.
# The load generator is this process, one Python thread: past LOADGEN_LIMIT of one core over a
# run it is what that run measures (each event waits for it), even where the sims keep up
# (2026-12-05, a slow 2-core host at 0.1 with httpx as the client: the demo reported its process
# at 86% of a core in the baseline's 64-user run, and a run given --time-scale 0.1 had the router
# 30% behind round-robin at 64 users in total tok/s; bench/lab/results/loadgen-client.md). It counts
# as falling behind too.
DEFAULT_TIME_SCALE = 0.1
FAITHFUL = 0.85
LOADGEN_LIMIT = 0.85
MAX_TIME_SCALE = 0.4
PRESET_OF = {"speculative": "eagle3", "baseline": "baseline"}  # each pool's sim (--regime)
TARGETS = ("router", "round_robin", "speculative", "baseline")
TARGET_TITLES = {
    "router": "router ({policy})",
    "round_robin": "round-robin",
    "speculative": "speculative only",
    "baseline": "baseline only",
}


@dataclass(frozen=True)
class Point:
    """One target at one concurrency, in model units."""

    target: str
    concurrency: int
    per_request_tps: float
    total_tps: float
    ttft_p50: float
    spec_share: float | None  # share of requests the router sent to speculative
    errors: int
    # shares of the requests that ended within serve's default SLO (model time), strict and
    # relaxed (``router.tools.goodput``): what the default policy routes for
    strict: float = math.nan
    relaxed: float = math.nan
    # the share of one core this process (the load generator) used over the run
    loadgen_cpu: float = math.nan


# -- processes ----------------------------------------------------------------------------------


def wait_ready(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"router at {url} never became ready")


def router_env(
    spec: str, base: str, policy: str | None, admin: str | None = None, time_scale: float = 1.0
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_ROUTER_")}
    env.update(
        SPEC_ROUTER_SPECULATIVE_URLS=spec,
        SPEC_ROUTER_BASELINE_URLS=base,
        SPEC_ROUTER_LOG_LEVEL="warning",
        SPEC_ROUTER_HEALTH_INTERVAL="0.5",
    )
    # serve's default SLO and engine lags in the sims' wall-clock time: unscaled, an SLO ten
    # times laxer is met everywhere, and each level's cancelled requests would still count
    # against the engines for most of the next level
    env.update(sim_time_env(time_scale))
    if policy:
        env["SPEC_ROUTER_POLICY"] = policy
    if admin:
        env["SPEC_ROUTER_ADMIN_TOKEN"] = admin
    return env


# -- measurement ----------------------------------------------------------------------------------


def measure(
    target: str,
    results: Sequence[RequestResult],
    started: float,
    duration: float,
    warmup: float,
    concurrency: int,
    scale: float,
) -> Point:
    """Steady-state numbers from the window after warm-up, converted to model units."""
    window = window_stats(results, started + warmup, started + duration)
    in_window = [r for r in results if r.start >= started + warmup or r.ok]
    routed = [r.pool for r in in_window if r.pool]
    share = sum(p == "speculative" for p in routed) / len(routed) if routed else None
    ttfts = [r.ttft for r in results if r.ok and r.ttft is not None]
    errors = sum(1 for r in results if r.error not in (None, "cancelled"))
    ended = [r for r in results if r.error != "cancelled"]
    within = [attained(r, scale) for r in ended]
    return Point(
        target,
        concurrency,
        per_request_tps=window.mean_request_tps * scale,
        total_tps=window.total_tps * scale,
        ttft_p50=percentile(ttfts, 50) / scale if ttfts else math.nan,
        spec_share=share if target in ("router", "round_robin") else None,
        errors=errors,
        strict=sum(a for a, _ in within) / len(within) if within else math.nan,
        relaxed=sum(b for _, b in within) / len(within) if within else math.nan,
    )


def attained(r: RequestResult, scale: float) -> tuple[bool, bool]:
    """Whether a request ended within the strict and the relaxed SLO, in model time, judged as
    ``spec-router replay`` judges its requests (``router.tools.goodput``)."""
    judged = timed_result(
        Arrival(0.0, 0, r.max_tokens),
        start=r.start,
        sent=r.start,
        status=r.status,
        first_token=r.first_token,
        last_token=r.last_token,
        end=r.end,
        output_tokens=r.output_tokens,
        error=r.error,
        time_scale=scale,
    )
    return judged.meets(STRICT), judged.meets(RELAXED)


async def run_target(
    url: str, target: str, concurrency: int, args: argparse.Namespace
) -> tuple[Point, LevelRun]:
    """Closed-loop load on one target; its point and, for calibration, the raw run."""
    started, cpu = time.monotonic(), time.process_time()
    warmup = args.duration * 0.3
    results = await run_closed_loop(
        f"{url}/v1",
        concurrency=concurrency,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        duration=args.duration,
    )
    busy = (time.process_time() - cpu) / max(time.monotonic() - started, 1e-9)
    point = measure(target, results, started, args.duration, warmup, concurrency, args.time_scale)
    point = replace(point, loadgen_cpu=busy)
    measured = [r for r in results if r.ok and r.start >= started + warmup]
    run = LevelRun(target, concurrency, len(measured), results, measured, started + warmup)
    return point, run


async def engine_facts(
    spec: str, urls: dict[str, str], before: EngineSample | None
) -> tuple[float, dict[str, int | None]]:
    """What ``spec-router calibrate`` reads from the engines themselves, read the same way: the
    speculative engine's acceptance length over the runs since ``before`` (its metrics then),
    and each engine's cap on running requests. (A table whose acceptance length is not the
    engine's says its iterations are that many times shorter than they are, and the router's
    model of the pool goes wrong the moment it reads the real one from the engine.)"""
    async with httpx.AsyncClient() as client:
        after = await scrape(client, spec)
        tau, _ = await acceptance(client, spec, before, after)
        caps = {pool: await discover_cap(client, url, {}) for pool, url in urls.items()}
    return tau, caps


async def scrape_metrics(url: str) -> EngineSample | None:
    async with httpx.AsyncClient() as client:
        return await scrape(client, url)


def calibrated_table(
    runs: dict[str, list[LevelRun]],
    args: argparse.Namespace,
    tau: float,
    caps: dict[str, int | None] | None = None,
) -> Table:
    """What `spec-router calibrate` would write, from the pool-alone runs the demo made anyway."""
    points = {
        pool: [point_from_run(run, args.time_scale) for run in pool_runs]
        for pool, pool_runs in runs.items()
    }
    return build_table(
        points["speculative"],
        points["baseline"],
        objective="tpot",
        workload=Workload(args.prompt_tokens, args.output_tokens),
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        spec_tau=tau,
        notes="measured by spec-router demo against its simulated engines",
        time_scale=args.time_scale,
        caps=caps,
    )


# -- output -------------------------------------------------------------------------------------


def calibrate_router(
    router: str,
    token: str,
    pools: dict[str, str],
    levels: Sequence[int],
    args: argparse.Namespace,
    adapt: bool = False,
) -> list[Point] | None:
    """Each pool alone at every level, as ``spec-router calibrate`` would measure it; the table
    built from that loaded into ``router`` (``PUT /router/table``, with the admin ``token``).
    Returns each pool's point at each level; or, when the sims fell behind their model
    (``shortfalls``) and ``adapt`` says to start again slower, None and no table."""
    points: list[Point] = []
    runs: dict[str, list[LevelRun]] = {pool: [] for pool in pools}
    spec = pools["speculative"]
    before = asyncio.run(scrape_metrics(spec))
    for n in levels:
        for pool, url in pools.items():
            point, run = asyncio.run(run_target(url, pool, n, args))
            points.append(point)
            runs[pool].append(run)
        print(f"calibrating: concurrency {n} measured on each pool alone", flush=True)
    behind = shortfalls(points, args.prompt_tokens, args.output_tokens, args.regime)
    busy = saturated(points)
    if behind:
        print(describe_shortfalls(behind, args.time_scale), flush=True)
    if busy:
        print(describe_saturated(busy, args.time_scale), flush=True)
    if behind or busy:
        if adapt:
            return None
        print(
            "warning: the comparisons at those levels are distorted; a slower time scale "
            "(--time-scale) or a quieter machine gives the engines' own figures",
            flush=True,
        )
    tau, caps = asyncio.run(engine_facts(spec, pools, before))
    try:
        table = calibrated_table(runs, args, tau, caps)
    except TableError as exc:
        raise SystemExit(f"spec-router demo: no table from the pool-alone runs: {exc}") from None
    put = httpx.put(
        f"{router}/router/table",
        json=to_json(table),
        headers={"authorization": f"Bearer {token}"},
    )
    put.raise_for_status()
    return points


def shortfalls(
    points: Sequence[Point], prompt_tokens: int, output_tokens: int, regime: str = "eagle3"
) -> list[tuple[str, int, float]]:
    """``(pool, concurrency, share)`` for each pool-alone point that delivered less than
    ``FAITHFUL`` of its sim's model throughput in the same closed loop."""
    behind = []
    for p in points:
        preset = {**PRESET_OF, "speculative": regime}.get(p.target)
        if preset is None:
            continue
        model = closed_loop(PRESETS[preset], p.concurrency, prompt_tokens, output_tokens)
        share = p.total_tps / model.total_tps
        if not share >= FAITHFUL:  # (NaN too: nothing measured)
            behind.append((p.target, p.concurrency, share))
    return behind


def describe_shortfalls(behind: Sequence[tuple[str, int, float]], scale: float) -> str:
    where = ", ".join(f"{pool} at {n} users {share:.0%}" for pool, n, share in behind)
    return (
        f"the sims fell behind their model on this machine at time scale {scale:g} "
        f"(share of the model's throughput: {where})"
    )


def saturated(points: Sequence[Point]) -> list[tuple[str, int, float]]:
    """``(target, concurrency, share of a core)`` for each run through which the load generator
    (this process) was busy for more than ``LOADGEN_LIMIT`` of one core."""
    return [
        (p.target, p.concurrency, p.loadgen_cpu) for p in points if p.loadgen_cpu > LOADGEN_LIMIT
    ]


def describe_saturated(busy: Sequence[tuple[str, int, float]], scale: float) -> str:
    where = ", ".join(f"{target} at {n} users {cpu:.0%}" for target, n, cpu in busy)
    return (
        f"the load generator (this process) could not keep up on this machine at time scale "
        f"{scale:g} (share of one core it used: {where})"
    )


def format_level(points: Sequence[Point], policy: str) -> str:
    by = {p.target: p for p in points}
    n = points[0].concurrency
    lines = [f"concurrency {n}"]
    width = max(len(TARGET_TITLES[t].format(policy=policy)) for t in TARGETS)
    for target in TARGETS:
        p = by[target]
        share = "" if p.spec_share is None else f"  to speculative {p.spec_share:5.0%}"
        errors = f"  errors {p.errors}" if p.errors else ""
        title = TARGET_TITLES[target].format(policy=policy)
        lines.append(
            f"  {title:<{width}} {p.per_request_tps:6.1f} tok/s per request"
            f"  {p.total_tps:7.1f} tok/s total  TTFT p50 {p.ttft_p50 * 1000:7.0f} ms"
            f"  within SLO {p.strict:4.0%} / {p.relaxed:4.0%}{share}{errors}"
        )
    return "\n".join(lines)


def plot(points: Sequence[Point], path: Path, policy: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for target in TARGETS:
        pts = sorted((p for p in points if p.target == target), key=lambda p: p.concurrency)
        label = TARGET_TITLES[target].format(policy=policy)
        ax.plot([p.concurrency for p in pts], [p.per_request_tps for p in pts], "o-", label=label)
        ax2.plot([p.concurrency for p in pts], [p.total_tps for p in pts], "o-", label=label)
    for a, title in ((ax, "per-request decode speed"), (ax2, "total output speed")):
        a.set_xscale("log", base=2)
        a.set_xlabel("concurrent requests")
        a.set_ylabel("tok/s (model time)")
        a.set_title(title)
        a.grid(True, alpha=0.3)
    ax.legend()
    fig.suptitle("spec-router demo on simulated EAGLE-3 and baseline engines")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- holding the stack up -----------------------------------------------------------------------


def hold_levels(levels: Sequence[int]) -> list[int]:
    """One ramp for the hold: up through ``levels`` and back down (without repeating the ends)."""
    up = sorted(set(levels))
    return up + up[-2:0:-1]


def hold(url: str, seconds: float, args: argparse.Namespace, levels: Sequence[int]) -> None:
    """Keep the stack up for ``seconds``, ramping closed-loop load through the router."""
    if seconds <= 0:
        return
    cycle = hold_levels(levels)
    print(
        f"\nholding for {seconds:.0f} s: ramping {' -> '.join(map(str, cycle))} concurrent "
        f"requests through the router, {args.hold_step:g} s each; watch {url}/router/ui "
        "(Ctrl-C stops)",
        flush=True,
    )
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            for n in cycle:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                asyncio.run(
                    run_closed_loop(
                        f"{url}/v1",
                        concurrency=n,
                        prompt_tokens=args.prompt_tokens,
                        output_tokens=args.output_tokens,
                        duration=min(args.hold_step, left),
                        output_jitter=0.5,
                    )
                )
    except KeyboardInterrupt:
        print("stopped holding", flush=True)


# -- entry --------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="spec-router demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrency levels")
    parser.add_argument(
        "--regime",
        choices=REGIMES,
        default=PRESET_OF["speculative"],
        help="the speculative sim's preset, paired with the baseline (docs/regimes.md)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help=f"sims' time scale (default {DEFAULT_TIME_SCALE:g}, i.e. 10x; doubled, up to "
        f"{MAX_TIME_SCALE:g}, while this machine cannot keep the sims to their model or the "
        "load generator keep up)",
    )
    parser.add_argument(
        "--duration", type=float, default=2.2, help="seconds of load per target and level"
    )
    parser.add_argument("--output-tokens", type=int, default=96)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--policy", default=None, help="the router's policy (default: its default)")
    parser.add_argument("--plot", type=Path, default=Path("out/demo.png"), help="PNG to write")
    parser.add_argument(
        "--hold",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="afterwards, keep the sims and routers up this long, ramping load through the "
        "router, to watch its live page (default 0: stop at once)",
    )
    parser.add_argument(
        "--hold-step", type=float, default=4.0, help="seconds per concurrency level while holding"
    )
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    adapt = args.time_scale is None
    args.time_scale = args.time_scale or DEFAULT_TIME_SCALE
    began = time.monotonic()
    while not run_demo(args, levels, adapt=adapt and args.time_scale * 2 <= MAX_TIME_SCALE):
        args.time_scale *= 2
        args.duration *= 2  # the same model time per level, or it measures the ramp-up
        print(
            f"starting again at time scale {args.time_scale:g}, {args.duration:g} s per level\n",
            flush=True,
        )
    print(f"finished in {time.monotonic() - began:.0f} s")
    return 0


def run_demo(args: argparse.Namespace, levels: list[int], adapt: bool) -> bool:
    """One demo at ``args.time_scale``; False when it stopped after the pool-alone runs because
    the sims fell behind their model and ``adapt`` says to start again slower."""
    scale = args.time_scale
    sim = ["-m", "router.sim", "--port", "0", "--time-scale", str(scale)]
    token = secrets.token_hex(8)
    with ExitStack() as stack:
        spec_sim = [*sim, "--preset", args.regime, "--seed", "1"]
        spec = stack.enter_context(running(spec_sim)).url
        base_sim = [*sim, "--preset", PRESET_OF["baseline"], "--seed", "2"]
        base = stack.enter_context(running(base_sim)).url
        serve = ["-m", "router", "serve", "--port", "0"]
        router = stack.enter_context(
            running(serve, router_env(spec, base, args.policy, token, args.time_scale))
        ).url
        rr = stack.enter_context(
            running(serve, router_env(spec, base, "round_robin", time_scale=args.time_scale))
        ).url
        for url in (router, rr):
            wait_ready(url)
        urls = {"router": router, "round_robin": rr, "speculative": spec, "baseline": base}
        print(
            f"spec-router demo: {args.regime} sim {spec}, baseline sim {base}, router {router}, "
            f"round-robin router {rr}; time scale {scale} (numbers below are in model time)"
        )
        print(f"live page: {router}/router/ui (open it to watch the router decide)\n", flush=True)
        # 1. Each pool alone at every level: the comparison curves, and a calibration.
        pools = {"speculative": spec, "baseline": base}
        calibrated = calibrate_router(router, token, pools, levels, args, adapt)
        if calibrated is None:
            return False
        points = calibrated
        status = httpx.get(f"{router}/router/status").json()
        none = status.get("no_crossover")
        crossover = none["message"] if none else f"crossover {status['crossover']}"
        label = f"{status['policy']}, {crossover}"
        print(f"table loaded into the router (PUT /router/table): {label}\n", flush=True)
        # 2. The same load through the router and through round-robin.
        for n in levels:
            for target in ("router", "round_robin"):
                points.append(asyncio.run(run_target(urls[target], target, n, args))[0])
            level = [p for p in points if p.concurrency == n]
            print(format_level(level, label), flush=True)
            busy = saturated([p for p in level if p.target in ("router", "round_robin")])
            if busy:
                print(f"  warning: {describe_saturated(busy, args.time_scale)}: these rows "
                      "describe this machine as much as the engines", flush=True)  # fmt: skip
        plot(points, args.plot, label)
        print(f"\nplot written to {args.plot}", flush=True)
        hold(router, args.hold, args, levels)
        if not args.hold:
            print(
                "(--hold SECONDS, or make demo HOLD=SECONDS, keeps it all up to watch "
                "the live page)"
            )
    return True
