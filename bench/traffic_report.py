"""bench/traffic.py's outputs: the markdown tables and the PNG (see that script)."""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from router.tools.goodput import RELAXED, STRICT, Summary
from router.tools.replay_report import ms, pct, secs

if TYPE_CHECKING:
    from traffic import Case, Deployment


@dataclass
class Run:
    deployment: str
    workload: str
    load: float
    summary: Summary | None  # None: the replay failed
    seconds: float

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Run:
        raw = d["summary"]
        summary = None
        if raw is not None:
            fields: dict[str, Any] = {k: math.nan if v is None else v for k, v in raw.items()}
            summary = Summary(**fields)
        return cls(d["deployment"], d["workload"], d["load"], summary, d["seconds"])

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["summary"] = None if self.summary is None else _nan_free(asdict(self.summary))
        return d


def _nan_free(d: dict[str, Any]) -> dict[str, Any]:
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in d.items()}


def _group(runs: Sequence[Run], case: Case, name: str) -> list[Summary]:
    return [
        r.summary
        for r in runs
        if r.summary is not None
        and (r.deployment, r.workload, r.load) == (name, case.workload, case.load)
    ]


def _mean(values: Sequence[float]) -> float:
    xs = [v for v in values if not math.isnan(v)]
    return statistics.fmean(xs) if xs else math.nan


def _cell(
    summaries: Sequence[Summary], get: Callable[[Summary], float], fmt: Callable[[float], str]
) -> str:
    """Mean over repeats, with the range when there are several."""
    values = [get(s) for s in summaries]
    text = fmt(_mean(values))
    if len(values) > 1 and not any(math.isnan(v) for v in values):
        text += f" ({fmt(min(values))}–{fmt(max(values))})"
    return text


SHARE_NOTE = {"2x baseline, round-robin": "n/a (0%)"}  # and 2x <regime>: "n/a (100%)"


