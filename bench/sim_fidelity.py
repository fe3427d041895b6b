"""How faithfully the simulated engines follow their analytic model, over real HTTP.

For each time scale and preset this starts one ``router.sim`` process pinned to CPU 0
(``taskset -c 0``), and from this process (pin it to CPU 1) runs the closed-loop load
generator ``router.loadgen`` at each concurrency. Each point starts with desynchronised first
requests, skips a warm-up and measures a steady window: total tok/s from the chunks that
arrived in it, per-request decode tok/s from each request's chunk spans in it. Both are
compared with ``router.sim.model.closed_loop`` divided by the time scale. Writes a Markdown
report (``--out``) and prints it.

    taskset -c 1 python bench/sim_fidelity.py --out bench/results/sim-fidelity.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from router.loadgen import run_closed_loop, window_stats
from router.serving import LISTENING_PREFIX
from router.sim.model import PRESETS, closed_loop, decode_bound_tps, prefill_time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def start_sim(preset: str, scale: float, seed: int, cpu: int) -> tuple[subprocess.Popen[str], str]:
    cmd = [
        "taskset",
        "-c",
        str(cpu),
        sys.executable,
        "-m",
        "router.sim",
        "--preset",
        preset,
        "--port",
        "0",
        "--time-scale",
        str(scale),
        "--seed",
        str(seed),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(LISTENING_PREFIX):
            return proc, line[len(LISTENING_PREFIX) :].strip()
    raise RuntimeError(f"sim {preset} did not start")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


async def wait_idle(url: str) -> None:
    while (
        get_json(url + "/sim/config")["engine"]["running"]
        or get_json(url + "/sim/config")["engine"]["queued"]
    ):
        await asyncio.sleep(0.05)


@dataclass
class Point:
    scale: float
    preset: str
    concurrency: int
    model_per_request: float
    model_total: float
    per_request: float
    total: float
    requests: int
    tau_realised: float | None
    late_mean_ms: float
    late_max_ms: float
    sim_cpu: float  # fraction of one core over the point
    gen_cpu: float

    @property
    def err_per_request(self) -> float:
        return 100 * (self.per_request / self.model_per_request - 1)

    @property
    def err_total(self) -> float:
        return 100 * (self.total / self.model_total - 1)


def windows(preset: str, n: int, prompt: int, output: int) -> tuple[float, float]:
    """(warm-up, window) in model seconds for one point."""
    p = PRESETS[preset]
    point = closed_loop(p, n, prompt, output)
    request_time = output / point.per_request_tps
    # The first iteration takes everybody's prefill at once; after it, joins are spread
    # (desync). Skip that burst and a quarter of a request's life.
    burst = min(n, p.max_running) * prefill_time(p, prompt) + 2 * point.iteration_time
    warmup = burst + min(0.25 * request_time, 5.0)
    # eagle3's acceptance draws are random: measure longer where few requests run.
    window = 30.0 if (PRESETS[preset].spec_k and n == 1) else 15.0
    return warmup, window


async def measure(
    url: str, pid: int, scale: float, preset: str, n: int, prompt: int, output: int
) -> Point:
    await wait_idle(url)
    warmup, window = (x * scale for x in windows(preset, n, prompt, output))
    before = get_json(url + "/sim/config")["engine"]
    t0 = time.monotonic()
    c0_sim, c0_gen = cpu_seconds(pid), time.process_time()
    results = await run_closed_loop(
        url + "/v1",
        concurrency=n,
        prompt_tokens=prompt,
        output_tokens=output,
        duration=warmup + window,
        desync=True,
    )
    elapsed = time.monotonic() - t0
    sim_cpu, gen_cpu = cpu_seconds(pid) - c0_sim, time.process_time() - c0_gen
    after = get_json(url + "/sim/config")["engine"]
    stats = window_stats(results, t0 + warmup, t0 + warmup + window)
    model = closed_loop(PRESETS[preset], n, prompt, output)
    iters = max(1, after["iterations"] - before["iterations"])
    late_sum = (
        after["late_mean_ms"] * after["iterations"] - before["late_mean_ms"] * before["iterations"]
    )
    steps = after["spec_steps"] - before["spec_steps"]
    return Point(
        scale=scale,
        preset=preset,
        concurrency=n,
        model_per_request=model.per_request_tps / scale,
        model_total=model.total_tps / scale,
        per_request=stats.per_request_tps,
        total=stats.total_tps,
        requests=stats.requests,
        tau_realised=(after["spec_tokens"] - before["spec_tokens"]) / steps if steps else None,
        late_mean_ms=late_sum / iters,
        late_max_ms=after["late_max_ms"],
        sim_cpu=sim_cpu / elapsed,
        gen_cpu=gen_cpu / elapsed,
    )


def report(points: list[Point], args: argparse.Namespace, command: str) -> str:
    e1, e48 = decode_bound_tps(PRESETS["eagle3"], 1), decode_bound_tps(PRESETS["eagle3"], 48)
    lines = [
        "# Simulator fidelity: measured over HTTP vs the analytic model",
        "",
        f"Command (from the repository root, {os.cpu_count()} cores):",
        "",
        "```",
        command,
        "```",
        "",
        f"Workload: closed loop, prompt {args.prompt} tokens, output {args.output} tokens, "
        "temperature 0, streamed chat completions. Sim pinned to CPU 0, load generator to "
        "CPU 1. Rates are as measured at the given time scale (model rate / scale).",
        "",
        "| scale | preset | C | per-request model | measured | err | total model | measured "
        "| err | reqs | tau seen | late mean/max ms | sim CPU | gen CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        tau = f"{p.tau_realised:.3f}" if p.tau_realised else "-"
        lines.append(
            f"| {p.scale:g} | {p.preset} | {p.concurrency} | {p.model_per_request:.2f} | "
            f"{p.per_request:.2f} | {p.err_per_request:+.1f}% | {p.model_total:.1f} | "
            f"{p.total:.1f} | {p.err_total:+.1f}% | {p.requests} | {tau} | "
            f"{p.late_mean_ms:.2f}/{p.late_max_ms:.1f} | {100 * p.sim_cpu:.0f}% | "
            f"{100 * p.gen_cpu:.0f}% |"
        )
    worst = max(max(abs(p.err_per_request), abs(p.err_total)) for p in points)
    lines += [
        "",
        f"Largest deviation: {worst:.1f}%.",
        "",
        f"Decode-bound references (no prefill, no context cost): eagle3 {e1[0]:.1f} tok/s per "
        f"request at C=1, {e48[1]:.1f} tok/s total at its 48-request saturation; baseline "
        f"total tends to 1/b = {1 / PRESETS['baseline'].b:.0f} tok/s as C grows.",
    ]
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace) -> list[Point]:
    points = []
    for scale in args.scales:
        for preset in args.presets:
            proc, url = start_sim(preset, scale, args.seed, args.sim_cpu)
            try:
                for n in args.concurrency:
                    point = await measure(url, proc.pid, scale, preset, n, args.prompt, args.output)
                    print(
                        f"scale {scale:g} {preset:8s} C={n:3d}  per-request "
                        f"{point.per_request:8.2f} ({point.err_per_request:+.1f}%)  total "
                        f"{point.total:8.1f} ({point.err_total:+.1f}%)",
                        file=sys.stderr,
                        flush=True,
                    )
                    points.append(point)
            finally:
                proc.terminate()
                proc.wait(timeout=15)
    return points


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", type=float, nargs="+", default=[1.0, 0.1])
    parser.add_argument("--presets", nargs="+", default=["eagle3", "baseline"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--output", type=int, default=256)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--sim-cpu", type=int, default=0)
    parser.add_argument("--out", help="write the Markdown report here")
    args = parser.parse_args()
    command = "taskset -c 1 python bench/sim_fidelity.py " + " ".join(sys.argv[1:])
    points = asyncio.run(run(args))
    text = report(points, args, command.strip())
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
