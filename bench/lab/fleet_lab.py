"""The fleet lab: N simulated engines that switch between speculative and baseline, a router in
front, and who decides the split: a static split, the planner in the loop, or the offline
oracle. No sockets; a simulated 8-hour day of four engines runs in seconds.

    python bench/lab/fleet_lab.py                    # everything: bench/results/fleet-lab.{md,json}
    python bench/lab/fleet_lab.py --quick            # the main day, one regime
    python bench/lab/fleet_lab.py --strict-weight 0.3 --only main

Pieces: ``fleet_engine`` (the engines), ``fleet_sim`` (the fleet, its router, switching),
``fleet_workloads`` (the days), ``fleet_score``, ``fleet_control`` (the planner in the loop),
``fleet_oracle`` (dynamic programming over the known day), ``fleet_calibrate`` (the planner's
goodput model against the lab). The rows, per regime and workload:

- every static split ``k = 0..N`` speculative (``all-base`` is 0, ``all-spec`` N); the best
  static is the one with the best objective (the planner's: ``strict_weight * strict +
  (1 - strict_weight) * relaxed``);
- the planner (``router.plan.plan`` every ``Params.interval``), starting in the split it
  prefers for the first minute's rate;
- the oracle: its dynamic program's value over the static runs' minutes, and its schedule
  replayed in the lab.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # lab_sim (fleet_router's decider)
sys.path.insert(0, str(ROOT))

from fleet_calibrate import LOADS, calibrate, summary, workload_mix  # noqa: E402
from fleet_control import PlannerController, Schedule, setting_for  # noqa: E402
from fleet_engine import Req  # noqa: E402
from fleet_oracle import hour_reach, oracle  # noqa: E402
from fleet_regimes import REGIMES, regime  # noqa: E402
from fleet_router import DeciderRouter  # noqa: E402
from fleet_score import Score, buckets, meets, per_bucket_good, score  # noqa: E402
from fleet_sim import Result, run  # noqa: E402
from fleet_workloads import (  # noqa: E402
    HOUR,
    Envelope,
    arrivals,
    engine_slo_capacity,
    mean_lengths,
    trace_lengths,
)

from router.plan import (  # noqa: E402
    ForecastParams,
    Mix,
    ModelParams,
    Params,
    Setting,
    Slo,
    forecast,
    mix_of,
    observe,
    spill_threshold,
    split_goodput,
    steady_split,
)
from router.sim.model import Preset  # noqa: E402
from router.tools.traffic import load_trace  # noqa: E402

RESULTS = ROOT / "bench" / "results"
ENGINES = 4
BUCKET = 60.0  # seconds: the oracle's and the per-minute counts' bucket
SURGE_AT = 1.5 * HOUR


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str = "conv"
    hot: float = 0.8
    env: Envelope = field(default_factory=lambda: Envelope("surge", surge_at=SURGE_AT))
    seed: int = 1
    held_out: bool = False
    oracle: bool = True


MAIN = Workload("day (conv, 80% at T=1, x3 surge at 1.5 h)")
TUNING = (MAIN, replace(MAIN, name="day, seed 2", seed=2))
HELD_OUT = (
    Workload("code trace day", kind="code", held_out=True),
    Workload("day, seed 3", seed=3, held_out=True),
    Workload(
        "day, seed 4, surge at 5.5 h",
        seed=4,
        env=Envelope("surge", surge_at=5.5 * HOUR),
        held_out=True,
    ),
    Workload("low day 10-80%", env=Envelope("surge", hi=0.8, surge_at=SURGE_AT), held_out=True),
    Workload(
        "high day 30-130%", env=Envelope("surge", lo=0.3, hi=1.3, surge_at=SURGE_AT), held_out=True
    ),
    Workload("all greedy (T=0)", hot=0.0, held_out=True),
    Workload("half at T=1", hot=0.5, held_out=True),
    Workload("all at T=1", hot=1.0, held_out=True),
    Workload(
        "code, no surge, 12 h day", kind="code", env=Envelope(hours=12.0), seed=5, held_out=True
    ),
)
FLAT = tuple(
    Workload(f"flat {int(100 * x)}% for 2 h", env=Envelope("flat", hours=2.0, hi=x), oracle=False)
    for x in (0.2, 0.5, 0.8, 1.0)
)


def objective(s: Score | dict[str, Any], weight: float) -> float:
    strict = s.strict if isinstance(s, Score) else s["strict"]
    relaxed = s.relaxed if isinstance(s, Score) else s["relaxed"]
    return float(weight * strict + (1 - weight) * relaxed)


def _row(res: Result, duration: float, weight: float) -> dict[str, Any]:
    s = score(res.requests, 0.0, duration)
    good = sum(r.output for r in res.requests if meets(r)[1])
    hourly = buckets(res.requests, duration, HOUR)
    return {
        "strict": s.strict,
        "relaxed": s.relaxed,
        "objective": objective(s, weight),
        "tok_s": s.tok_s,
        "good_tok_s": good / duration,
        "switches": len(res.switches),
        "restart_engine_s": res.restart_s,
        "drain_engine_s": res.drain_s,
        "hourly": [
            {"strict": h.strict, "relaxed": h.relaxed, "tok_s": h.tok_s, "n": h.n} for h in hourly
        ],
    }


def _peak_rate(reqs: Sequence[Req], start: float, end: float, window: float = 60.0) -> float:
    """The highest arrival rate over a ``window`` within [start, end)."""
    best = 0.0
    t = start
    while t < end:
        n = sum(1 for r in reqs if t <= r.at < t + window)
        best = max(best, n / window)
        t += window
    return best


def _yesterday(wl: Workload, capacity: float, interval: float) -> list[int]:
    """The day before, as the planner saw it: the usual day (10-110%, no surge) of the same
    length and traffic with another seed (a flat load: the same flat load)."""
    env = wl.env if wl.env.shape == "flat" else Envelope(hours=wl.env.hours)
    reqs = arrivals(env, capacity, wl.kind, wl.hot, wl.seed + 1000)
    counts = [0] * max(1, round(env.duration / interval))
    for r in reqs:
        counts[min(len(counts) - 1, int(r.at // interval))] += 1
    return counts


def model_day(setting: Setting, mix: Mix, env: Envelope, capacity: float, n: int,
              weight: float) -> dict[str, dict[str, list[float]]]:  # fmt: skip
    """Each static split's goodput over the day as the planner's model expects it (minute by
    minute at the envelope's rate, weighted by arrivals), pricing the slo router (its best
    threshold) and spillover at the crossover."""
    out: dict[str, dict[str, list[float]]] = {}
    for name, mp in (("slo", ModelParams(strict_weight=weight)),
                     ("spillover", ModelParams(router="spillover"))):  # fmt: skip
        per: dict[str, list[float]] = {}
        for k in range(n + 1):
            strict = relaxed = total = 0.0
            t = 30.0
            while t < env.duration:
                rate = env.share(t) * capacity
                g = split_goodput(setting.speculative, setting.baseline, mix, setting.slo, k,
                                  n - k, rate, mp)  # fmt: skip
                strict += rate * g.strict
                relaxed += rate * g.relaxed
                total += rate
                t += 60.0
            per[str(k)] = [strict / total, relaxed / total]
        out[name] = per
    return out


class LabDay(NamedTuple):
    """One regime's engines on one workload's day, as every row of it runs them."""

    spec: Preset
    base: Preset
    capacity: float  # the all-baseline fleet's SLO capacity, requests per second
    requests: list[Req]
    setting: Setting
    threshold: int  # spillover's crossover
    router: Callable[[], DeciderRouter | None]  # a fresh router for each run


def lab_day(reg: str, wl: Workload, router: str = "slo") -> LabDay:
    spec, base = regime(reg)
    capacity = ENGINES * engine_slo_capacity(base, wl.kind, wl.hot)
    reqs = arrivals(wl.env, capacity, wl.kind, wl.hot, wl.seed)
    prompt, output = mean_lengths(wl.kind)
    setting = setting_for(spec, base, prompt + output / 2)
    theta = spill_threshold(
        setting.speculative, setting.baseline, workload_mix(wl.kind, wl.hot), Slo()
    )

    def rt() -> DeciderRouter | None:
        return DeciderRouter(spec, base, prompt, output) if router == "slo" else None

    return LabDay(spec, base, capacity, reqs, setting, theta, rt)


def _planner_row(day: LabDay, wl: Workload, params: Params) -> dict[str, Any]:
    """The planner's row: it starts in the split it prefers for the first interval's rate,
    having seen yesterday (``_yesterday``)."""
    spec, base, capacity, reqs, setting, theta, rt = day
    n = ENGINES
    duration = wl.env.duration
    prompt, output = mean_lengths(wl.kind)
    w = params.strict_weight
    first = [r for r in reqs if r.at < params.interval]
    mix0 = mix_of(
        [r.prompt for r in first] or [prompt],
        [r.output for r in first] or [output],
        sum(r.hot for r in first) / max(1, len(first)),
    )
    start = steady_split(setting, mix0, len(first) / params.interval, n, params)
    yesterday = _yesterday(wl, capacity, params.interval)
    # the planner's season is the lab's day (in intervals)
    params = params._replace(forecast=params.forecast._replace(season=len(yesterday)))
    ctl = PlannerController(setting, params)
    ctl.warm(yesterday, params.interval)
    res = run(reqs, spec, base, n, start, theta, seed=wl.seed, controller=ctl,
              interval=params.interval, router=rt())  # fmt: skip
    row = _row(res, duration, w)
    row["start"] = start
    floors = []
    for sw in res.switches:
        end = sw.up if not math.isnan(sw.up) else duration
        floors.append(
            {
                "t": sw.decided,
                "mode": sw.mode,
                "need": sw.need,
                "have": sw.have,
                "short": sw.short,
                "actual_peak": _peak_rate(reqs, sw.decided, end),
            }
        )
    row["floors"] = floors
    row["timeline"] = res.timeline
    return row


def planner_only(reg: str, wl: Workload, params: Params, router: str = "slo") -> dict[str, Any]:
    """The planner's row alone (``--planner-only``: a change to the planner judged without
    rerunning the rows it does not move: the static splits, the oracle)."""
    t0 = time.time()
    day = lab_day(reg, wl, router)
    if router == "spillover":
        params = params._replace(model=params.model._replace(router="spillover"))
    row = _planner_row(day, wl, params)
    return {"regime": reg, "workload": wl.name, "seconds": time.time() - t0, "planner": row}


def evaluate(reg: str, wl: Workload, params: Params, router: str = "slo",
             keep_minutes: bool = False) -> dict[str, Any]:  # fmt: skip
    """Every row for one regime and workload, behind ``router``: "slo" (the router users run,
    ``fleet_router``) or "spillover" at the crossover. ``keep_minutes``: the static runs'
    per-minute counts under "minutes" ("full": n engines up, "short": n - 1, with the oracle;
    split: [(arrived, strict, relaxed), ...]), for ``fleet_hours``."""
    t0 = time.time()
    day = lab_day(reg, wl, router)
    spec, base, capacity, reqs, setting, theta, rt = day
    n = ENGINES
    duration = wl.env.duration
    prompt, output = mean_lengths(wl.kind)
    w = params.strict_weight
    if router == "spillover":
        params = params._replace(model=params.model._replace(router="spillover"))

    rows: dict[str, dict[str, Any]] = {}
    full = {}
    for k in range(n + 1):
        res = run(reqs, spec, base, n, k, theta, seed=wl.seed, router=rt())
        rows[f"static {k}"] = _row(res, duration, w)
        full[k] = per_bucket_good(res.requests, duration, BUCKET)
    rows["planner"] = _planner_row(day, wl, params)
    if wl.oracle:
        short = {}
        for k in range(n):
            r2 = run(reqs, spec, base, n - 1, k, theta, seed=wl.seed, router=rt())
            short[k] = per_bucket_good(r2.requests, duration, BUCKET)
        restarts = {"speculative": spec.startup, "baseline": base.startup}
        o = oracle(full, short, n, BUCKET, restarts, w)
        rows["oracle"] = {
            "strict": o.strict,
            "relaxed": o.relaxed,
            "objective": w * o.strict + (1 - w) * o.relaxed,
            "switches": len(o.moves),
            "start": o.start,
            "restart_engine_s": sum(restarts[m] for _, m in o.moves),
        }
        reach = hour_reach(full, short, n, BUCKET, restarts, w)
        rows["oracle"]["hour_reach"] = reach._asdict()
        replay = run(
            reqs,
            spec,
            base,
            n,
            o.start,
            theta,
            seed=wl.seed,
            controller=Schedule(list(o.moves)),
            interval=BUCKET,
            router=rt(),
        )
        rows["oracle replayed"] = _row(replay, duration, w)
    statics = [rows[f"static {k}"] for k in range(n + 1)]
    best = max(range(n + 1), key=lambda k: statics[k]["objective"])
    kept: dict[str, Any] = {}
    if keep_minutes:
        kept["minutes"] = {"full": full, "short": short if wl.oracle else None}
    return {
        **kept,
        "regime": reg,
        "workload": wl.name,
        "envelope": wl.env.label(),
        "kind": wl.kind,
        "hot": wl.hot,
        "seed": wl.seed,
        "held_out": wl.held_out,
        "capacity": capacity,
        "threshold": theta,
        "router": router,
        "model_day": model_day(setting, workload_mix(wl.kind, wl.hot), wl.env, capacity, n, w)
        if wl.kind == "conv" and wl.env.shape != "flat"
        else None,
        "requests": len(reqs),
        "best_static": best,
        "rows": rows,
        "seconds": time.time() - t0,
    }


def checks(ev: dict[str, Any], weight: float) -> dict[str, Any]:
    """The issue's targets (lab half) for one evaluation."""
    rows = ev["rows"]
    n = ENGINES
    p = rows["planner"]
    best = rows[f"static {ev['best_static']}"]
    spec, base = rows[f"static {n}"], rows["static 0"]
    out: dict[str, Any] = {
        "vs_best_static_strict": p["strict"] - best["strict"],
        "vs_best_static_relaxed": p["relaxed"] - best["relaxed"],
        "best_static_strict": max(rows[f"static {k}"]["strict"] for k in range(n + 1)),
        "best_static_relaxed": max(rows[f"static {k}"]["relaxed"] for k in range(n + 1)),
    }
    if "oracle" in rows:
        out["of_oracle"] = p["objective"] / max(rows["oracle"]["objective"], 1e-9)
    worst = {"strict": math.inf, "relaxed": math.inf, "objective": math.inf, "pure": math.inf}
    for h, ph in enumerate(p["hourly"]):
        if not ph["n"]:
            continue
        for m in ("strict", "relaxed"):
            worst[m] = min(worst[m], ph[m] - max(spec["hourly"][h][m], base["hourly"][h][m]))
        # the better pure split of the hour (by the objective), in both tiers
        better = max(spec["hourly"][h], base["hourly"][h], key=lambda x: objective(x, weight))
        worst["pure"] = min(worst["pure"], ph["strict"] - better["strict"],
                            ph["relaxed"] - better["relaxed"])  # fmt: skip
        worst["objective"] = min(
            worst["objective"],
            objective(ph, weight)
            - max(objective(spec["hourly"][h], weight), objective(base["hourly"][h], weight)),
        )
    out["worst_hour"] = worst
    if "oracle" in rows and "hour_reach" in rows["oracle"]:
        out["hour_reach"] = rows["oracle"]["hour_reach"]
    out["floor_held"] = all(f["have"] >= f["need"] for f in p["floors"] if not f["short"])
    out["switches_short"] = sum(f["short"] for f in p["floors"])
    return out


