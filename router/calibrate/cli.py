"""The ``spec-router calibrate`` command line (usage: ``spec-router calibrate --help``).

Exit status: 0 the table was written; 1 the sweep had errors or too few samples, so nothing was
written (the message names the pool and the level); 2 bad arguments or a bad dataset.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from router.calibrate.levels import (
    DEFAULT_LEVELS,
    DEFAULT_MIN_SAMPLES,
    CalibrationError,
    build_table,
    describe,
)
from router.calibrate.progress import Progress
from router.calibrate.sweep import POOLS, Plan, sweep
from router.calibrate.workload import (
    DatasetError,
    RequestSource,
    Template,
    dataset_workload,
    parse_dataset,
)
from router.decide.table import Table, Workload, no_crossover_advice, save

DEFAULT_PROMPT_TOKENS = 1024
DEFAULT_OUTPUT_TOKENS = 256


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spec-router calibrate",
        description="Measure a speculative and a baseline pool under closed-loop load at each "
        "concurrency and write the crossover table (see docs/calibration.md).",
    )
    parser.add_argument("--speculative", required=True, metavar="URL", help="speculative engine")
    parser.add_argument("--baseline", required=True, metavar="URL", help="baseline engine")
    parser.add_argument(
        "--concurrency",
        default=",".join(map(str, DEFAULT_LEVELS)),
        metavar="N,N,...",
        help="concurrency levels (default: %(default)s)",
    )
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--prompt-tokens",
        type=int,
        metavar="N",
        help=f"synthetic prompt length (default {DEFAULT_PROMPT_TOKENS})",
    )
    what.add_argument(
        "--dataset",
        type=Path,
        metavar="FILE.jsonl",
        help="requests to cycle through, one per line: a chat body (with messages) or a "
        'completions body (e.g. {"prompt": "...", "max_tokens": 256})',
    )
    parser.add_argument(
        "--output-tokens",
        type=int,
        metavar="N",
        help=f"synthetic output length (default {DEFAULT_OUTPUT_TOKENS}); with --dataset, the "
        "default for lines without max_tokens",
    )
    parser.add_argument(
        "--no-probes",
        dest="probes",
        action="store_false",
        help="skip the prefill and temperature-1 probes after the sweep (a few requests at "
        "concurrency 1 each, for the slo policy's models)",
    )
    parser.add_argument(
        "--temperature", type=float, default=0.0, metavar="T", help="synthetic requests only"
    )
    parser.add_argument(
        "--endpoint",
        choices=("chat", "completions"),
        default="chat",
        help="synthetic requests only (default: %(default)s)",
    )
    parser.add_argument(
        "--requests-per-level",
        type=int,
        metavar="N",
        help="measured requests per level, after one warm-up request per client "
        "(default: max(16, 2 x concurrency, 4096 / output tokens))",
    )
    parser.add_argument(
        "--min-samples",
        type=int,
        metavar="N",
        default=DEFAULT_MIN_SAMPLES,
        help="refuse to write the table if a level measured fewer requests (default: %(default)s)",
    )
    parser.add_argument(
        "--objective",
        choices=("tpot", "e2e"),
        default="tpot",
        help="what 'at least as good' means: per-request decode speed (tpot) or end-to-end "
        "latency (default: %(default)s)",
    )
    parser.add_argument(
        "--model", metavar="NAME", help="model name to send (default: each pool's /v1/models)"
    )
    parser.add_argument("--api-key", metavar="KEY", help="sent to both pools as a bearer token")
    parser.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ask for exactly max_tokens (ignore_eos of SGLang, vLLM and llama.cpp; default: on)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        metavar="N",
        default=2,
        help="measure a level again this often when the engine's own running + queued count "
        "strayed from the concurrency driven, and (unless 0) once more two neighbouring levels "
        "where decode speed rose with concurrency (default: %(default)s)",
    )
    parser.add_argument(
        "--level-timeout",
        type=float,
        default=1800.0,
        metavar="S",
        help="wall seconds one pool may take at one level (default: %(default)s)",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="measure level by level, each pool in turn (speculative at N, baseline at N, then "
        "the next N), instead of one pool's whole sweep after the other's: for two engines on "
        "separate hardware of a machine whose speed drifts (a shared VM), so that both points "
        "of a level are measured at about the same time",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        metavar="X",
        default=1.0,
        help="the pools are `spec-router sim`s run at this --time-scale: convert what is "
        "measured to model time (default: 1)",
    )
    parser.add_argument(
        "--out", type=Path, required=True, metavar="FILE.json", help="the table (JSON) to write"
    )
    parser.add_argument(
        "--plot", type=Path, metavar="FILE.png", help="a PNG of both curves to write"
    )
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.levels = tuple(sorted({int(x) for x in args.concurrency.split(",") if x.strip()}))
    except ValueError:
        parser.error(f"--concurrency takes integers separated by commas, not {args.concurrency}")
    if not args.levels or args.levels[0] < 1:
        parser.error("--concurrency levels must be >= 1")
    if args.min_samples < 1:
        parser.error("--min-samples must be >= 1")
    if args.requests_per_level is not None and args.requests_per_level < args.min_samples:
        parser.error("--requests-per-level must be at least --min-samples")
    if args.time_scale <= 0 or args.level_timeout <= 0 or args.retries < 0:
        parser.error("--time-scale and --level-timeout must be > 0, --retries >= 0")
    if args.prompt_tokens is not None and args.prompt_tokens < 1:
        parser.error("--prompt-tokens must be >= 1")
    if args.output_tokens is not None and args.output_tokens < 2:
        parser.error("--output-tokens must be >= 2: a decode speed needs two tokens")
    return args


def base_url(url: str) -> str:
    """``http://host:port`` from that, with or without a trailing ``/`` or ``/v1``."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


