"""The router on a real speculative engine: llama.cpp's llama-server on CPU, one core each.

1. ``spec-router calibrate --interleave`` against both servers: the curves and the crossover.
2. A load ramp through two routers in one run, step by step in turn: the default policy on the
   calibrated table, and round-robin (what a generic balancer does). Per step: per-request
   decode tok/s (median), total tok/s, and the share that went to the speculative server.
3. The acceptance length the router read from llama.cpp's counters during the ramp, against
   the engine's own counters over the whole ramp.

    eval "$(scripts/real-engine/build.sh)"; export SPEC_ROUTER_LLAMA_SERVER SPEC_ROUTER_REAL_MODELS
    python bench/real_engine.py [--levels 1,2,4,8,16] [--steps 1,2,4,8,16,24]

Writes bench/results/real-engine.md (+ real-engine-table.json, real-engine.png, .json).
Absolute speeds on a shared VM vary up to 2x between runs: compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from router.calibrate.levels import point_from_run  # noqa: E402
from router.calibrate.loadgen import FastClient, percentile  # noqa: E402
from router.calibrate.progress import Progress  # noqa: E402
from router.calibrate.sweep import run_level  # noqa: E402
from router.calibrate.workload import RequestSource  # noqa: E402
from router.decide.table import Table, from_json  # noqa: E402
from router.health import engines as engine_metrics  # noqa: E402
from router.tools.demo import wait_ready  # noqa: E402
from router.tools.llamacpp import DRAFT_MAX, MODEL, SLOTS, Build, LlamaServer, cores  # noqa: E402
from router.tools.processes import Proc, spawn  # noqa: E402

RESULTS = ROOT / "bench" / "results"
PROMPT, OUTPUT = 40, 64
SLO = {"SPEC_ROUTER_SLO_TTFT_MS": "3000", "SPEC_ROUTER_SLO_TPOT_MS": "100"}


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def calibrate(spec: str, base: str, levels: str, out: Path, plot: Path) -> tuple[Table, str]:
    cmd = [
        sys.executable, "-m", "router", "calibrate", "--speculative", spec, "--baseline", base,
        "--concurrency", levels, "--prompt-tokens", str(PROMPT), "--output-tokens", str(OUTPUT),
        "--requests-per-level", "16", "--interleave", "--out", str(out), "--plot", str(plot),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    sys.stderr.write(done.stderr)
    return from_json(json.loads(out.read_text())), done.stdout


def start_router(spec: str, base: str, **settings: str) -> Proc:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_ROUTER_")}
    env.update(
        {
            "SPEC_ROUTER_SPECULATIVE_URLS": spec,
            "SPEC_ROUTER_BASELINE_URLS": base,
            "SPEC_ROUTER_HEALTH_INTERVAL": "0.5",
            "SPEC_ROUTER_LOG_LEVEL": "warning",
            **SLO,
            **{f"SPEC_ROUTER_{k.upper()}": v for k, v in settings.items()},
        }
    )
    proc = spawn(["-m", "router", "serve", "--port", "0"], env=env)
    wait_ready(proc.url)
    return proc


async def watch(url: str, seen: list[dict[str, Any]], stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=5) as client:
        while not stop.is_set():
            doc = (await client.get(url + "/router/status")).json()
            engine = doc["pools"]["speculative"]["backends"][0]["engine"] or {}
            seen.append(
                {
                    "t": time.monotonic(),
                    "engine_accept": engine.get("spec_accept_length"),
                    "learned_accept": doc["learning"]["acceptance_length"],
                    "spec_running": engine.get("running"),
                    "crossover": doc["crossover"],
                }
            )
            await asyncio.sleep(1.0)


async def ramp(routers: dict[str, str], steps: list[int]) -> dict[str, list[dict[str, Any]]]:
    """At each step, a closed loop through each router in turn, measured as calibration
    measures a level: warm-up, then max(8, 2 N) measured requests at N in flight."""
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in routers}
    limits = httpx.Limits(max_connections=max(steps) + 8, max_keepalive_connections=max(steps))
    timeout = httpx.Timeout(connect=30.0, read=None, write=60.0, pool=None)
    quiet = Progress(sys.stderr, 1, tty=False)
    async with (
        httpx.AsyncClient(limits=limits, timeout=timeout) as client,
        FastClient(max(steps) + 8) as streams,
    ):
        for c in steps:
            for name, url in routers.items():  # in turn: both see the same machine
                source = RequestSource(
                    prompt_tokens=PROMPT, output_tokens=OUTPUT, model=MODEL, ignore_eos=True
                )
                run = await run_level(
                    client, streams, url, source, name, c, max(8, 2 * c), timeout=900,
                    headers={}, progress=quiet,
                )  # fmt: skip
                point = point_from_run(run)
                done = [r for r in run.measured if r.ok]
                stats = {
                    "concurrency": c,
                    "decode_p50": point.decode_tps_p50,
                    "total_tps": point.total_tps,
                    "speculative_share": sum(r.pool == "speculative" for r in done) / len(done),
                    "requests": len(done),
                    "errors": len(run.failures()),
                }
                out[name].append(stats)
                print(
                    f"  c={c:<3} {name:<12} decode p50 {stats['decode_p50']:6.1f} tok/s  total "
                    f"{stats['total_tps']:6.1f} tok/s  speculative "
                    f"{stats['speculative_share']:4.0%}  n={stats['requests']}  "
                    f"({run.seconds:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
                await wait_idle(url)
    return out


async def wait_idle(url: str) -> None:
    async with httpx.AsyncClient(timeout=5) as client:
        for _ in range(200):
            doc = (await client.get(url + "/router/status")).json()
            if doc["in_flight"]["total"] == 0:
                return
            await asyncio.sleep(0.1)


def counters(url: str) -> engine_metrics.EngineSample:
    return engine_metrics.parse(httpx.get(url + "/metrics", timeout=10).text)


def fmt(x: float, spec: str = ".1f") -> str:
    return "—" if x != x else format(x, spec)


def report(
    table: Table,
    calibrate_out: str,
    runs: dict[str, list[dict[str, Any]]],
    seen: list[dict[str, Any]],
    engine_accept: float | None,
    meta: dict[str, Any],
) -> str:
    spec = {p.concurrency: p for p in table.speculative.points}
    base = {p.concurrency: p for p in table.baseline.points}
    lines = [
        "# spec-router on a real speculative engine: llama.cpp on CPU",
        "",
        f"Run {meta['date']} on {meta['machine']}; {meta['cores']} cores, load average "
        f"{meta['load_before']} before, {meta['load_after']} after (other work shares this "
        "machine: compare within this run, not with other runs).",
        "",
        "Engines: llama.cpp `llama-server` (commit 0c1e570, from the llama-cpp-python 0.3.36 "
        "sdist, built by `scripts/real-engine/build.sh`), one thread on a core of its own, "
        f"{SLOTS} slots; a random-weight 10-layer F32 target and its 1-layer q8_0 draft "
        f"(`scripts/real-engine/mkmodel.py`); the speculative one with `--spec-type draft-simple "
        f"--spec-draft-n-max {DRAFT_MAX}`. Requests: chat, {PROMPT}-word prompts (~60 tokens), "
        f"{OUTPUT} output tokens (`ignore_eos`), temperature 0.",
        "",
        f"Command: `{meta['command']}` ({meta['seconds']:.0f} s in all).",
        "",
        "## 1. Calibration (`spec-router calibrate --interleave`)",
        "",
        "```",
        f"spec-router calibrate --speculative SPEC --baseline BASE --concurrency {meta['levels']} "
        f"--prompt-tokens {PROMPT} --output-tokens {OUTPUT} --requests-per-level 16 --interleave",
        "```",
        "",
        "| concurrency | decode tok/s per request, speculative | baseline | ratio | total tok/s, "
        "speculative | baseline | ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in sorted(spec):
        s, b = spec[c], base[c]
        lines.append(
            f"| {c} | {s.decode_tps_p50:.1f} | {b.decode_tps_p50:.1f} | "
            f"{s.decode_tps_p50 / b.decode_tps_p50:.2f} | {s.total_tps:.1f} | {b.total_tps:.1f} | "
            f"{s.total_tps / b.total_tps:.2f} |"
        )
    fit = table.speculative.fit
    tau = f"{fit.tau:.2f}" if fit else "—"
    lines += [
        "",
        f"Crossover: **{table.crossover}** (objective `tpot`: from {table.crossover} concurrent "
        "requests on, the baseline is at least as fast per request); speculative fit at "
        f"acceptance length {tau}, read from llama.cpp's `spec_decode` counters over the sweep. "
        "Plot: `real-engine.png`; table: `real-engine-table.json`.",
        "",
        "## 2. Load ramp through the router, against round-robin",
        "",
        "At each step a closed loop of N clients through each router in turn, measured as "
        "calibration measures a level (each client's first request is warm-up; then max(8, 2 N)"
        " measured requests, fillers keeping N in flight until the last ends): per-request "
        "decode tok/s p50, total tok/s, the share of measured requests served by the "
        "speculative server. "
        f"`{meta['policy']}` is the default policy on the table above with an SLO for these "
        "engines (TTFT 3 s, TPOT 100 ms; `SPEC_ROUTER_SLO_TTFT_MS`, `SPEC_ROUTER_SLO_TPOT_MS`).",
        "",
        "| concurrency | decode p50 per request, default | round-robin | total tok/s, default | "
        "round-robin | to speculative, default | round-robin |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for d, r in zip(runs["default"], runs["round_robin"], strict=True):
        lines.append(
            f"| {d['concurrency']} | {fmt(d['decode_p50'])} | {fmt(r['decode_p50'])} | "
            f"{fmt(d['total_tps'])} | {fmt(r['total_tps'])} | {d['speculative_share']:.0%} | "
            f"{r['speculative_share']:.0%} |"
        )
    errors = sum(s["errors"] for rs in runs.values() for s in rs)
    lines += ["", f"Errors in the ramp: {errors}."]
    readings = [s["engine_accept"] for s in seen if s["engine_accept"]]
    learned = [s["learned_accept"] for s in seen if s["learned_accept"]]
    lines += [
        "",
        "## 3. The acceptance length the router read",
        "",
        "The default router's `/router/status` once a second during its ramp steps: "
        f"`engine.spec_accept_length` (1 + accepted / drafts between two scrapes) ranged "
        f"{min(readings):.2f}–{max(readings):.2f}, median {percentile(readings, 50):.2f} "
        f"({len(readings)} readings); the learner's acceptance length ended at "
        f"{learned[-1]:.2f}."
        if readings and learned
        else "No acceptance readings.",
        f"llama.cpp's own counters over the whole ramp: 1 + accepted / drafts = "
        f"{engine_accept:.2f} (at most {1 + DRAFT_MAX})."
        if engine_accept
        else "",
        "",
        "## Calibration output",
        "",
        "```",
        calibrate_out.strip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--levels", default="1,2,4,8,16")
    parser.add_argument("--steps", default="1,2,4,8,16,24")
    args = parser.parse_args()
    began = time.monotonic()
    load_before = load_average()
    build = Build.from_env()
    spec_core, base_core = cores()
    logs = Path(tempfile.mkdtemp(prefix="real-engine-"))
    spec = LlamaServer(build, True, spec_core, logs)
    base = LlamaServer(build, False, base_core, logs)
    routers: list[Proc] = []
    try:
        spec.start()
        base.start()
        table_path = RESULTS / "real-engine-table.json"
        table, calibrate_out = calibrate(
            spec.url, base.url, args.levels, table_path, RESULTS / "real-engine.png"
        )
        learned = logs / "table.json"
        learned.write_text(table_path.read_text())
        default = start_router(spec.url, base.url, TABLE_PATH=str(learned))
        rr = start_router(spec.url, base.url, POLICY="round_robin")
        routers += [default, rr]
        policy = httpx.get(default.url + "/router/status").json()["policy"]
        before = counters(spec.url)
        seen: list[dict[str, Any]] = []

        async def measure() -> dict[str, list[dict[str, Any]]]:
            stop = asyncio.Event()
            watcher = asyncio.create_task(watch(default.url, seen, stop))
            try:
                steps = [int(x) for x in args.steps.split(",")]
                return await ramp({"default": default.url, "round_robin": rr.url}, steps)
            finally:
                stop.set()
                await watcher

        runs = asyncio.run(measure())
        accept = engine_metrics.interval_accept_length(before, counters(spec.url))
    finally:
        for proc in routers:
            proc.stop()
        spec.stop()
        base.stop()
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "load_before": load_before,
        "load_after": load_average(),
        "command": "python bench/real_engine.py " + " ".join(sys.argv[1:]),
        "seconds": time.monotonic() - began,
        "levels": args.levels,
        "policy": policy,
    }
    text = report(table, calibrate_out, runs, seen, accept, meta)
    (RESULTS / "real-engine.md").write_text(text)
    (RESULTS / "real-engine.json").write_text(
        json.dumps({"meta": meta, "ramp": runs, "status": seen, "engine_accept": accept}, indent=1)
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