# --- the forecast, scored -------------------------------------------------------------------


def forecast_scores(
    series: Sequence[float],
    truth: Sequence[float] | None,
    fp: ForecastParams,
    warm: Sequence[float] = (),
    restart_steps: int = 10,
) -> dict[str, float]:
    """Holt fed per-minute rates (after ``warm``, the day before, if any); the point's relative
    error 10, 30 and 60 minutes ahead, and how often the upper band's peak over the next restart
    covers the truth's peak there (the envelope's rate; for a trace, its realised per-minute
    rate smoothed over five minutes)."""
    if truth is None:
        truth = [statistics.fmean(series[max(0, i - 2) : i + 3]) for i in range(len(series))]
    holt = None
    for y in warm:
        holt = observe(holt, y, 60.0, fp)
    errs: dict[int, list[float]] = {10: [], 30: [], 60: []}
    cover = []
    for i, y in enumerate(series):
        holt = observe(holt, y, 60.0, fp)
        if i < 5:
            continue
        fc = forecast(holt, 60, 60.0, fp)
        for h, e in errs.items():
            if i + h < len(series) and truth[i + h] > 0:
                e.append(abs(fc.point[h - 1] - truth[i + h]) / truth[i + h])
        if i + restart_steps < len(series):
            peak = max(truth[i + 1 : i + 1 + restart_steps])
            cover.append(fc.peak(restart_steps * 60.0) >= peak)
    out = {f"mape_{h}min": 100 * statistics.fmean(e) for h, e in errs.items() if e}
    out["upper_covers_restart_peak"] = 100 * statistics.fmean(cover)
    return out


