"""Routing policies on open-loop traffic: goodput under TTFT/TPOT SLOs (issue "Routing that
wins on real traffic", part 1).

For every workload x load x deployment, fresh simulated engines (time scale 0.25) and a fresh
router are started and ``spec-router replay`` sends the workload through the router open-loop.
Deployments: one eagle3 + one baseline sim behind the router under each policy in
``--policies`` (plus ``spec-router serve``'s default policy, if it is not listed), and two
references without spec-router's routing: two baseline sims, and two eagle3 sims, round-robin.
``--regime eagle3-chain`` (or ``eagle3-tree``) puts that speculative preset where eagle3 is
(docs/regimes.md); the routers then start with no table unless ``--table`` gives one
calibrated on that pair (the default table is eagle3 + baseline's).

Workloads: (a) the Azure conversation trace (``/work/shared/traces``), a window thinned to
``--loads`` times the capacity of the eagle3 + baseline pair; (b) bursty synthetic traffic
(on/off, 4x rate in 10-s bursts every 30 s, Azure-like lognormal lengths, half at temperature
1) at ``--bursty-loads`` times its capacity. Capacity: see ``capacity()``.

    python bench/traffic.py [--policies predictive,spillover,round_robin] [--repeat 2]

Routers on core 0; sims and the replay on core 1 (``taskset``). Writes bench/results/traffic.md,
traffic.json (every summary) and traffic.png.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from traffic_report import Run, plot, write  # noqa: E402

from router.settings import Settings  # noqa: E402
from router.sim.model import BASELINE, EAGLE3, PRESETS, REGIMES, Preset, closed_loop  # noqa: E402
from router.tools import goodput, traffic  # noqa: E402
from router.tools.demo import wait_ready  # noqa: E402
from router.tools.processes import running  # noqa: E402
from router.tools.replay_report import read_json  # noqa: E402

RESULTS = ROOT / "bench" / "results"
TRACE = Path("/work/shared/traces/azure-llm-2023-conv.csv")
TABLE = RESULTS / "calibration-traffic.json"
DEFAULT_POLICY: str = Settings.model_fields["policy"].default
# The bursty mix: the lengths are `spec-router replay`'s synthetic defaults (Azure-like).
BURSTY = [
    "--synthetic",
    "bursty",
    "--burst",
    "4",
    "--on-s",
    "10",
    "--off-s",
    "20",
    "--temperature-share",
    "0.5",
]
BURSTY_LENGTHS = (traffic.Lengths(1020, 1.0, 16, 8192), traffic.Lengths(129, 0.86, 4, 1000))


def pinned(core: int) -> list[str]:
    return ["taskset", "-c", str(core)] if (os.cpu_count() or 1) > 1 else []


def engine_capacity(p: Preset, prompt: float, output: float, hot_share: float) -> float:
    """Requests/s at which the engine's decode throughput saturates: the analytic closed loop
    (``router.sim.model.closed_loop``) with a full batch (``max_running``), for the workload's
    mean lengths and its mean acceptance length, as output tok/s over mean output tokens."""
    tau = (1 - hot_share) * p.tau + hot_share * p.tau_sampling
    point = closed_loop(p, p.max_running, round(prompt), round(output), tau=tau)
    return point.total_tps / output


def capacity(profile: traffic.Profile, spec: Preset = EAGLE3) -> float:
    """The ``spec`` + baseline pair's: the sum of both engines' saturation rates."""
    args = (profile.prompt_mean, profile.output_mean, profile.hot_share)
    return engine_capacity(spec, *args) + engine_capacity(BASELINE, *args)


@dataclass(frozen=True)
class Deployment:
    name: str
    sims: tuple[str, str]  # presets behind the speculative and the baseline pool
    policy: str | None  # None: whatever `spec-router serve` defaults to
    table: bool  # start with the calibrated table
    note: str


def deployments(
    policies: list[str], references: bool = True, regime: str = "eagle3"
) -> list[Deployment]:
    names = list(dict.fromkeys(policies))
    if DEFAULT_POLICY not in names:
        names.append(DEFAULT_POLICY)
    out = []
    for p in names:
        default = p == DEFAULT_POLICY
        label = f"{p} (serve default)" if default else p
        note = f"{regime} + baseline behind spec-router, SPEC_ROUTER_POLICY={p}" + (
            " (left unset: the default)" if default else ""
        )
        out.append(Deployment(label, (regime, "baseline"), None if default else p, True, note))
    if not references:
        return out
    out.append(
        Deployment(
            "2x baseline, round-robin",
            ("baseline", "baseline"),
            "round_robin",
            False,
            "two baseline sims, round-robin (no speculation)",
        )
    )
    out.append(
        Deployment(
            f"2x {regime}, round-robin",
            (regime, regime),
            "round_robin",
            False,
            f"two {regime} sims, round-robin (always speculation)",
        )
    )
    return out


@dataclass
class Case:
    """One workload at one load: the replay arguments (without --url) and its capacity."""

    workload: str
    load: float
    rate: float
    capacity: float
    args: list[str]
    profile: dict[str, float] = field(default_factory=dict)


def cases(ns: argparse.Namespace) -> list[Case]:
    out = []
    common = [
        "--duration",
        f"{ns.duration:g}",
        "--seed",
        str(ns.seed),
        "--warmup",
        f"{ns.warmup:g}",
        "--drain",
        f"{ns.drain:g}",
        "--time-scale",
        f"{ns.time_scale:g}",
    ]
    window = traffic.window(traffic.load_trace(ns.trace), ns.trace_start, ns.duration)
    if ns.trace_temperature_share:
        window = traffic.with_temperatures(window, ns.trace_temperature_share, ns.seed)
    conv = traffic.describe(window)
    spec = PRESETS[ns.regime]
    for load in ns.loads:
        rate = load * capacity(conv, spec)
        if rate > conv.count / ns.duration:
            raise SystemExit(
                f"bench: the trace window has {conv.count} requests in "
                f"{ns.duration:g} s, fewer than {rate:.3f} req/s needs"
            )
        hot = ["--temperature-share", f"{ns.trace_temperature_share:g}"]
        args = [
            *(hot if ns.trace_temperature_share else []),
            "--trace",
            str(ns.trace),
            "--start",
            f"{ns.trace_start:g}",
            "--rate",
            f"{rate:.4f}",
            *common,
        ]
        out.append(Case("azure-conv", load, rate, capacity(conv, spec), args, asdict(conv)))
    # Capacity from a long sample of the same generator (its mean lengths), not the short run.
    sample = traffic.on_off(1.0, 20000.0, *BURSTY_LENGTHS, temperature_share=0.5, seed=0)
    mix = traffic.describe(sample)
    for load in ns.bursty_loads:
        rate = load * capacity(mix, spec)
        out.append(
            Case(
                "bursty",
                load,
                rate,
                capacity(mix, spec),
                [*BURSTY, "--rate", f"{rate:.4f}", *common],
                asdict(mix),
            )
        )
    return out


def router_env(
    d: Deployment,
    urls: tuple[str, str],
    table: Path | None,
    time_scale: float,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The routers' environment (``extra``: ``--router-env``, on top of the rest)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_ROUTER_")}
    env |= {
        "SPEC_ROUTER_SPECULATIVE_URLS": urls[0],
        "SPEC_ROUTER_BASELINE_URLS": urls[1],
        "SPEC_ROUTER_LOG_LEVEL": "warning",
        # The router's core is shared with other work on this machine (README).
        "SPEC_ROUTER_BUSY_POLL_US": "0",
        # The strict SLO the runs are scored by, in the wall-clock time the router sees: the
        # sims run time_scale times faster than the model time the scores are in.
        "SPEC_ROUTER_SLO_TTFT_MS": f"{goodput.STRICT.ttft_s * 1000 * time_scale:g}",
        "SPEC_ROUTER_SLO_TPOT_MS": f"{goodput.STRICT.tpot_s * 1000 * time_scale:g}",
    }
    if d.policy is not None:
        env["SPEC_ROUTER_POLICY"] = d.policy
    if table is not None:
        env["SPEC_ROUTER_TABLE_PATH"] = str(table)
    return env | (extra or {})


def scaled_table(src: Path, time_scale: float, dest: Path) -> Path:
    """A copy of the table ``src`` at ``dest`` for sims at ``time_scale`` (the router writes
    what it learns back there): the table is in model time, the learner divides what it
    measures by the scale and multiplies predictions back."""
    doc = json.loads(src.read_text())
    doc["time_scale"] = time_scale
    dest.write_text(json.dumps(doc))
    return dest


def sims(stack: contextlib.ExitStack, presets: Sequence[str], time_scale: float) -> list[str]:
    """Fresh sims of ``presets`` (seeds 1, 2, ...) on core 1, stopped with ``stack``: URLs."""
    scale = ["--time-scale", f"{time_scale:g}"]
    return [
        stack.enter_context(
            running(
                [
                    "-m",
                    "router.sim",
                    "--port",
                    "0",
                    "--preset",
                    preset,
                    "--seed",
                    str(i + 1),
                    *scale,
                ],
                prefix=pinned(1),
            )  # fmt: skip
        ).url
        for i, preset in enumerate(presets)
    ]


def run_one(d: Deployment, case: Case, ns: argparse.Namespace, tmp: Path, tag: str) -> Run:
    table = None
    if d.table and ns.table:
        table = scaled_table(ns.table, ns.time_scale, tmp / f"{tag}.table.json")
    out = tmp / f"{tag}.json"
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        urls = sims(stack, d.sims, ns.time_scale)
        assert len(urls) == 2
        env = router_env(d, (urls[0], urls[1]), table, ns.time_scale, ns.router_env)
        router = stack.enter_context(
            running(["-m", "router", "serve", "--port", "0"], env, prefix=pinned(0))
        )
        wait_ready(router.url)
        cmd = [
            *pinned(1),
            sys.executable,
            "-m",
            "router",
            "replay",
            "--url",
            router.url,
            *case.args,
            "--out",
            str(out),
        ]
        done = subprocess.run(cmd, check=False)
    if done.returncode != 0:
        print(f"bench: {d.name} / {case.workload} {case.load:.0%}: replay failed", flush=True)
        return Run(d.name, case.workload, case.load, None, time.monotonic() - began)
    _, results = read_json(out)
    summary = goodput.summarize(goodput.scored(results, ns.warmup))
    return Run(d.name, case.workload, case.load, summary, time.monotonic() - began)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])

    def floats(text: str) -> list[float]:
        return [float(x) for x in text.split(",") if x]

    p.add_argument(
        "--policies",
        default="predictive,spillover,round_robin",
        help=f"comma-separated; the serve default ({DEFAULT_POLICY}) is always added",
    )
    p.add_argument(
        "--loads",
        type=floats,
        default=[0.3, 0.7, 1.1],
        help="Azure trace loads, as shares of the pair's capacity",
    )
    p.add_argument("--bursty-loads", type=floats, default=[0.7])
    p.add_argument("--duration", type=float, default=120.0, help="model seconds of traffic")
    p.add_argument("--warmup", type=float, default=10.0, help="model seconds left unscored")
    p.add_argument("--drain", type=float, default=60.0, help="model seconds to wait at the end")
    p.add_argument("--time-scale", type=float, default=0.25)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument(
        "--trace-start", type=float, default=600.0, help="skip the trace's first S s (it ramps up)"
    )
    p.add_argument(
        "--trace-temperature-share",
        type=float,
        default=0.0,
        help="share of the trace's requests sent at temperature 1 (it records none)",
    )
    p.add_argument(
        "--regime",
        choices=REGIMES,
        default="eagle3",
        help="the speculative sims' preset, paired with the baseline (docs/regimes.md)",
    )
    p.add_argument(
        "--table",
        type=Path,
        default=None,
        help="crossover table for the policies (default: the eagle3 + baseline calibration, "
        "for --regime eagle3 only)",
    )
    p.add_argument("--no-table", action="store_true", help="the routers start with no table")
    p.add_argument(
        "--no-references",
        dest="references",
        action="store_false",
        help="leave out the two-of-a-kind deployments (2x baseline, 2x the regime's)",
    )
    p.add_argument(
        "--router-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for the routers (e.g. SPEC_ROUTER_QUEUE_SIZE=0), repeatable",
    )
    p.add_argument("--out", type=Path, default=RESULTS / "traffic.md")
    p.add_argument("--note", default="", help="a line for the report's header")
    p.add_argument(
        "--report", action="store_true", help="only write the markdown and PNG from the JSON"
    )
    ns = p.parse_args()
    ns.policies = [x for x in ns.policies.split(",") if x]
    ns.router_env = dict(item.split("=", 1) for item in ns.router_env)
    if ns.no_table:
        ns.table = None
    elif ns.table is None and ns.regime == "eagle3":
        ns.table = TABLE
    return ns


def save(out: Path, meta: dict[str, Any], plan: list[Case], deps: list[Deployment],
         runs: list[Run]) -> None:  # fmt: skip
    """The markdown, the PNG and the JSON (from which ``--report`` writes the other two again)."""
    write(out, meta, plan, deps, runs)
    plot(out.with_suffix(".png"), plan, deps, runs)
    doc = {
        "meta": meta,
        "cases": [asdict(c) for c in plan],
        "deployments": [asdict(d) for d in deps],
        "runs": [r.as_dict() for r in runs],
    }
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")


def load(path: Path) -> tuple[dict[str, Any], list[Case], list[Deployment], list[Run]]:
    doc = json.loads(path.read_text())
    plan = [Case(**c) for c in doc["cases"]]
    deps = [Deployment(**{**d, "sims": tuple(d["sims"])}) for d in doc["deployments"]]
    return doc["meta"], plan, deps, [Run.from_dict(r) for r in doc["runs"]]


def _stop(signum: int, frame: object) -> None:
    # SIGTERM unwinds like Ctrl-C, so that every sim and router started is stopped (by PID)
    raise KeyboardInterrupt


def main() -> int:
    signal.signal(signal.SIGTERM, _stop)
    ns = parse_args()
    if ns.report:
        save(ns.out, *load(ns.out.with_suffix(".json")))
        print(f"written {ns.out} and {ns.out.with_suffix('.png')} from the JSON")
        return 0
    command = shlex.join(["python", "bench/traffic.py", *sys.argv[1:]])
    plan, deps = cases(ns), deployments(ns.policies, ns.references, ns.regime)
    runs: list[Run] = []
    table = None if ns.table is None else os.path.relpath(ns.table, ROOT)
    meta: dict[str, Any] = {
        "command": command, "loadavg_before": os.getloadavg(), "time_scale": ns.time_scale,
        "duration": ns.duration, "warmup": ns.warmup, "drain": ns.drain, "repeat": ns.repeat,
        "table": table, "note": ns.note, "regime": ns.regime,
    }  # fmt: skip
    began = time.monotonic()
    total = ns.repeat * len(plan) * len(deps)
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(ns.repeat):
            for case in plan:
                for d in deps:
                    tag = f"r{rep}-{case.workload}-{case.load:g}-{len(runs)}"
                    print(
                        f"bench: [{len(runs) + 1}/{total}] {case.workload} at "
                        f"{case.load:.0%} ({case.rate:.3f} req/s): {d.name}",
                        flush=True,
                    )
                    run = run_one(d, case, ns, Path(tmp), tag)
                    runs.append(run)
                    if run.summary is not None:
                        s = run.summary
                        print(
                            f"bench:   goodput strict {s.strict:.1%} relaxed {s.relaxed:.1%}"
                            f"  TTFT p99 {s.ttft_p99:.2f} s  TPOT p90 {s.tpot_p90 * 1e3:.1f} ms"
                            f"  ({run.seconds:.0f} s)",
                            flush=True,
                        )
                    meta |= {
                        "seconds": time.monotonic() - began,
                        "loadavg_after": os.getloadavg(),
                        "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    }
                    save(ns.out, meta, plan, deps, runs)  # after every run: partial results
    print(f"written {ns.out}, {ns.out.with_suffix('.png')}, {ns.out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
