"""Policies against the best static split, over real HTTP, in one run.

Two simulated engines (eagle3 and baseline presets, time-scaled; ``--regime`` picks another
speculative preset, docs/regimes.md) are calibrated with
``spec-router calibrate``; one router per policy (spillover, crossover, round_robin, predictive)
is started with that table (learning and exploration off, so every policy sees the same curves).
At each N, N closed-loop users go through each router, and N users are also split statically
between the two engines directly (k on speculative, N - k on baseline, for the k the model calls
best and its neighbours). The figure of merit is the mean per-request decode speed (decode tokens
/ decode time over all users in a steady window; = total decode tok/s / N), in model time.

    python bench/policies.py [--time-scale 0.2] [--duration 12] [--levels 1,2,4,8,16,32,64]

Routers on core 0; sims, load generator and calibrator on core 1 (``taskset``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from router.calibrate.loadgen import run_closed_loop, window_stats  # noqa: E402
from router.settings import sim_time_env  # noqa: E402
from router.sim.model import (  # noqa: E402
    BASELINE,
    EAGLE3,
    PRESETS,
    REGIMES,
    Preset,
    closed_loop,
    decode_bound_tps,
)
from router.tools.demo import wait_ready  # noqa: E402
from router.tools.processes import pinned, running  # noqa: E402

POLICIES = ("spillover", "crossover", "round_robin", "predictive", "slo")
RESULTS = ROOT / "bench" / "results"


SERVE = ["-m", "router", "serve", "--port", "0"]


def model_split(n: int, prompt: int, output: int, spec: Preset = EAGLE3) -> tuple[int, float]:
    """The best static split of ``n`` users by the analytic closed-loop model."""
    best = (0, 0.0)
    for k in range(n + 1):
        total = 0.0
        if k:
            total += k * closed_loop(spec, k, prompt, output).per_request_tps
        if n - k:
            total += (n - k) * closed_loop(BASELINE, n - k, prompt, output).per_request_tps
        if total / n > best[1]:
            best = (k, total / n)
    return best


def decode_only_split(n: int, spec: Preset = EAGLE3) -> float:
    """The issue's decode-only reference: best split by the pure step-time formula."""
    best = 0.0
    for k in range(n + 1):
        total = (decode_bound_tps(spec, k)[1] if k else 0.0) + (
            decode_bound_tps(BASELINE, n - k)[1] if n - k else 0.0
        )
        best = max(best, total / n)
    return best


@dataclass
class Args:
    time_scale: float
    duration: float
    levels: list[int]
    prompt: int
    output: int


async def users(url: str, n: int, a: Args) -> tuple[float, float, float]:
    """Run ``n`` users for the duration; return (start, end, per-request tok/s in model time)."""
    started = time.monotonic()
    results = await run_closed_loop(
        f"{url}/v1",
        concurrency=n,
        prompt_tokens=a.prompt,
        output_tokens=a.output,
        duration=a.duration,
    )
    w = window_stats(results, started + a.duration * 0.3, started + a.duration)
    return w.start, w.end, w.per_request_tps * a.time_scale


