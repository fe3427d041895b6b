"""Does an open live page cost the hot path anything? The router with and without its feed read.

Runs bench/overhead.py with the targets ``direct``, ``router`` and ``router_ui`` (the same
router with ``/router/ui/events`` read all along from a thread of this process, as one open tab
would), interleaved rep by rep, and compares ``router_ui`` with ``router`` rep by rep (ratios of
the same rep, so drift cancels; the spread of those ratios is the noise to judge them by). Also
times, in this process, the two pieces of work the page adds: the recent window's ``observe``
(once per finished request, on the hot path) and one snapshot (once a second on the feed's timer,
only while a page is open), with the snapshot's size.

Writes bench/results/ui-overhead.md and ui-overhead.json.

    python bench/ui_overhead.py --reps 3 --duration 3          # a short, indicative run
    python bench/ui_overhead.py --reps 5 --duration 5          # what overhead.py does by default
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path
from typing import Any

from overhead import main as overhead_main

from router.account.outcome import Outcome
from router.app import RouterApp
from router.decide.table import to_json
from router.settings import Settings
from router.upstream.stream import Usage

HERE = Path(__file__).resolve().parent
SCENARIOS = {
    "c1": "non-streaming, concurrency 1",
    "stream": "256 concurrent streams",
    "c64": "non-streaming, 64 connections (wrk)",
}
METRICS = [
    ("rps", "req/s", 0),
    ("p50_ms", "p50 ms", 3),
    ("p99_ms", "p99 ms", 3),
    ("ttfc_p99_ms", "TTFC p99 ms", 2),
    ("cpu_target", "router CPU (cores)", 2),
    ("other_load", "other processes' CPU during the run (cores)", 2),
]


def costs() -> dict[str, Any]:
    """Microseconds per ``RecentWindow.observe`` and per snapshot; the snapshot's bytes."""
    sys.path.insert(0, str(HERE.parent))
    from tests.support.tables import model_table

    spec, base = "http://127.0.0.1:9", "http://127.0.0.1:10"
    app = RouterApp(Settings(speculative_urls=[spec], baseline_urls=[base]))
    app.keeper.replace(to_json(model_table(32, 96, time_scale=0.1)))
    out = Outcome(path="/v1/chat/completions", started=1.0)
    out.read(stream=True)
    out.attempt("speculative", spec, "predicted_slo")
    out.answered(200)
    out.first_bytes(1.05, 0.0)
    out.counted(Usage(32, 96))
    out.finish(1.5)
    n = 200_000
    observe = min(timeit.repeat(lambda: app.recent.observe(out), number=n, repeat=5)) / n
    m = 2_000
    snapshot = min(timeit.repeat(app.feed.publish, number=m, repeat=5)) / m
    doc = app.ui_snapshot()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()
    return {
        "commit": commit,
        "observe_us": observe * 1e6,
        "snapshot_us": snapshot * 1e6,
        "snapshot_bytes": len(json.dumps(doc, separators=(",", ":"))),
    }


def compare(
    report: dict[str, Any], scenarios: list[str], quiet: float | None = None
) -> dict[str, Any]:
    """Per scenario and metric: medians, and the median and range of router_ui/router per rep;
    with ``quiet``, only the reps in which both runs had at most that much load from others."""
    by: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in report["runs"]:
        if "failed" not in r:
            by[(r["target"], r["scenario"], r["rep"])] = r

    def calm(scenario: str, rep: int) -> bool:
        runs = [by.get((t, scenario, rep)) for t in ("router", "router_ui")]
        return quiet is None or all(
            r is not None and (r.get("other_load") or 0.0) <= quiet for r in runs
        )

    out: dict[str, Any] = {}
    for scenario in scenarios:
        reps = sorted(
            rep for (t, s, rep) in by if s == scenario and t == "router" and calm(scenario, rep)
        )
        rows: dict[str, Any] = {}
        for key, _, _ in METRICS:
            base = [by[("router", scenario, i)].get(key) for i in reps]
            ui = [by.get(("router_ui", scenario, i), {}).get(key) for i in reps]
            pairs = [
                (u, b) for u, b in zip(ui, base, strict=True) if u is not None and b is not None
            ]
            if not pairs:
                continue
            ratios = [u / b for u, b in pairs if b > 0]
            rows[key] = {
                "router": statistics.median(b for _, b in pairs),
                "router_ui": statistics.median(u for u, _ in pairs),
                "ratio_median": statistics.median(ratios) if ratios else None,
                "ratio_min": min(ratios, default=None),
                "ratio_max": max(ratios, default=None),
                "reps": len(pairs),
            }
        out[scenario] = rows
    return out


QUIET = 0.3  # cores others may have used in both runs of a rep for it to count as quiet


