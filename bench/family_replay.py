"""Spot-check the lab's policy family over sockets: a drawn workload replayed with `spec-router
replay` through `spec-router serve` and simulated engines (issue 36, item 2).

For each ``--seeds`` workload (``bench/policy_family.py``'s ``draw``), its arrivals (the same
times, lengths and temperatures the lab sends) are written as a Mooncake-style JSONL trace and,
for every policy in ``--policies``, fresh sims of the workload's layout (its regime's preset in
the speculative pool, the baseline preset in the other, one or two engines each) and a fresh
router (the regime's calibrated table, the default settings but the policy) are started;
``spec-router replay`` sends the trace open-loop, scored as the lab scores it (strict and
relaxed goodput of the arrivals after the first 10 s). The lab's numbers for the same cells
(from the family's cache, ``--cache``) are printed next to them.

    python bench/family_replay.py --seeds 206,51,166 --out bench/results/family-replay.md

Routers on core 0; sims and the replay on core 1, as ``bench/traffic.py`` runs them. Timing
over sockets: run under ``flock -x``. Appends one JSON line per run to ``--runs``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import policy_family as family  # noqa: E402
import traffic as bench_traffic  # noqa: E402
from lab_sim import TABLES  # noqa: E402
from policy_lab import DRAIN, WARMUP  # noqa: E402

from router.tools import goodput  # noqa: E402
from router.tools.demo import wait_ready  # noqa: E402
from router.tools.processes import running  # noqa: E402
from router.tools.replay_report import read_json  # noqa: E402

RESULTS = ROOT / "bench" / "results"
POLICIES = ("slo", *family.SIMPLE)


def write_trace(w: family.Workload, path: Path) -> float:
    """The workload's arrivals as JSONL (ms stamps); returns the first arrival's time (the
    replay counts from it)."""
    arrivals = family.arrivals(w)
    with path.open("w") as f:
        for a in arrivals:
            row = {"timestamp": a.at * 1000, "input_length": a.prompt_tokens,
                   "output_length": a.output_tokens}  # fmt: skip
            f.write(json.dumps(row) + "\n")
    return arrivals[0].at


def run_policy(
    w: family.Workload, policy: str, trace: Path, t0: float, ns: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    presets, _ = family.layout(w)
    table = bench_traffic.scaled_table(
        TABLES[w.regime], ns.time_scale, tmp / f"{w.seed}-{policy}.table.json"
    )
    deployment = bench_traffic.Deployment(
        policy, ("", ""), None if policy == family.DEFAULT_POLICY else policy, True, ""
    )
    out = tmp / f"{w.seed}-{policy}.json"
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        urls = bench_traffic.sims(stack, [p.name for p in presets], ns.time_scale)
        half = len(urls) // 2
        pair = (",".join(urls[:half]), ",".join(urls[half:]))
        env = bench_traffic.router_env(deployment, pair, table, ns.time_scale)
        router = stack.enter_context(
            running(
                ["-m", "router", "serve", "--port", "0"], env, prefix=bench_traffic.pinned(0)
            )  # fmt: skip
        )
        wait_ready(router.url)
        cmd = [
            *bench_traffic.pinned(1), sys.executable, "-m", "router", "replay",
            "--url", router.url, "--trace", str(trace), "--seed", str(w.seed),
            "--temperature-share", f"{w.hot:g}", "--warmup", f"{max(0.0, WARMUP - t0):g}",
            "--drain", f"{DRAIN:g}", "--time-scale", f"{ns.time_scale:g}", "--out", str(out),
        ]  # fmt: skip
        done = subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL)
    row: dict[str, Any] = {"seed": w.seed, "policy": policy, "time_scale": ns.time_scale,
                           "seconds": round(time.monotonic() - began, 1)}  # fmt: skip
    if done.returncode != 0:
        return row | {"error": f"replay exited {done.returncode}"}
    _, results = read_json(out)
    s = goodput.summarize(goodput.scored(results, max(0.0, WARMUP - t0)))
    return row | {
        "strict": s.strict,
        "relaxed": s.relaxed,
        "n": s.count,
        "spec_share": s.speculative_share,
        "errors": s.errors,
        "rejections": s.rejections,
    }


def report(rows: list[dict[str, Any]], cache: dict[tuple[int, str, str], dict[str, Any]],
           command: str) -> str:  # fmt: skip
    lines = [
        "# The policy family's worst cells over sockets",
        "",
        "`bench/family_replay.py` (issue 36, item 2): a lab workload (`bench/policy_family.py`,",
        "by seed) replayed with `spec-router replay` through `spec-router serve` and sims over",
        "loopback, each policy on fresh engines and a fresh router. Lab: the family's cache",
        "(`policy-family-runs.jsonl`, the default as `default`). Goodput strict / relaxed, %.",
        "",
        f"    {command}",
        "",
        "| workload | policy | lab strict / relaxed | sockets strict / relaxed | requests |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        w = family.draw(int(r["seed"]))
        lab = cache.get((w.seed, r["policy"], "default" if r["policy"] == "slo" else ""))
        lab_s = "—" if lab is None else f"{lab['strict']:.1%} / {lab['relaxed']:.1%}"
        sock = r.get("error") or f"{r['strict']:.1%} / {r['relaxed']:.1%}"
        lines.append(f"| {w.name} | {r['policy']} | {lab_s} | {sock} | {r.get('n', '—')} |")
    lines += [
        "",
        "The default's gap to the best simple policy on each workload, strict / relaxed points",
        "(negative: behind), in the lab and over sockets:",
        "",
        "| workload | lab | sockets |",
        "|---|---|---|",
    ]
    for seed in dict.fromkeys(int(r["seed"]) for r in rows):
        w = family.draw(seed)
        sock = {r["policy"]: r for r in rows if r["seed"] == seed and "strict" in r}
        lab = {p: cache.get((seed, p, "default" if p == "slo" else "")) for p in POLICIES}
        lines.append(f"| {w.name} | {gaps(lab)} | {gaps(sock)} |")
    return "\n".join(lines) + "\n"


def gaps(by_policy: dict[str, dict[str, Any] | None]) -> str:
    """The default's strict and relaxed goodput minus the best simple policy's, in points."""
    if any(by_policy.get(p) is None for p in POLICIES):
        return "—"
    rows = {p: r for p, r in by_policy.items() if r is not None}
    out = []
    for axis in ("strict", "relaxed"):
        best = max(family.SIMPLE, key=lambda p: float(rows[p][axis]))
        gap = 100 * (float(rows["slo"][axis]) - float(rows[best][axis]))
        out.append(f"{gap:+.1f} ({best})" if gap < 0 else f"{gap:+.1f}")
    return " / ".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="", help="the family's workload seeds, N,N,...")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--time-scale", type=float, default=0.25)
    p.add_argument("--cache", type=Path, default=RESULTS / "policy-family-runs.jsonl")
    p.add_argument("--runs", type=Path, default=RESULTS / "family-replay-runs.jsonl")
    p.add_argument("--out", type=Path, default=RESULTS / "family-replay.md")
    p.add_argument("--command", help="the command line the report names (default: this one)")
    ns = p.parse_args()
    seeds = [int(s) for s in ns.seeds.split(",") if s]
    policies = [x for x in ns.policies.split(",") if x]
    cache = family.load_cache(ns.cache)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for seed in seeds:
            w = family.draw(seed)
            trace = tmp / f"{seed}.jsonl"
            t0 = write_trace(w, trace)
            for policy in policies:
                row = run_policy(w, policy, trace, t0, ns, tmp)
                print(json.dumps(row), flush=True)
                with ns.runs.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    rows = [json.loads(x) for x in ns.runs.read_text().splitlines() if x.strip()]
    command = ns.command or shlex.join(["python", "bench/family_replay.py", *sys.argv[1:]])
    ns.out.write_text(report(rows, cache, command))
    print(f"written {ns.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