def table(case: Case, deps: Sequence[Deployment], runs: Sequence[Run]) -> list[str]:
    lines = [
        "| deployment | goodput strict | goodput relaxed | TTFT p50 / p99 s | "
        "TPOT p50 / p90 ms | to speculative | rejected | errors | send lag p99 ms | n |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in deps:
        got = _group(runs, case, d.name)
        if not got:
            lines.append(f"| {d.name} | (no run) |" + " |" * 8)
            continue

        def mean(name: str, got: list[Summary] = got) -> float:
            return _mean([getattr(s, name) for s in got])

        both_spec = d.sims[0] == d.sims[1] != "baseline"
        share = "n/a (100%)" if both_spec else SHARE_NOTE.get(d.name)
        share = share or _cell(got, lambda s: s.speculative_share, pct)
        lines.append(
            f"| {d.name} | **{_cell(got, lambda s: s.strict, pct)}** "
            f"| **{_cell(got, lambda s: s.relaxed, pct)}** "
            f"| {secs(mean('ttft_p50'))} / {secs(mean('ttft_p99'))} "
            f"| {ms(mean('tpot_p50'))} / {ms(mean('tpot_p90'))} "
            f"| {share} | {sum(s.rejections for s in got)} | {sum(s.errors for s in got)} "
            f"| {ms(max(s.lateness_p99 for s in got))} | {sum(s.count for s in got)} |"
        )
    return lines


def write(
    path: Path,
    meta: dict[str, Any],
    cases: Sequence[Case],
    deps: Sequence[Deployment],
    runs: Sequence[Run],
) -> None:
    machine = platform.processor() or platform.machine()
    before = ", ".join(f"{x:.2f}" for x in meta["loadavg_before"])
    after = ", ".join(f"{x:.2f}" for x in meta["loadavg_after"])
    caps = {c.workload: c for c in cases}
    lines = [
        "# Routing on open-loop traffic: goodput under TTFT/TPOT SLOs",
        "",
        f"Command: `{meta['command']}` (from the repository root with `.venv/bin/python`; "
        f"{len(runs)} runs took {meta['seconds']:.0f} s; written "
        f"{meta.get('finished') or time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}).",
        f"Machine: {os.cpu_count()} cores, {machine}, Python {platform.python_version()}; load "
        f"average {before} before and {after} after (other work shares this machine: a load "
        "above ~2 means the sims and the router competed for the cores, which shows up as "
        "TTFT/TPOT noise; compare rows of one table, which ran minutes apart).",
        "",
        *([meta["note"], ""] if meta.get("note") else []),
        "Every run starts fresh engines (so queues start empty) and a fresh router; "
        f"`spec-router replay` sends the workload open-loop. Sims at time scale "
        f"{meta['time_scale']:g}; every number is model time. Each run: {meta['duration']:g} s "
        f"of arrivals, the first {meta['warmup']:g} s sent but not scored, then up to "
        f"{meta['drain']:g} s for the last answers (requests still running then count as "
        f"errors). Routers on core 0, sims and the replay on core 1. Policy rows start from the "
        f"calibrated table `{meta['table']}` with `spec-router serve`'s defaults otherwise "
        "(learning and exploration on); `SPEC_ROUTER_BUSY_POLL_US=0` because the router's "
        "core is shared.",
        "",
        f"SLOs: **strict** TTFT <= {STRICT.ttft_s:g} s and TPOT <= {STRICT.tpot_s * 1e3:g} ms; "
        f"**relaxed** TTFT <= {RELAXED.ttft_s:g} s and TPOT <= {RELAXED.tpot_s * 1e3:g} ms. "
        "Goodput = share of the scored requests that succeeded within the SLO (failed, "
        "rejected and unfinished requests count against it). TTFT/TPOT percentiles are over "
        "successful requests. *to speculative* = share the router placed on the speculative "
        "pool (`x-spec-router-pool`). *send lag* = how late the replay sent a request "
        "(the load generator keeping up). With `--repeat`, cells are means with the range.",
        "",
        "**Capacity** (what the loads are shares of) is analytic, from `router/sim/model.py`: "
        "for each engine, the request rate at which its decode throughput saturates "
        "(`closed_loop` with a full batch, `max_running`, at the workload's mean prompt and "
        "output lengths and mean acceptance length), summed over the "
        f"{meta.get('regime', 'eagle3')} and the baseline engine. It is a throughput limit, "
        "well past where TPOT SLOs hold: the loads locate each run relative to what the pair "
        "can process at all. The two-of-a-kind references get the same request rates. The "
        "Azure trace records no temperature; its requests go out at the share of "
        "temperature 1 shown below (0% by default, `--trace-temperature-share`).",
        "",
    ]
    for name, c in caps.items():
        p = c.profile
        lines.append(
            f"- `{name}`: capacity **{c.capacity:.3f} req/s** (prompt mean {p['prompt_mean']:.0f}"
            f", output mean {p['output_mean']:.0f}, {p['hot_share']:.0%} at temperature 1)"
        )
    lines += ["", "Deployments:", ""]
    lines += [f"- **{d.name}**: {d.note}" for d in deps]
    for c in cases:
        lines += [
            "",
            f"## {c.workload} at {c.load:.0%} of capacity ({c.rate:.3f} req/s)",
            "",
            *table(c, deps, runs),
            "",
            "```",
            "spec-router replay --url $ROUTER " + " ".join(c.args),
            "```",
        ]
    lines += ["", f"![goodput and TTFT p99 against load]({path.with_suffix('.png').name})"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def plot(
    path: Path, cases: Sequence[Case], deps: Sequence[Deployment], runs: Sequence[Run]
) -> None:
    """Goodput (strict, relaxed) and TTFT p99 against load, one line per deployment, one
    column per workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(c.workload for c in cases))
    fig, axes = plt.subplots(3, len(workloads), figsize=(5.5 * len(workloads), 10), squeeze=False)
    rows: list[tuple[str, Callable[[Summary], float]]] = [
        ("goodput strict", lambda s: s.strict * 100),
        ("goodput relaxed", lambda s: s.relaxed * 100),
        ("TTFT p99 (s)", lambda s: s.ttft_p99),
    ]
    for col, w in enumerate(workloads):
        mine = [c for c in cases if c.workload == w]
        for row, (label, get) in enumerate(rows):
            ax = axes[row][col]
            for d in deps:
                xs, ys = [], []
                for c in mine:
                    got = _group(runs, c, d.name)
                    if got:
                        xs.append(c.load * 100)
                        ys.append(_mean([get(s) for s in got]))
                style = "--" if d.name.startswith("2x") else "-"
                ax.plot(xs, ys, style, marker="o", label=d.name)
            ax.set_ylabel(label + (" %" if "goodput" in label else ""))
            ax.set_xlabel("load, % of the pair's capacity")
            if row == 0:
                ax.set_title(w)
            if label.startswith("TTFT"):
                ax.set_ylim(bottom=0)
            else:
                ax.set_ylim(0, 100)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
