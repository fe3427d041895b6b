"""What ``spec-router replay`` writes: a progress line on stderr, the results as JSON, and a
markdown report. ``read_json`` turns a results file back into ``Result`` s (the bench uses it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shlex
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from router.tools.goodput import SLO, Result, Summary
from router.tools.traffic import Arrival, describe

FORMAT = 1


@dataclass
class Sent:
    """How far a replay is: the counters the progress display shows."""

    total: int
    sent: int = 0
    done: int = 0
    worst_late: float = 0.0  # model seconds


class Progress:
    """A bar redrawn in place on a terminal; a plain line every ``every`` seconds otherwise."""

    WIDTH = 24

    def __init__(self, stream: TextIO, time_scale: float, every: float = 10.0) -> None:
        self.stream, self.time_scale, self.every = stream, time_scale, every
        self.tty = stream.isatty()
        self.began = time.monotonic()

    async def watch(self, state: Sent) -> None:
        while True:
            self.draw(state)
            await asyncio.sleep(0.2 if self.tty else self.every)

    def draw(self, state: Sent) -> None:
        filled = self.WIDTH * state.sent // max(1, state.total)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        line = self.line(state, bar, time.monotonic() - self.began)
        self.stream.write(f"\r\x1b[2K{line}" if self.tty else line + "\n")
        self.stream.flush()

    def line(self, state: Sent, bar: str, wall: float) -> str:
        """The progress line at ``wall`` seconds since the start."""
        return (
            f"replay {bar} sent {state.sent}/{state.total}  done {state.done}  "
            f"in flight {state.sent - state.done}  worst send lag {state.worst_late * 1000:.0f} ms"
            f"  {wall / self.time_scale:.0f} s model ({wall:.0f} s wall)"
        )

    def done(self, summary: Summary) -> None:
        shares = "  ".join(f"goodput {k} {v:.1%}" for k, v in summary.goodput.items())
        line = (
            f"replay: {summary.count} requests, {summary.ok} ok, {summary.rejections} rejected,"
            f" {summary.errors} errors; {shares}; TTFT p99 {summary.ttft_p99:.3f} s, "
            f"TPOT p90 {summary.tpot_p90 * 1000:.1f} ms; send lag p99 "
            f"{summary.lateness_p99 * 1000:.1f} ms"
        )
        self.stream.write(("\r\x1b[2K" if self.tty else "") + line + "\n")
        self.stream.flush()


def run_meta(
    ns: argparse.Namespace,
    argv: Sequence[str],
    arrivals: Sequence[Arrival],
    slos: Sequence[SLO],
    began: float,
) -> dict[str, Any]:
    return {
        "command": shlex.join(["spec-router", "replay", *argv]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(began)),
        "url": ns.url,
        "endpoint": ns.endpoint,
        "time_scale": ns.time_scale,
        "warmup": ns.warmup,
        "slos": [asdict(s) for s in slos],
        "workload": asdict(describe(arrivals)),
        "cpus": os.cpu_count(),
    }


def _clean(value: Any) -> Any:
    """JSON has no NaN: write null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def write_json(
    path: str | Path, meta: dict[str, Any], summary: Summary, results: Sequence[Result]
) -> None:
    doc = {
        "format": FORMAT,
        "meta": meta,
        "summary": asdict(summary),
        "results": [asdict(r) for r in results],
    }
    Path(path).write_text(json.dumps(_clean(doc), indent=1, allow_nan=False) + "\n")


def read_json(path: str | Path) -> tuple[dict[str, Any], list[Result]]:
    doc = json.loads(Path(path).read_text())
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a replay results file of format {FORMAT}")
    results = [Result(**{**r, "arrival": Arrival(**r["arrival"])}) for r in doc["results"]]
    return doc["meta"], results


def ms(seconds: float) -> str:
    return "—" if math.isnan(seconds) else f"{seconds * 1000:.0f}"


def secs(seconds: float) -> str:
    return "—" if math.isnan(seconds) else f"{seconds:.2f}"


def pct(share: float) -> str:
    return "—" if math.isnan(share) else f"{share:.1%}"


def write_report(
    path: str | Path, meta: dict[str, Any], summary: Summary, slos: Sequence[SLO]
) -> None:
    w = meta["workload"]
    slo_text = "; ".join(
        f"**{s.name}** TTFT <= {s.ttft_s:g} s and TPOT <= {s.tpot_s * 1000:g} ms" for s in slos
    )
    lines = [
        "# Replay",
        "",
        f"Command: `{meta['command']}` (started {meta['started']}).",
        "",
        f"Workload: {w['count']} requests over {w['span']:.1f} s ({w['rate']:.3g} req/s); "
        f"prompt mean {w['prompt_mean']:.0f} / median {w['prompt_median']:.0f} tokens, output "
        f"mean {w['output_mean']:.0f} / median {w['output_median']:.0f}; "
        f"{w['hot_share']:.0%} at temperature 1. Sent to {meta['url']} ({meta['endpoint']}), "
        f"time scale {meta['time_scale']:g}: every number is model time. "
        f"Scored: arrivals from {meta['warmup']:g} s on ({summary.count}).",
        "",
        f"SLOs: {slo_text}. A failed, rejected or unfinished request misses every SLO.",
        "",
        "| " + " | ".join(f"goodput {s.name}" for s in slos) + " | ok | TTFT p50 / p99 s "
        "| TPOT p50 / p90 ms | e2e p50 s | to speculative | rejected | errors |",
        "|" + "---|" * (len(slos) + 7),
        "| "
        + " | ".join(pct(summary.goodput[s.name]) for s in slos)
        + f" | {summary.ok}/{summary.count} | {secs(summary.ttft_p50)} / "
        f"{secs(summary.ttft_p99)} | {ms(summary.tpot_p50)} / {ms(summary.tpot_p90)} | "
        f"{secs(summary.e2e_p50)} | {pct(summary.speculative_share)} | {summary.rejections} | "
        f"{summary.errors} |",
        "",
        f"Successful requests by pool: {summary.pools or '—'}. "
        f"Failures by kind: {summary.error_kinds or 'none'}. "
        f"Short outputs: {summary.short}.",
        "",
        f"The load generator sent requests at most {ms(summary.lateness_max)} ms (p99 "
        f"{ms(summary.lateness_p99)} ms, model time) after their arrival time.",
    ]
    Path(path).write_text("\n".join(lines) + "\n")
