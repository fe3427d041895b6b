"""``spec-router fleet``: N simulated engines that switch mode, a router, its planner, a day.

Starts N sims (``router.sim``) on their own loopback addresses behind a small DNS zone (one
name per pool, as headless Services), a router that finds them by DNS discovery, with its fleet
planner on (``--split planner``: an actuator follows ``GET /router/plan``, draining an engine,
restarting it in the other mode and moving its address to the other name) or off
(``--split static:K``: K engines speculative all day). Then it replays a day open-loop through
the router (``router.tools.replay``) and writes every request, the summary and per-hour buckets
(``--out``), a markdown report and a PNG of the load, the split and goodput per hour.

Time: the engines run ``--time-scale`` wall seconds per model second; the day (its envelope,
``--restart-s``, the planner's minutes) runs ``--compress`` times faster than the engines, so
an 8-hour day can be played in minutes while each request still takes its model time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from router.plan import Mix
from router.planning.service import Sample
from router.sim.model import PRESETS, REGIMES
from router.tools.fleet.report import Progress, plot, write_report
from router.tools.fleet.run import FleetConfig, run_fleet, yesterday_mix
from router.tools.fleet.score import summarize
from router.tools.fleet.workload import (
    HOUR,
    SHAPES,
    Envelope,
    LengthSource,
    arrivals,
    engine_slo_capacity,
    expected_per_minute,
    rescale,
)
from router.tools.replay_report import _clean
from router.tools.traffic import (
    Arrival,
    Lengths,
    cap_lengths,
    load_trace,
    window,
    with_temperatures,
)

FORMAT = "spec-router-fleet/1"
EXAMPLES = """\
examples:
  # a compressed 8-hour day with a 10-minute x3 surge, the planner deciding, eagle3 engines
  spec-router fleet --engines 4 --split planner --synthetic surge --hours 8 \\
      --lengths /work/shared/traces/azure-llm-2023-conv.csv --compress 48 --time-scale 0.5 \\
      --out fleet.json
  # the same day with 3 engines speculative all day
  spec-router fleet --engines 4 --split static:3 --synthetic surge --hours 8 --compress 48 \\
      --time-scale 0.5 --out fleet-static3.json
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spec-router fleet",
        description="Run N simulated engines that can switch between speculative and baseline "
        "mode, a router that finds them by DNS, its fleet planner acting on them (or a static "
        "split), and an open-loop day of traffic; score goodput per hour.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--engines", type=int, default=4, help="engines in the fleet (default 4)")
    p.add_argument(
        "--split",
        default="planner",
        help="planner: the router's planner moves engines; static:K: K speculative all day",
    )
    p.add_argument(
        "--start", type=int, help="planner: engines speculative at the start (default: all)"
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--trace", help="replay this trace's arrivals (Azure CSV or Mooncake JSONL)"
    )
    source.add_argument("--synthetic", choices=SHAPES, help="a day under this envelope")
    p.add_argument("--hours", type=float, default=8.0, help="the day's length (day hours)")
    p.add_argument("--lo", type=float, default=0.10, help="trough, share of all-baseline capacity")
    p.add_argument("--hi", type=float, default=1.10, help="peak (flat: the level)")
    p.add_argument("--surge-at", type=float, default=1.5, help="surge: day hour it starts")
    p.add_argument("--surge-minutes", type=float, default=10.0)
    p.add_argument("--surge-factor", type=float, default=3.0)
    p.add_argument(
        "--lengths", help="draw (prompt, output) pairs from this trace (default: lognormals)"
    )
    p.add_argument("--temperature-share", type=float, default=0.8, help="share at temperature 1")
    p.add_argument("--max-output", type=int, default=1000, help="cap output lengths")
    p.add_argument(
        "--preset",
        "--regime",
        dest="regime",
        choices=REGIMES,
        default="eagle3",
        help="the speculative engines' preset (the baseline ones run `baseline`)",
    )
    p.add_argument(
        "--restart-s",
        type=float,
        help="day seconds an engine is out of service to switch (default: the presets' "
        "start-up, 550 s speculative / 510 s baseline, averaged)",
    )
    p.add_argument("--time-scale", type=float, default=0.5, help="the sims' --time-scale")
    p.add_argument(
        "--compress", type=float, default=1.0, help="day seconds per engine second (default 1)"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--until-switches", type=int, metavar="N",
                   help="end the day once N switches have landed (a smoke test of the "
                        "actuation); the arrivals after that are not sent")  # fmt: skip
    p.add_argument("--no-yesterday", action="store_true", help="planner: no day before seen")
    p.add_argument("--out", help="write the run as JSON here (and .md, .png beside it)")
    p.add_argument("--keep", help="keep the run's directory (logs, table) here")
    return p