def report(table: Table) -> str:
    """The measured points and the crossover, as printed on stdout."""
    head = f"{'c':>4}  {'pool':<11} {'decode p50':>10} {'total':>8} {'TTFT p50':>9} {'p99':>8}"
    lines = [head + f" {'e2e p50':>8}  (tok/s, seconds)"]
    for pool in POOLS:
        for p in table.pool(pool).points:
            lines.append(
                f"{p.concurrency:>4}  {pool:<11} {p.decode_tps_p50:10.1f} {p.total_tps:8.1f}"
                f" {p.ttft_p50:9.3f} {p.ttft_p99:8.3f} {p.e2e_p50:8.2f}"
            )
    fit = table.speculative.fit
    tau = f"; speculative fit at acceptance length {fit.tau:.2f}" if fit else ""
    if table.crossover is not None:
        lines.append(
            f"crossover: {table.crossover} (objective {table.objective}: from {table.crossover} "
            f"concurrent requests on, the baseline is at least as good{tau})"
        )
    else:
        assert table.measured_up_to is not None
        lines.append(f"crossover: none (objective {table.objective}{tau}): {table.reason}")
        lines.append(no_crossover_advice(table.measured_up_to, table.margin))
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    workload: Workload
    templates: list[Template] | None = None
    if args.dataset is not None:
        try:
            templates = parse_dataset(args.dataset.read_text().splitlines(), args.output_tokens)
        except OSError as exc:
            print(
                f"spec-router calibrate: cannot read {args.dataset}: {exc.strerror}",
                file=sys.stderr,
            )
            return 2
        except DatasetError as exc:
            print(f"spec-router calibrate: {args.dataset}: {exc}", file=sys.stderr)
            return 2
        workload = dataset_workload(templates, args.dataset.name)
    else:
        workload = Workload(
            args.prompt_tokens or DEFAULT_PROMPT_TOKENS,
            args.output_tokens or DEFAULT_OUTPUT_TOKENS,
            None,
            args.temperature,
        )
    sources = {
        pool: RequestSource(
            dataset=templates,
            prompt_tokens=workload.prompt_tokens or DEFAULT_PROMPT_TOKENS,
            output_tokens=workload.output_tokens or DEFAULT_OUTPUT_TOKENS,
            temperature=args.temperature,
            endpoint=args.endpoint,
            model=args.model,
            ignore_eos=args.ignore_eos,
        )
        for pool in POOLS
    }
    plan = Plan(
        urls={pool: base_url(getattr(args, pool)) for pool in POOLS},
        levels=args.levels,
        output_tokens=float(workload.output_tokens or DEFAULT_OUTPUT_TOKENS),
        requests_per_level=args.requests_per_level,
        min_samples=args.min_samples,
        retries=args.retries,
        time_scale=args.time_scale,
        level_timeout=args.level_timeout,
        api_key=args.api_key,
        discover_model=args.model is None,
        interleave=args.interleave,
        probes=args.probes,
    )
    progress = Progress(sys.stderr, 2 * len(plan.levels))
    order = "and, in turn at each level," if plan.interleave else "then"
    progress.say(
        f"calibrating {plan.urls['speculative']} (speculative) {order} {plan.urls['baseline']} "
        f"(baseline), at concurrency {','.join(map(str, plan.levels))}"
    )
    try:
        measured = asyncio.run(sweep(plan, sources, progress))
    except CalibrationError as exc:
        progress.say(f"spec-router calibrate: not writing {args.out}: {exc}")
        return 1
    notes = describe(
        time_scale=args.time_scale,
        tau=measured.tau,
        tau_source=measured.tau_source,
        counts=measured.counts,
        ignore_eos=args.ignore_eos,
        disturbed=measured.disturbed,
        interleaved=args.interleave,
    )
    table = build_table(
        measured.points["speculative"],
        measured.points["baseline"],
        objective=args.objective,
        workload=workload,
        measured_at=datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        spec_tau=measured.tau,
        notes=notes,
        time_scale=args.time_scale,
        spec_tau_sampling=measured.tau_sampling,
        prefill=measured.prefill,
        caps=measured.caps,
    )
    save(table, args.out)
    print(report(table))
    elapsed = time.monotonic() - progress.began
    print(f"table written to {args.out} after {elapsed:.0f} s")
    if args.plot is not None:
        from router.calibrate.plot import plot

        plot(table, args.plot)
        print(f"plot written to {args.plot}")
    return 0