def forecast_report(params: Params) -> list[dict[str, Any]]:
    """The forecast on the lab's days (without and with the day before) and on the traces."""
    rows = []
    _, base = regime("eagle3")
    for wl in (MAIN, *HELD_OUT[2:5], FLAT[1]):
        cap = ENGINES * engine_slo_capacity(base, wl.kind, wl.hot)
        reqs = arrivals(wl.env, cap, wl.kind, wl.hot, wl.seed)
        minutes = int(wl.env.duration // 60)
        counts = [0] * minutes
        for r in reqs:
            counts[min(minutes - 1, int(r.at // 60))] += 1
        series = [c / 60 for c in counts]
        truth = [wl.env.share((i + 0.5) * 60) * cap for i in range(minutes)]
        warm = [c / 60 for c in _yesterday(wl, cap, 60.0)]
        seasonal = params.forecast._replace(season=len(warm))
        rows.append(
            {
                "series": f"{wl.name}: Holt alone",
                **forecast_scores(series, truth, params.forecast._replace(season=0)),
            }
        )
        rows.append(
            {
                "series": f"{wl.name}: with the day before",
                **forecast_scores(series, truth, seasonal, warm),
            }
        )
    for kind in ("conv", "code"):
        trace = load_trace(Path("/work/shared/traces") / f"azure-llm-2023-{kind}.csv")
        minutes = int(trace[-1].at // 60) + 1
        counts = [0] * minutes
        for a in trace:
            counts[int(a.at // 60)] += 1
        rows.append(
            {
                "series": f"Azure {kind} trace (its own arrivals), Holt alone",
                **forecast_scores(
                    [c / 60 for c in counts], None, params.forecast._replace(season=0)
                ),
            }
        )
    return rows


# --- the report ------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def table(ev: dict[str, Any], weight: float) -> list[str]:
    rows = ev["rows"]
    n = ENGINES
    names = [f"static {k}" for k in range(n + 1)]
    label = {f"static {n}": f"all-speculative ({n})", "static 0": "all-baseline (0)"}
    out = [
        "| row | strict % | relaxed % | objective % | good tok/s | switches | restart engine-s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in [*names, "planner", "oracle", "oracle replayed"]:
        if name not in rows:
            continue
        r = rows[name]
        text = label.get(
            name, name.replace("static ", "static ") + (" spec" if "static" in name else "")
        )
        if name == f"static {ev['best_static']}":
            text += " **(best static)**"
        if name == "planner":
            text = f"**planner** (starts at {r['start']})"
        if name == "oracle":
            text = "oracle (DP over static minutes)"
        good = f"{r['good_tok_s']:.0f}" if "good_tok_s" in r else "—"
        out.append(
            f"| {text} | {_pct(r['strict'])} | {_pct(r['relaxed'])} | "
            f"{_pct(r['objective'])} | {good} | {r['switches']} | "
            f"{r['restart_engine_s']:.0f} |"
        )
    return out


def hourly_table(ev: dict[str, Any]) -> list[str]:
    rows = ev["rows"]
    p, s, b = rows["planner"], rows[f"static {ENGINES}"], rows["static 0"]
    out = [
        "| hour | planner strict / relaxed | all-spec | all-base | planner − better "
        "(strict, relaxed) |",
        "|---|---|---|---|---|",
    ]
    for h, ph in enumerate(p["hourly"]):
        sh, bh = s["hourly"][h], b["hourly"][h]
        ds = ph["strict"] - max(sh["strict"], bh["strict"])
        dr = ph["relaxed"] - max(sh["relaxed"], bh["relaxed"])
        out.append(
            f"| {h} | {_pct(ph['strict'])} / {_pct(ph['relaxed'])} | "
            f"{_pct(sh['strict'])} / {_pct(sh['relaxed'])} | "
            f"{_pct(bh['strict'])} / {_pct(bh['relaxed'])} | "
            f"{100 * ds:+.1f}, {100 * dr:+.1f} |"
        )
    return out


def summary_table(results: dict[str, Any]) -> list[str]:
    """How many days meet each target (the lab half of the issue's must-show)."""
    lines = ["## The targets at a glance", "",
             "Per set of days: how many meet each target. Best static: the static split with the "
             "best objective; the planner's strict and relaxed must each be within 1 point of "
             "its. Oracle: the planner's objective at least 95% of the oracle's (its dynamic "
             "program's value). Hours: in every hour, within 3 points of the better of "
             "all-speculative and all-baseline, read three ways: each tier against the better "
             "of the two in that tier (tiers); both tiers against the pure split with the "
             "better objective that hour (pure); the objective (objective). Reachable: days "
             "where some schedule with the same restarts meets the hours (tiers) at all (the "
             "oracle's program re-weighted per hour and tier, `fleet_oracle.hour_reach`). "
             "Flat: no switch.", "",
             "| set | regime | days | strict and relaxed >= best static − 1 | >= 95% of oracle | "
             "every hour >= better pure − 3 (tiers / pure / objective) | reachable (tiers) | "
             "floor held |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for section in ("main", "held_out"):
        for reg in REGIMES:
            evs = [ev for ev in results.get(section, []) if ev["regime"] == reg]
            if not evs:
                continue
            c = [ev["checks"] for ev in evs]
            static = sum(min(x["vs_best_static_strict"], x["vs_best_static_relaxed"]) >= -0.01
                         for x in c)  # fmt: skip
            oracle = sum(x.get("of_oracle", 0.0) >= 0.95 for x in c)
            tiers = sum(min(x["worst_hour"]["strict"], x["worst_hour"]["relaxed"]) >= -0.03
                        for x in c)  # fmt: skip
            obj = sum(x["worst_hour"]["objective"] >= -0.03 for x in c)
            pure = sum(x["worst_hour"].get("pure", -1.0) >= -0.03 for x in c)
            floor = sum(x["floor_held"] for x in c)
            reach = sum(x.get("hour_reach", {}).get("worst", -1.0) >= -0.03 for x in c)
            name = section.replace("_", "-")
            lines.append(f"| {name} | {reg} | {len(c)} | {static} | {oracle} | "
                         f"{tiers} / {pure} / {obj} | {reach} | {floor} |")  # fmt: skip
    flat = results.get("flat", [])
    if flat:
        still = sum(ev["rows"]["planner"]["switches"] == 0 for ev in flat)
        lines.append(
            f"| flat | all | {len(flat)} | — | — | no switch: {still} of {len(flat)} | — | — |"
        )
    return lines + [""]


def _sockets(reg: str, k: int) -> tuple[float, float] | None:
    """The static split's row over sockets (``bench/results/fleet/``), if run."""
    path = RESULTS / "fleet" / f"{reg}.static{k}.json"
    if not path.exists() and k == 0:
        path = RESULTS / "fleet" / "eagle3.static0.json"
    if not path.exists():
        return None
    s = json.loads(path.read_text())["summary"]
    return (s["goodput_strict"], s["goodput_relaxed"])


def model_day_table(results: dict[str, Any]) -> list[str]:
    """The model's day per static split against the lab and the sockets."""
    evs = [ev for ev in results.get("main", []) if ev.get("model_day")]
    if not evs:
        return []
    w = results["strict_weight"]
    lines = [
        "## The planner's model of the main day against the lab and the sockets",
        "",
        "Each static split over the main day: what the planner's goodput model expects "
        "(minute by minute at the envelope's rate), pricing the `slo` router as its best spill "
        "threshold (now) or spillover at the crossover (before), against the lab's run behind "
        "the lab's router and the run over sockets (`bench/results/fleet.md`, the day "
        "compressed 48x: transients weigh more there). strict / relaxed %, and the model's "
        "error on the objective in points.",
        "",
        "| regime | split | model (slo) | model (spillover) | lab | sockets | error slo model "
        "vs lab / sockets | error spillover model vs lab / sockets |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def obj(x: Sequence[float]) -> float:
        return float(w * x[0] + (1 - w) * x[1])

    def two(x: Sequence[float] | None) -> str:
        return "—" if x is None else f"{_pct(x[0])} / {_pct(x[1])}"

    def err(m: Sequence[float], x: Sequence[float] | None) -> str:
        return "—" if x is None else f"{100 * (obj(m) - obj(x)):+.1f}"

    for ev in evs:
        md = ev["model_day"]
        for k in range(ENGINES + 1):
            lab = ev["rows"][f"static {k}"]
            labv = (lab["strict"], lab["relaxed"])
            sock = _sockets(ev["regime"], k)
            ms, mp = md["slo"][str(k)], md["spillover"][str(k)]
            lines.append(
                f"| {ev['regime']} | {k} | {two(ms)} | {two(mp)} | {two(labv)} | {two(sock)} | "
                f"{err(ms, labv)} / {err(ms, sock)} | {err(mp, labv)} / {err(mp, sock)} |"
            )
    lines.append("")
    return lines


def reach_table(results: dict[str, Any]) -> list[str]:
    """The per-hour target against what any schedule with the same restarts can do."""
    evs = [ev for sec in ("main", "held_out") for ev in results.get(sec, [])
           if ev["checks"].get("hour_reach")]  # fmt: skip
    if not evs:
        return []
    w = results["strict_weight"]
    lines = [
        "## The per-hour target: can any schedule meet it?",
        "",
        "Every hour within 3 points of the better of all-speculative and all-baseline, each "
        "tier (the strictest reading). Worst hour: the lowest of the hours' strict and relaxed "
        "gaps, points. The day's oracle maximises the day's objective; *any schedule* is the "
        "oracle's program re-weighted per hour and tier until the hours are met or 40 rounds "
        "pass (`fleet_oracle.hour_reach`, valued like the oracle: each minute from the static "
        "runs), with its day objective: what meeting the hours costs the day. Bounds from "
        "above (no schedule does better) and the clause's other readings: "
        "`bench/results/fleet-hours.md`.",
        "",
        "| set | regime | workload | planner worst hour | oracle worst hour | any schedule: best "
        "worst hour | its objective % (switches) | planner / best static objective % |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for ev in evs:
        c = ev["checks"]
        r = c["hour_reach"]
        wh = c["worst_hour"]
        best = ev["rows"][f"static {ev['best_static']}"]
        lines.append(
            f"| {'held-out' if ev['held_out'] else 'main'} | {ev['regime']} | {ev['workload']} "
            f"| {100 * min(wh['strict'], wh['relaxed']):+.1f} | {100 * r['worst_oracle']:+.1f} "
            f"| {100 * r['worst']:+.1f} | {100 * r['objective']:.1f} ({r['switches']}) | "
            f"{100 * ev['rows']['planner']['objective']:.1f} / {100 * objective(best, w):.1f} |"
        )
    lines.append("")
    return lines


def _reach(c: dict[str, Any]) -> str:
    r = c.get("hour_reach")
    if not r:
        return "—"
    return (f"{100 * r['worst']:+.1f} ({100 * r['worst_oracle']:+.1f}), objective "
            f"{100 * r['objective']:.1f}%, {r['switches']} switches")  # fmt: skip


def _router_text(results: dict[str, Any]) -> str:
    if results.get("router", "slo") == "spillover":
        return "spillover at the crossover (see `bench/lab/fleet_sim.py`)"
    return (
        "the one users run: `spec-router serve`'s decision shell with its default policy "
        "`slo` (`bench/lab/fleet_router.py`: the router's own Decider on the fleet's model "
        "table, learning off)"
    )


def report(results: dict[str, Any], command: str) -> str:
    w = results["strict_weight"]
    lines = [
        "# Fleet lab: how many engines speculate",
        "",
        f"    {command}",
        "",
        f"Generated by `bench/lab/fleet_lab.py` ({results['minutes']:.1f} min on this machine). "
        f"N = {ENGINES} engines; the router is {_router_text(results)}; "
        f"the objective is {w:g} x strict + {1 - w:g} x relaxed goodput. Strict: TTFT <= 1 s "
        "and TPOT <= 25 ms; relaxed: 3 s and 50 ms. Shares are of every request that arrived; "
        "good tok/s counts the output tokens of requests within the relaxed SLO. Restart "
        "engine-s: seconds engines spent out of service restarting (drains apart).",
        "",
        *([f"Run on: {'; '.join(results['ran'])}.", ""] if results.get("ran") else []),
        *summary_table(results),
    ]
    for section, title in (
        ("main", "The compressed day (tuning set)"),
        ("held_out", "Held-out workloads"),
        ("flat", "Flat load: the planner must not switch"),
    ):
        evs = results.get(section, [])
        if not evs:
            continue
        lines += [f"## {title}", ""]
        if section == "flat":
            lines += [
                "| regime | load | planner split (start) | switches | strict % | "
                "relaxed % | best static (strict / relaxed) |",
                "|---|---|---|---|---|---|---|",
            ]
            for ev in evs:
                p = ev["rows"]["planner"]
                b = ev["rows"][f"static {ev['best_static']}"]
                lines.append(
                    f"| {ev['regime']} | {ev['workload']} | {p['start']} | "
                    f"{p['switches']} | {_pct(p['strict'])} | {_pct(p['relaxed'])} | "
                    f"{ev['best_static']}: {_pct(b['strict'])} / {_pct(b['relaxed'])} |"
                )
            lines.append("")
            continue
        if section == "held_out":
            lines += [
                "| regime | workload | planner strict / relaxed | best static (k) | "
                "oracle | planner/oracle | worst hour vs better pure (strict, relaxed; "
                "pure; objective) | any schedule's best worst hour (the oracle's) |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for ev in evs:
                c = ev["checks"]
                p = ev["rows"]["planner"]
                b = ev["rows"][f"static {ev['best_static']}"]
                o = ev["rows"].get("oracle")
                ot = f"{_pct(o['strict'])} / {_pct(o['relaxed'])}" if o else "—"
                of = f"{100 * c['of_oracle']:.0f}%" if "of_oracle" in c else "—"
                wh = c["worst_hour"]
                lines.append(
                    f"| {ev['regime']} | {ev['workload']} | {_pct(p['strict'])} / "
                    f"{_pct(p['relaxed'])} | {_pct(b['strict'])} / {_pct(b['relaxed'])} "
                    f"({ev['best_static']}) | {ot} | {of} | {100 * wh['strict']:+.1f}, "
                    f"{100 * wh['relaxed']:+.1f}; {100 * wh.get('pure', math.nan):+.1f}; "
                    f"{100 * wh['objective']:+.1f} | {_reach(c)} |"
                )
            lines.append("")
            continue
        for ev in evs:
            c = ev["checks"]
            lines += [
                f"### {ev['regime']}: {ev['workload']}",
                "",
                f"{ev['envelope']}; {ev['requests']} requests, all-baseline SLO capacity "
                f"{ev['capacity']:.2f} req/s, spillover threshold {ev['threshold']}.",
                "",
            ]
            lines += table(ev, w)
            wh = c["worst_hour"]
            lines += [
                "",
                f"Targets: planner − best static: strict {100 * c['vs_best_static_strict']:+.1f} "
                f"pt, relaxed {100 * c['vs_best_static_relaxed']:+.1f} pt (>= −1); planner / "
                f"oracle objective {100 * c.get('of_oracle', math.nan):.1f}% (>= 95%); worst hour "
                f"against the better of all-spec and all-base: strict {100 * wh['strict']:+.1f}, "
                f"relaxed {100 * wh['relaxed']:+.1f}, both tiers against the hour's better pure "
                f"split by the objective {100 * wh.get('pure', math.nan):+.1f}, objective "
                f"{100 * wh['objective']:+.1f} pt "
                f"(>= −3); floor held at every switch that began with the split covering the "
                f"upper forecast: {c['floor_held']} ({c['switches_short']} began short). "
                f"The hours (tiers) by any schedule with the same restarts: best worst hour "
                f"{_reach(c)} (the day's oracle's in brackets).",
                "",
            ]
            lines += hourly_table(ev)
            floors = ev["rows"]["planner"]["floors"]
            if floors:
                lines += [
                    "",
                    "The planner's switches: when, into what, the upper forecast's peak "
                    "over the restart (need), what the engines staying up serve within the "
                    "SLO (have), and the highest minute of arrivals while it restarted:",
                    "",
                    "| at h | into | need /s | have /s | short already | actual peak /s |",
                    "|---|---|---|---|---|---|",
                ]
                for f in floors:
                    lines.append(
                        f"| {f['t'] / HOUR:.2f} | {f['mode']} | {f['need']:.2f} | "
                        f"{f['have']:.2f} | {'yes' if f['short'] else 'no'} | "
                        f"{f['actual_peak']:.2f} |"
                    )
            lines.append("")
    lines += reach_table(results)
    lines += model_day_table(results)
    if "calibration" in results:
        lines += [
            "## The planner's goodput model against the lab",
            "",
            "Static splits at flat Poisson loads (1 h each, "
            + ", ".join(f"{int(100 * x)}%" for x in LOADS)
            + " of the all-baseline capacity), every "
            "split of 4 engines, behind the lab's router "
            f"({results.get('router', 'slo')}); mean and worst absolute error in points, "
            "and the regret of choosing the split the model prefers (lab objective of the "
            "lab's best split minus that of the model's choice), for the planner's model "
            "(the slo router as its best spill threshold, `router.plan.goodput.best_spill`) "
            "and for the model of spillover at the crossover (the planner's model before).",
            "",
            "| regime | workload | model | strict MAE | relaxed MAE | objective MAE | "
            "objective max | regret mean | regret max | cells over 1 pt |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for c in results["calibration"]:
            for label, key in (("best threshold", "summary"), ("crossover", "spill_summary")):
                s = c.get(key)
                if s is None:
                    continue
                lines.append(
                    f"| {c['regime']} | {c['workload']} | {label} | {s['strict_mae']:.1f} | "
                    f"{s['relaxed_mae']:.1f} | {s.get('objective_mae', math.nan):.1f} | "
                    f"{s.get('objective_max', math.nan):.1f} | {s['regret_mean']:.2f} | "
                    f"{s['regret_max']:.2f} | {100 * s['regret_over_1pt']:.0f}% |"
                )
        lines.append("")
    if "forecast" in results:
        lines += [
            "## The forecast",
            "",
            "Holt's damped trend fed per-minute arrival rates (`router/plan/forecast.py`): "
            "mean absolute percentage error of the point 10, 30 and 60 min ahead against the "
            "envelope's true rate (traces: their own rate smoothed over five minutes), and "
            "how often the upper band's peak over the next restart (10 min) covers the "
            "true peak there.",
            "",
            "| series | MAPE 10 min | 30 min | 60 min | upper covers restart peak |",
            "|---|---|---|---|---|",
        ]
        for f in results["forecast"]:
            lines.append(
                f"| {f['series']} | {f.get('mape_10min', math.nan):.1f}% | "
                f"{f.get('mape_30min', math.nan):.1f}% | {f.get('mape_60min', math.nan):.1f}% "
                f"| {f['upper_covers_restart_peak']:.0f}% |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def _rounded(x: Any) -> Any:
    """Floats to five significant digits (the JSON is for reading and plotting)."""
    if isinstance(x, float):
        return float(f"{x:.5g}") if math.isfinite(x) else str(x)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_rounded(v) for v in x]
    return x


def _task(args: tuple[str, Workload, Params, str, str]) -> tuple[str, dict[str, Any]]:
    reg, wl, params, section, router = args
    ev = evaluate(reg, wl, params, router)
    ev["checks"] = checks(ev, params.strict_weight)
    print(f"  {section:8s} {reg:13s} {wl.name:40s} {ev['seconds']:.0f} s", flush=True)
    return section, ev


def _calibration_task(args: tuple[str, str, float, str]) -> dict[str, Any]:
    reg, kind, hot, router = args
    rows = calibrate(reg, kind, hot, ENGINES, LOADS, 1.0, 1, router)
    return {
        "regime": reg,
        "workload": f"{kind}, {int(100 * hot)}% at T=1",
        "summary": summary(rows),
        "spill_summary": summary(rows, which="spill_model"),
        "rows": [asdict(r) for r in rows],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--regimes", default=",".join(REGIMES))
    ap.add_argument(
        "--only", default="main,held_out,flat,calibration,forecast", help="sections to run"
    )
    ap.add_argument("--quick", action="store_true", help="the main day, eagle3 only")
    ap.add_argument("--strict-weight", type=float, default=None)
    ap.add_argument("--overload-charge", type=float, default=None)
    ap.add_argument("--seasonal-prior", type=float, default=None)
    ap.add_argument(
        "--var-step",
        type=float,
        default=None,
        help="the forecast's ForecastParams.var_step (0: the errors' squares)",
    )
    ap.add_argument("--workloads", default="", help="held-out days whose name has one of these "
                    "(comma-separated); default: all")  # fmt: skip
    ap.add_argument("--seeds", default="", help="more held-out days: the main day's envelope "
                    "with these seeds (comma-separated)")  # fmt: skip
    ap.add_argument("--merge", default="", help="JSON files of earlier runs (comma-separated): "
                    "their sections joined into one report, nothing run (a long sweep split "
                    "into several holds of the CPU lock)")  # fmt: skip
    ap.add_argument("--router", default="slo", choices=("slo", "spillover"),
                    help="the router in front: its default policy, or spillover")  # fmt: skip
    ap.add_argument(
        "--planner-only",
        action="store_true",
        help="the planner's rows alone, printed and written to --out as JSON",
    )
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS / "fleet-lab"))
    args = ap.parse_args(argv)
    params = Params()
    # the lab's day is eight hours of one-minute intervals
    if args.strict_weight is not None:
        params = params._replace(strict_weight=args.strict_weight)
    if args.overload_charge is not None:
        params = params._replace(overload_charge=args.overload_charge)
    if args.seasonal_prior is not None:
        fp = params.forecast._replace(seasonal_prior=args.seasonal_prior)
        params = params._replace(forecast=fp)
    if args.var_step is not None:
        params = params._replace(forecast=params.forecast._replace(var_step=args.var_step))
    if args.merge:
        return merge([Path(x) for x in args.merge.split(",") if x], Path(args.out), argv)
    picks = [x for x in args.workloads.split(",") if x]
    held_out = [w for w in HELD_OUT if not picks or any(x in w.name for x in picks)]
    held_out += [replace(MAIN, name=f"day, seed {int(x)}", seed=int(x), held_out=True)
                 for x in args.seeds.split(",") if x]  # fmt: skip
    regimes = ["eagle3"] if args.quick else args.regimes.split(",")
    only = {"main"} if args.quick else set(args.only.split(","))
    t0 = time.time()
    tasks = []
    if "main" in only:
        tasks += [(reg, wl, params, "main", args.router) for reg in regimes for wl in TUNING[:1]]
    if "held_out" in only:
        tasks += [(reg, wl, params, "held_out", args.router) for reg in regimes for wl in held_out]
    if "flat" in only:
        tasks += [(reg, wl, params, "flat", args.router) for reg in regimes for wl in FLAT]
    if args.planner_only:
        return _planner_only(tasks, args, argv)
    results: dict[str, Any] = {
        "strict_weight": params.strict_weight,
        "params": params._asdict(),
        "router": args.router,
    }
    with multiprocessing.Pool(args.jobs) as pool:
        for section, ev in pool.imap(_task, tasks):
            results.setdefault(section, []).append(ev)
        if "calibration" in only:
            cal = [
                (reg, kind, hot, args.router)
                for reg in regimes
                for kind, hot in (("conv", 0.8), ("conv", 0.0), ("conv", 1.0), ("code", 0.8))
            ]
            results["calibration"] = pool.map(_calibration_task, cal)
    if "forecast" in only:
        results["forecast"] = forecast_report(params)
    results["minutes"] = (time.time() - t0) / 60
    results["ran"] = [_ran(t0)]
    command = "python bench/lab/fleet_lab.py " + shlex.join(
        argv if argv is not None else sys.argv[1:]
    )
    results["command"] = command.strip()
    out = Path(args.out)
    out.with_suffix(".md").write_text(report(results, command.strip()))
    out.with_suffix(".json").write_text(json.dumps(_rounded(results), separators=(",", ":")))
    print(f"wrote {out.with_suffix('.md')} ({results['minutes']:.1f} min)")
    return 0


def _planner_task(args: tuple[str, Workload, Params, str, str]) -> dict[str, Any]:
    reg, wl, params, section, router = args
    got = planner_only(reg, wl, params, router)
    p = got["planner"]
    splits = [(round(t / HOUR, 2), k) for t, k, _ in p["timeline"]]
    print(f"  {section:8s} {reg:13s} {wl.name:40s} planner {100 * p['strict']:.1f} / "
          f"{100 * p['relaxed']:.1f}, {p['switches']} switches, splits {splits} "
          f"({got['seconds']:.0f} s)", flush=True)  # fmt: skip
    return {"section": section, **got}


def _planner_only(tasks: list[tuple[str, Workload, Params, str, str]], args: argparse.Namespace,
                  argv: list[str] | None) -> int:  # fmt: skip
    t0 = time.time()
    with multiprocessing.Pool(args.jobs) as pool:
        rows = pool.map(_planner_task, tasks)
    command = "python bench/lab/fleet_lab.py " + shlex.join(
        argv if argv is not None else sys.argv[1:]
    )
    doc = {"command": command, "ran": _ran(t0), "rows": rows}
    Path(args.out).with_suffix(".json").write_text(json.dumps(_rounded(doc), indent=1) + "\n")
    return 0


def _ran(t0: float) -> str:
    """This tree's commit and the run's start and end (UTC), for the report."""
    here = Path(__file__).resolve().parent
    got = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                         text=True, check=False)  # fmt: skip
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "../../router"], cwd=here,
                           capture_output=True, text=True, check=False)  # fmt: skip
    head = (got.stdout.strip() or "unknown") + ("+dirty" if dirty.stdout.strip() else "")
    fmt = "%Y-%m-%d %H:%M"
    return f"{head}, {time.strftime(fmt, time.gmtime(t0))}-{time.strftime('%H:%M', time.gmtime())}"


def merge(paths: Sequence[Path], out: Path, argv: list[str] | None) -> int:
    """One report from several runs' JSON (same parameters): sections joined in order."""
    runs = [json.loads(x.read_text()) for x in paths]
    results: dict[str, Any] = {k: runs[0][k] for k in ("strict_weight", "params", "router")}
    for r in runs:
        if r["params"] != results["params"] or r.get("router") != results["router"]:
            raise SystemExit(f"cannot merge runs with other parameters or router: {paths}")
        for key in ("main", "held_out", "flat", "calibration", "forecast"):
            if key in r:
                results.setdefault(key, []).extend(r[key])
    results["minutes"] = sum(r["minutes"] for r in runs)
    results["ran"] = [x for r in runs for x in r.get("ran", [])]
    here = "python bench/lab/fleet_lab.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    commands = [r.get("command", "?") for r in runs] + [here.strip()]
    results["command"] = "\n    ".join(commands)
    out.with_suffix(".md").write_text(report(results, results["command"]))
    out.with_suffix(".json").write_text(json.dumps(_rounded(results), separators=(",", ":")))
    print(f"wrote {out.with_suffix('.md')} from {len(runs)} runs")
    return 0


if __name__ == "__main__":
    del trace_lengths
    raise SystemExit(main())
