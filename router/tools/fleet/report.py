"""What ``spec-router fleet`` shows: a progress bar, a markdown report and a PNG.

The PNG has three panels on the day's clock: the load (arrivals per 10 minutes as a share of
the all-baseline fleet's SLO capacity), the split (engines serving speculative, baseline, and
out of service for a switch) and goodput per hour in both tiers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from router.tools.replay_report import Progress as ReplayProgress
from router.tools.replay_report import Sent

HOUR = 3600.0


class Progress(ReplayProgress):
    """The replay's bar (redrawn in place on a terminal, a plain line every ``every`` seconds
    otherwise), on the day's clock."""

    WIDTH = 28

    def __init__(
        self, stream: TextIO, time_scale: float, compress: float, total: int, every: float = 10.0
    ) -> None:
        super().__init__(stream, time_scale, every)
        self.compress, self.total = compress, total

    def line(self, state: Sent, bar: str, wall: float) -> str:
        day_h = wall / self.time_scale * self.compress / HOUR
        return (
            f"fleet {bar} day {day_h:5.2f} h  sent {state.sent}/{state.total}  "
            f"in flight {state.sent - state.done}  ({wall:.0f} s wall)"
        )

    def finished(self, summary: dict[str, Any]) -> None:
        line = (
            f"fleet: {summary['requests']} requests, {summary['ok']} ok; goodput strict "
            f"{pct(summary['goodput_strict'])}, relaxed {pct(summary['goodput_relaxed'])}; "
            f"{summary['tok_s']:.0f} tok/s; {summary['switches']} switches, "
            f"{summary['restart_engine_s']:.0f} engine-s restarting"
        )
        self.stream.write(("\r\x1b[2K" if self.tty else "") + line + "\n")
        self.stream.flush()


def pct(x: float | None) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def write_report(path: Path, doc: dict[str, Any]) -> None:
    m, s = doc["meta"], doc["summary"]
    lines = [
        f"# Fleet: {m['split']}, {m['engines']} engines, {m['regime']}",
        "",
        f"Command: `{m['command']}` (started {m['started']}, {m['wall_s']:.0f} s wall).",
        "",
        f"Workload: {m['workload']} (capacity {m['capacity_rps']:.2f} req/s for the "
        f"all-baseline fleet), lengths {m['lengths']}, {m['temperature_share']:.0%} at "
        f"temperature 1. Restart {m['restart_s']:g} s. Engines at time scale "
        f"{m['time_scale']:g}; the day runs {m['compress']:g}x faster than the engines.",
        "",
        "Goodput in %: a request meets the strict SLO with TTFT <= 1 s and TPOT <= 25 ms, the "
        "relaxed one with 3 s and 50 ms (engine model time).",
        "",
        "| hours | requests | strict | relaxed | tok/s | switches | restart engine-s |",
        "|---|---|---|---|---|---|---|",
        f"| all | {s['requests']} | {pct(s['goodput_strict'])} | {pct(s['goodput_relaxed'])} | "
        f"{s['tok_s']:.0f} | {s['switches']} | {s['restart_engine_s']:.0f} |",
    ]
    for b in s["buckets"]:
        lines.append(
            f"| {b['start_h']:g}-{b['end_h']:g} | {b['requests']} | {pct(b['goodput_strict'])} "
            f"| {pct(b['goodput_relaxed'])} | {b['tok_s']:.0f} | {b['switches']} | "
            f"{b['restart_engine_s']:.0f} |"
        )
    lines += ["", f"Requests the router still held after the replay: {m['in_flight_after']}."]
    if m.get("plans_seen") is not None:
        lines += ["", f"Plans the actuator read: {m['plans_seen']} (one per planner interval "
                      f"would be {m['hours'] * 60:.0f})."]  # fmt: skip
    if doc["outages"]:
        lines += ["", "Switches (day hours): " + "; ".join(
            f"{o['engine']} into {o['into']} at {o['left'] / HOUR:.2f} h "
            f"({o['in_flight']} in flight), "
            + ("still out" if o["back"] is None else f"back at {o['back'] / HOUR:.2f} h")
            for o in doc["outages"]
        )]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")


def _steps(
    rows: Sequence[Sequence[float]], col: int, end: float
) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, row in enumerate(rows):
        t1 = rows[i + 1][0] if i + 1 < len(rows) else end
        xs += [row[0] / HOUR, t1 / HOUR]
        ys += [row[col], row[col]]
    return xs, ys


def plot(doc: dict[str, Any], path: Path, title: str | None = None) -> None:
    """The run's picture (matplotlib, the ``plot`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m, s = doc["meta"], doc["summary"]
    end = m["hours"] * HOUR
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(9, 7.5), sharex=True)
    load = doc["load"]
    ax1.plot([x["t_h"] for x in load], [100 * x["share"] for x in load], color="black", lw=1.2,
             label="arrivals (per 10 min)")  # fmt: skip
    if not any(math.isnan(x["envelope"]) for x in load if x["envelope"] is not None):
        ax1.plot([x["t_h"] for x in load], [100 * (x["envelope"] or 0) for x in load],
                 color="grey", ls="--", lw=1, label="envelope")  # fmt: skip
    ax1.axhline(100, color="tab:red", lw=0.8, ls=":")
    ax1.set_ylabel("load, % of all-baseline\nSLO capacity")
    ax1.legend(loc="upper left", fontsize=8)
    rows = doc["split"]
    if rows:
        for col, name, color in ((1, "speculative", "tab:blue"), (2, "baseline", "tab:orange"),
                                 (3, "switching", "tab:grey")):  # fmt: skip
            xs, ys = _steps(rows, col, end)
            ax2.plot(xs, ys, label=name, color=color, lw=1.6)
    ax2.set_ylabel("engines")
    ax2.set_ylim(-0.2, m["engines"] + 0.2)
    ax2.legend(loc="upper left", fontsize=8)
    bs = s["buckets"]
    mids = [(b["start_h"] + b["end_h"]) / 2 for b in bs]
    width = 0.38 * min((b["end_h"] - b["start_h"]) for b in bs) if bs else 0.4
    ax3.bar([x - width / 2 for x in mids], [100 * (b["goodput_strict"] or 0) for b in bs], width,
            label="strict", color="tab:green")  # fmt: skip
    ax3.bar([x + width / 2 for x in mids], [100 * (b["goodput_relaxed"] or 0) for b in bs], width,
            label="relaxed", color="tab:olive")  # fmt: skip
    ax3.set_ylabel("goodput %")
    ax3.set_ylim(0, 100)
    ax3.set_xlabel("day hour")
    ax3.legend(loc="lower left", fontsize=8)
    fig.suptitle(title or (
        f"spec-router fleet: {m['split']}, {m['engines']} x {m['regime']}/baseline; strict "
        f"{pct(s['goodput_strict'])}%, relaxed {pct(s['goodput_relaxed'])}%, "
        f"{s['switches']} switches"), fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