async def static_split(spec: str, base: str, k: int, n: int, a: Args) -> float:
    """k users straight to the speculative engine, n - k to the baseline, at the same time."""
    started = time.monotonic()
    runs = []
    if k:
        runs.append(
            run_closed_loop(
                f"{spec}/v1",
                concurrency=k,
                prompt_tokens=a.prompt,
                output_tokens=a.output,
                duration=a.duration,
            )
        )
    if n - k:
        runs.append(
            run_closed_loop(
                f"{base}/v1",
                concurrency=n - k,
                prompt_tokens=a.prompt,
                output_tokens=a.output,
                duration=a.duration,
            )
        )
    results = [r for batch in await asyncio.gather(*runs) for r in batch]
    w = window_stats(results, started + a.duration * 0.3, started + a.duration)
    return w.per_request_tps * a.time_scale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-scale", type=float, default=0.1)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--levels", default="1,2,4,8,16,32,64")
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--output-tokens", type=int, default=256)
    parser.add_argument("--out", type=Path, default=RESULTS / "policies.md")
    parser.add_argument(
        "--regime",
        choices=REGIMES,
        default="eagle3",
        help="the speculative sim's preset, paired with the baseline",
    )
    parser.add_argument(
        "--learn", action="store_true", help="leave online learning and exploration on"
    )
    ns = parser.parse_args()
    a = Args(
        ns.time_scale,
        ns.duration,
        [int(x) for x in ns.levels.split(",")],
        ns.prompt_tokens,
        ns.output_tokens,
    )
    began = time.monotonic()
    scale = str(a.time_scale)

    scaled = ["--time-scale", str(a.time_scale)]

    def sim_cmd(preset: str, seed: str) -> list[str]:
        return ["-m", "router.sim", "--port", "0", "--preset", preset, "--seed", seed, *scaled]

    rows = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        spec = stack.enter_context(running(sim_cmd(ns.regime, "1"), prefix=pinned(1))).url
        base = stack.enter_context(running(sim_cmd("baseline", "2"), prefix=pinned(1))).url
        table = Path(tmp) / "table.json"
        calibrate = [
            *pinned(1), sys.executable, "-m", "router", "calibrate",
            "--speculative", spec, "--baseline", base, "--concurrency", "1,2,4,8,16,32,64",
            "--prompt-tokens", str(a.prompt), "--output-tokens", str(a.output),
            "--time-scale", scale, "--out", str(table),
        ]  # fmt: skip
        print("calibrating:", " ".join(calibrate[len(pinned(1)) :]), flush=True)
        subprocess.run(calibrate, check=True)
        crossover = json.loads(table.read_text())["crossover"]
        routers = {}
        for policy in POLICIES:
            env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_ROUTER_")} | {
                "SPEC_ROUTER_SPECULATIVE_URLS": spec,
                "SPEC_ROUTER_BASELINE_URLS": base,
                "SPEC_ROUTER_POLICY": policy,
                "SPEC_ROUTER_TABLE_PATH": str(Path(tmp) / f"{policy}.json"),
                "SPEC_ROUTER_LEARN": "true" if ns.learn else "false",
                "SPEC_ROUTER_EXPLORE_SHARE": "0.02" if ns.learn else "0",
                "SPEC_ROUTER_HYSTERESIS": "0",
                "SPEC_ROUTER_LOG_LEVEL": "warning",
                # serve's default SLO and engine lags in the wall-clock time of these sims
                **sim_time_env(a.time_scale),
            }
            (Path(tmp) / f"{policy}.json").write_text(table.read_text())
            routers[policy] = stack.enter_context(running(SERVE, env, prefix=pinned(0))).url
            wait_ready(routers[policy])
        for n in a.levels:
            row: dict[str, object] = {"n": n}
            for policy in POLICIES:
                row[policy] = asyncio.run(users(routers[policy], n, a))[2]
            k_model, model_best = model_split(n, a.prompt, a.output, PRESETS[ns.regime])
            splits = {}
            for k in sorted({max(0, k_model - 1), k_model, min(n, k_model + 1)}):
                splits[k] = asyncio.run(static_split(spec, base, k, n, a))
            k_best = max(splits, key=lambda k: splits[k])
            row.update(
                k_model=k_model, model_best=model_best,
                decode_only=decode_only_split(n, PRESETS[ns.regime]),
                splits=splits, k_best=k_best, best=splits[k_best],
            )  # fmt: skip
            rows.append(row)
            print(format_row(row), flush=True)
    elapsed = time.monotonic() - began
    write(ns.out, rows, a, crossover, elapsed, " ".join(sys.argv), ns.learn, ns.regime)
    return 0


def _f(value: object) -> float:
    assert isinstance(value, int | float)
    return float(value)


def format_row(row: dict[str, object]) -> str:
    best = _f(row["best"])
    parts = [f"N={row['n']:>2}", f"best static {best:6.1f} (k={row['k_best']})"]
    parts += [f"{p} {_f(row[p]):6.1f} ({_f(row[p]) / best:5.1%})" for p in POLICIES]
    return "  ".join(parts)


def write(
    path: Path,
    rows: list[dict[str, object]],
    a: Args,
    crossover: int | None,
    elapsed: float,
    command: str,
    learn: bool = False,
    regime: str = "eagle3",
) -> None:
    machine = platform.processor() or platform.machine()
    shown = "none measured" if crossover is None else crossover
    lines = [
        "# Policies against the best static split",
        "",
        f"Command: `{command}` (from the repository root with `.venv/bin/python`; "
        f"took {elapsed:.0f} s).",
        f"Machine: {os.cpu_count()} cores, {machine}, Python {platform.python_version()}.",
        "",
        f"Regime: {regime} + baseline. Workload: closed loop, {a.prompt}-token prompts, "
        f"{a.output}-token outputs; sims at time scale {a.time_scale} (numbers converted to "
        f"model time). {a.duration:g} s per measurement, the first 30% discarded. Routers "
        "pinned to core 0; sims, load generator and calibrator on core 1. Every router uses "
        f"the same calibrated table (crossover {shown}); learning and exploration "
        f"{'on' if learn else 'off'}.",
        "",
        "Figure of merit: mean per-request decode speed, tok/s (decode tokens / decode time "
        "over all users in the window, i.e. total decode tok/s / N). *Best static* is the best "
        "of the measured static splits (k users straight to the speculative engine, N - k to "
        "the baseline, for the model's best k and its neighbours); *model* is the analytic "
        "closed-loop best for this workload; *decode-only* is the issue's reference (no "
        "prefill, no re-join gap).",
        "",
        "| N | decode-only | model best (k) | best static measured (k) | "
        + " | ".join(POLICIES)
        + " |",
        "|---|---|---|---|" + "---|" * len(POLICIES),
    ]
    for row in rows:
        best = _f(row["best"])
        cells = [f"{_f(row[p]):.1f} ({_f(row[p]) / best:.1%})" for p in POLICIES]
        lines.append(
            f"| {row['n']} | {_f(row['decode_only']):.1f} "
            f"| {_f(row['model_best']):.1f} ({row['k_model']}) "
            f"| {best:.1f} ({row['k_best']}) | " + " | ".join(cells) + " |"
        )
    lines += ["", "Measured static splits (k: tok/s):", ""]
    for row in rows:
        splits = row["splits"]
        assert isinstance(splits, dict)
        lines.append(f"- N={row['n']}: " + ", ".join(f"k={k}: {v:.1f}" for k, v in splits.items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"written {path}")


if __name__ == "__main__":
    raise SystemExit(main())