def _table(table: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for scenario, rows in table.items():
        if not rows:
            continue
        reps = max(row["reps"] for row in rows.values())
        lines += [f"**{SCENARIOS[scenario]}** ({reps} reps)", ""]
        lines += ["| metric | router | router_ui | router_ui / router |", "|---|---|---|---|"]
        for key, label, digits in METRICS:
            row = rows.get(key)
            if row is None:
                continue
            ratio = (
                "–"
                if row["ratio_median"] is None or key == "other_load"
                else f"{row['ratio_median']:.3f} ({row['ratio_min']:.3f}-{row['ratio_max']:.3f})"
            )
            lines.append(
                f"| {label} | {row['router']:,.{digits}f} | {row['router_ui']:,.{digits}f} | "
                f"{ratio} |"
            )
        lines.append("")
    return lines


def render(report: dict[str, Any], table: dict[str, Any], cost: dict[str, Any]) -> str:
    cfg = report["config"]
    m = report["machine"]
    lines = [
        "# The live page's cost to the hot path",
        "",
        "Indicative: a short run on a shared, noisy 2-core machine (the lead re-runs it on a "
        "quiet one). `router_ui` is the router with its live page's feed "
        "(`/router/ui/events`) read all along, as one open browser tab would; `router` is the "
        "same router with no page open. Both ran in the same session, rep by rep interleaved, "
        "pinned to the same core (bench/overhead.py). The ratio column is `router_ui / router` "
        "within each rep: its median, and in brackets the lowest and highest rep.",
        "",
        f"    {report['ui_command']}",
        "",
        f"{cfg['reps']} reps x {cfg['duration_s']:g} s per (target, scenario); "
        f"{m['cpu_model']}, {m['nproc']} CPUs, Python {m['python']}, commit {m['commit']}, "
        f"{m['date']}.",
        "",
    ]
    spread = [
        (rows["rps"]["ratio_min"], rows["rps"]["ratio_max"])
        for rows in table.values()
        if rows.get("rps") and rows["rps"]["ratio_min"] is not None
    ]
    if spread:
        lo, hi = min(a for a, _ in spread), max(b for _, b in spread)
        lines += [
            f"Reading: in this run the req/s ratio of a rep ranged from {lo:.2f} to {hi:.2f} "
            "across scenarios, so the noise is at least that wide here; a difference the page "
            "made that is smaller than that cannot be told from it. On a quiet machine run it "
            "with more and longer reps (`--reps 5 --duration 5`).",
            "",
        ]
    lines += ["## Every rep", ""] + _table(table)
    quiet = compare(report, list(table), QUIET)
    lines += [
        f"## Only the reps in which others used at most {QUIET} cores during both runs",
        "",
    ]
    lines += _table(quiet) if any(quiet.values()) else ["(none were that quiet)", ""]
    lines += [
        "## What the page adds, in this process",
        "",
        f"- `RecentWindow.observe`, once per finished request (the only per-request work the "
        f"page adds; nothing per chunk): {cost['observe_us']:.2f} µs.",
        f"- One snapshot (`Feed.publish`: /router/status, curves, series, JSON), on the feed's "
        f"own timer once a second and only while a page is open: {cost['snapshot_us']:.0f} µs, "
        f"{cost['snapshot_bytes']:,} bytes (one speculative and one baseline backend).",
        "",
        "Best of 5 repeats of `timeit`, measured by "
        + (
            f"`{cost['command']}` (after the run above, at commit {cost.get('commit', '?')})."
            if cost.get("command")
            else "the command above."
        ),
    ]
    notes = report.get("notes") or {}
    if notes.get("router_ui"):
        lines += ["", f"Feed check: {notes['router_ui']}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--scenarios", default="c1,stream,c64")
    p.add_argument("--max-other-load", type=float, default=0.10)
    p.add_argument("--retries", type=int, default=3)
    p.add_argument("--quiet-wait", type=float, default=60.0)
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument(
        "--from-json",
        type=Path,
        help="rewrite the report from a ui-overhead.json of an earlier run (no measuring)",
    )
    p.add_argument(
        "--costs-only",
        action="store_true",
        help="with --from-json: measure the two costs again (after a change to them), keep the "
        "rest of the earlier run",
    )
    args = p.parse_args(argv)
    command = "python bench/ui_overhead.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        if args.costs_only:
            saved["costs"] = {**costs(), "command": command}
            args.from_json.write_text(json.dumps(saved, indent=1) + "\n")
        report = saved["overhead"]
        table = compare(report, list(saved["comparison"]))
        (args.out / "ui-overhead.md").write_text(render(report, table, saved["costs"]))
        return 0
    scenarios = [s for s in args.scenarios.split(",") if s]
    with tempfile.TemporaryDirectory(prefix="ui-overhead-") as tmp:
        code = overhead_main(
            [
                "--reps", str(args.reps), "--duration", str(args.duration),
                "--targets", "direct,router,router_ui", "--scenarios", ",".join(scenarios),
                "--max-other-load", str(args.max_other_load), "--retries", str(args.retries),
                "--quiet-wait", str(args.quiet_wait),
                "--out", tmp,
            ]
        )  # fmt: skip
        if code:
            return code
        report = json.loads((Path(tmp) / "overhead.json").read_text())
    report["ui_command"] = command
    table = compare(report, scenarios)
    cost = costs()
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "command": report["ui_command"],
        "comparison": table,
        "costs": cost,
        "overhead": report,
    }
    (args.out / "ui-overhead.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "ui-overhead.md").write_text(render(report, table, cost))
    print(f"wrote {args.out / 'ui-overhead.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