def parse_split(text: str, n: int) -> tuple[bool, int | None]:
    if text == "planner":
        return True, None
    if text.startswith("static:"):
        try:
            k = int(text.split(":", 1)[1])
        except ValueError:
            k = -1
        if 0 <= k <= n:
            return False, k
    raise ValueError(f"--split must be `planner` or `static:K` with 0 <= K <= {n}")


@dataclass(frozen=True)
class Day:
    """The day the options describe (day seconds; rates per engine second)."""

    arrivals: list[Arrival]
    seconds: float
    envelope: Envelope | None  # None: a trace's own arrivals
    capacity: float  # the all-baseline fleet's SLO capacity, requests per engine second
    prompt_mean: float
    output_mean: float
    yesterday: tuple[float, ...]  # the day before, arrivals per day second per minute
    label: str
    # the mix a router that served the day before kept (``yesterday_mix``), and its requests
    yesterday_mix: tuple[Mix, Sample] | None = None


def build_day(ns: argparse.Namespace) -> Day:
    """The arrivals, the envelope and yesterday's counts (raises ``OSError`` / ``ValueError``
    for a file that cannot be read or an empty day)."""
    base, hot = PRESETS["baseline"], ns.temperature_share
    if ns.trace:
        trace = load_trace(ns.trace)
        day = with_temperatures(cap_lengths(window(trace, 0.0, ns.hours * HOUR), None,
                                            ns.max_output), hot, ns.seed)  # fmt: skip
        if not day:
            raise ValueError(f"{ns.trace} has no arrival within the first {ns.hours:g} h")
        lengths = LengthSource([(a.prompt_tokens, a.output_tokens) for a in day])
    elif ns.lengths:
        pairs = [(a.prompt_tokens, min(a.output_tokens, ns.max_output))
                 for a in load_trace(ns.lengths)]  # fmt: skip
        lengths = LengthSource(pairs)
    else:
        lengths = LengthSource(
            prompt=Lengths(1020.0, 1.0, 16, 8192), output=Lengths(129.0, 0.86, 4, ns.max_output)
        )
    prompt, output = lengths.means()
    capacity = ns.engines * engine_slo_capacity(base, prompt, output, hot)
    if ns.trace:
        return Day(day, ns.hours * HOUR, None, capacity, prompt, output, (),
                   f"trace {Path(ns.trace).name}, its first {ns.hours:g} h")  # fmt: skip
    env = Envelope(ns.synthetic, ns.hours, ns.lo, ns.hi, ns.surge_at * HOUR,
                   ns.surge_minutes * 60, ns.surge_factor)  # fmt: skip
    # capacity is per engine second; the day plays `compress` day seconds per engine second
    day = arrivals(env, capacity / ns.compress, lengths, hot, ns.seed)
    if not day:
        raise ValueError("the day has no arrival (raise --hi or --hours)")
    yesterday: tuple[float, ...] = ()
    if not ns.no_yesterday:
        # the usual day (no surge), as its mean rate a minute: a compressed day has a few
        # arrivals per planner minute, and a shape from counts that noisy made the seasonal
        # forecast spike (and the planner's goodput model crawl at the spikes' rates)
        calm = Envelope("flat" if ns.synthetic == "flat" else "diurnal", ns.hours, ns.lo, ns.hi)
        yesterday = expected_per_minute(calm, capacity / ns.compress)
        # its requests: the same lengths and temperatures, another draw (the day before)
        before = arrivals(calm, capacity / ns.compress, lengths, hot, ns.seed - 1)
        mixed = yesterday_mix(before) if before else None
        return Day(day, env.duration, env, capacity, prompt, output, yesterday, env.label(),
                   mixed)  # fmt: skip
    return Day(day, env.duration, env, capacity, prompt, output, yesterday, env.label())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    args = sys.argv[1:] if argv is None else argv
    if ns.engines < 1:
        parser.error("--engines must be >= 1")
    if ns.time_scale <= 0 or ns.compress <= 0 or ns.hours <= 0:
        parser.error("--time-scale, --compress and --hours must be > 0")
    try:
        planner, k = parse_split(ns.split, ns.engines)
    except ValueError as exc:
        parser.error(str(exc))
    if planner:
        k = ns.engines if ns.start is None else ns.start
        if not 0 <= k <= ns.engines:
            parser.error(f"--start must be within 0..{ns.engines}")
    assert k is not None
    spec, base = PRESETS[ns.regime], PRESETS["baseline"]
    restart = ns.restart_s if ns.restart_s is not None else (spec.startup + base.startup) / 2
    try:
        d = build_day(ns)
    except (OSError, ValueError, KeyError) as exc:
        parser.error(f"cannot build the day: {exc}")
    day, day_seconds, env, capacity = d.arrivals, d.seconds, d.envelope, d.capacity
    prompt, output, hot = d.prompt_mean, d.output_mean, ns.temperature_share
    engine_arrivals = rescale(day, ns.compress)
    cfg = FleetConfig(
        engines=ns.engines, speculative=k, planner=planner, spec=spec, base=base,
        time_scale=ns.time_scale, compress=ns.compress, restart_s=restart,
        day_seconds=day_seconds, mean_prompt=prompt, mean_output=output, yesterday=d.yesterday,
        yesterday_mix=d.yesterday_mix,
        until_switches=ns.until_switches,
    )  # fmt: skip
    progress = Progress(sys.stderr, ns.time_scale, ns.compress, len(engine_arrivals))
    began = time.time()
    run = asyncio.run(
        run_fleet(cfg, engine_arrivals, progress.watch, Path(ns.keep) if ns.keep else None)
    )
    summary = summarize(run.results, run.timeline.outages, day_seconds, ns.compress)
    progress.finished(summary)
    meta: dict[str, Any] = {
        "command": shlex.join(["spec-router", "fleet", *args]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(began)),
        "wall_s": round(time.time() - began, 1),
        "engines": ns.engines,
        "split": ns.split,
        "start_speculative": k,
        "regime": ns.regime,
        "workload": d.label,
        "lengths": ns.lengths or "lognormal (replay's defaults)",
        "temperature_share": hot,
        "capacity_rps": capacity,
        "hours": day_seconds / HOUR,
        "restart_s": restart,
        "time_scale": ns.time_scale,
        "compress": ns.compress,
        "seed": ns.seed,
        "in_flight_after": run.timeline.in_flight_after,
        "plans_seen": run.timeline.plans_seen if planner else None,
        "cpu": run.timeline.cpu,
    }
    doc = {
        "format": FORMAT,
        "meta": meta,
        "summary": summary,
        "split": [list(row) for row in run.timeline.split],
        "outages": [o._asdict() for o in run.timeline.outages],
        "advice": run.timeline.plans,
        "last_plan": run.timeline.last_plan,
        "load": load_per_bucket(day, day_seconds, env, capacity / ns.compress),
        "results": [asdict(r) for r in run.results],
    }
    if ns.out:
        out = Path(ns.out)
        out.write_text(json.dumps(_clean(doc), allow_nan=False) + "\n")
        write_report(out.with_suffix(".md"), doc)
        try:
            plot(doc, out.with_suffix(".png"))
        except ImportError:
            print("spec-router fleet: no matplotlib (pip install 'spec-router[plot]'): no PNG",
                  file=sys.stderr)  # fmt: skip
    return 0


def load_per_bucket(
    day: list[Any], day_seconds: float, env: Envelope | None, capacity_day: float,
    minutes: float = 10.0,
) -> list[dict[str, float]]:  # fmt: skip
    """Arrivals per ``minutes`` of the day as a share of the all-baseline capacity."""
    step = minutes * 60
    n = max(1, math.ceil(day_seconds / step))
    counts = [0] * n
    for a in day:
        counts[min(n - 1, int(a.at // step))] += 1
    return [
        {
            "t_h": (i + 0.5) * step / HOUR,
            "share": counts[i] / step / capacity_day,
            "envelope": env.share((i + 0.5) * step) if env is not None else math.nan,
        }
        for i in range(n)
    ]


if __name__ == "__main__":
    raise SystemExit(main())
