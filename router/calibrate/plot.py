"""A PNG of a crossover table: both pools' curves with the crossover marked (needs matplotlib).

Left: per-request decode tok/s against concurrency, measured points joined by solid lines, the
fitted curves dashed. The speculative pool is above the baseline at low concurrency; the
vertical line is the table's crossover, from which the router sends requests to the baseline
(dotted, at the highest level measured, when there is no crossover up to there). The shaded
span left of it is where the router prefers the speculative pool.
Middle: total output tok/s of each pool (what the pool delivers as a whole). Right: time to
first token, median (solid) and p99 (dotted).
"""

from __future__ import annotations

from pathlib import Path

from router.decide.table import Table

COLORS = {"speculative": "tab:orange", "baseline": "tab:blue"}


def plot(table: Table, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_total, ax_ttft) = plt.subplots(1, 3, figsize=(16, 4.8))
    levels: set[int] = set()
    for pool in ("speculative", "baseline"):
        curve = table.pool(pool)
        pts = curve.points
        xs = [p.concurrency for p in pts]
        levels.update(xs)
        color = COLORS[pool]
        ax.plot(xs, [p.decode_tps_p50 for p in pts], "o-", color=color, label=f"{pool} (p50)")
        if curve.fit is not None and xs:
            dense = [xs[0] + (xs[-1] - xs[0]) * i / 200 for i in range(201)]
            fit = curve.fit
            ax.plot(
                dense,
                [fit.per_request_tps(n) for n in dense],
                "--",
                color=color,
                alpha=0.6,
                label=f"{pool} fit" + (f" (tau {fit.tau:.2f})" if fit.tau != 1 else ""),
            )
        ax_total.plot(xs, [p.total_tps for p in pts], "o-", color=color, label=pool)
        ax_ttft.plot(xs, [p.ttft_p50 for p in pts], "o-", color=color, label=f"{pool} p50")
        ax_ttft.plot(xs, [p.ttft_p99 for p in pts], ":", color=color, label=f"{pool} p99")
    low = min(levels) if levels else 1
    mark = table.limit  # the crossover, or the highest level measured when there is none
    for a in (ax, ax_total, ax_ttft):
        a.axvline(mark, color="black", linestyle="-." if table.crossover else ":", linewidth=1)
        if mark > low:  # where the router prefers the speculative pool
            a.axvspan(low, mark, color=COLORS["speculative"], alpha=0.07)
        a.set_xscale("log", base=2)
        ticks = sorted(levels | {mark})
        a.set_xticks(ticks)
        a.set_xticklabels([str(t) for t in ticks], fontsize=8)
        a.set_xlabel("concurrent requests on the pool")
        a.grid(True, alpha=0.3)
    top = ax.get_ylim()[1]
    label = crossover_label(table)
    at_end = bool(levels) and mark >= max(levels)  # (written to its left, inside the plot)
    ax.text(mark, top * 0.97, f" {label} " if at_end else f" {label}", va="top", fontsize=9,
            ha="right" if at_end else "left")  # fmt: skip
    ax.set_ylabel("decode tok/s per request")
    ax.set_title("per-request decode speed")
    ax_total.set_ylabel("output tok/s, whole pool")
    ax_total.set_title("total throughput")
    ax_ttft.set_ylabel("seconds")
    ax_ttft.set_title("time to first token")
    ax.legend(fontsize=8)
    ax_total.legend(fontsize=8)
    ax_ttft.legend(fontsize=8)
    w = table.workload
    what = (
        f"dataset {w.dataset}"
        if w.dataset
        else f"{w.prompt_tokens}-token prompts, {w.output_tokens}-token outputs"
    )
    fig.suptitle(
        f"{crossover_label(table)} ({table.objective}); {what}, temperature {w.temperature:g};"
        f" measured {table.measured_at}"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def crossover_label(table: Table) -> str:
    if table.crossover is not None:
        return f"crossover {table.crossover}"
    return f"no crossover up to {table.measured_up_to}"
