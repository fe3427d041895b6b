"""What one level measured, whether it can be trusted, and the table the levels make. Pure.

A level is one pool driven by a closed loop of N clients. Its records come in three kinds.
Each client's *first* request is warm-up: it asks for ``(i + 1) / N`` of the output length, so
that requests end and rejoin spread out as in steady state rather than in lock-step, and it is
never measured. Then the clients share the level's *measured* requests. Once those are all
handed out, clients keep sending *fillers*, so that the last measured requests still run at the
full concurrency; fillers are cancelled when the last measured request ends and never count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from router.calibrate.loadgen import RequestResult, decode_tps, percentile
from router.decide.table import (
    Objective,
    Point,
    PoolCurve,
    Prefill,
    Table,
    Workload,
    crossing,
    fit_points,
)

DEFAULT_LEVELS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
DEFAULT_MIN_SAMPLES = 8
CANCELLED = "cancelled"


class CalibrationError(Exception):
    """Calibration cannot go on, or its result must not be written; the message says why."""


def requests_per_level(concurrency: int, output_tokens: float, requested: int | None) -> int:
    """Measured requests at one level: as asked, else ``max(16, 2 N, 4096 / output_tokens)``.

    Two per client keep every client's steady state in the sample. The rest is for the median's
    noise: a speculative engine's per-request speed varies with its random acceptance (on the
    simulated EAGLE-3 engine by about ``0.67 / sqrt(output_tokens)``: 8% at 64 tokens, 1.5% at
    2048), and the median of N requests by about 1.25 times that over ``sqrt(N)``. Near the
    crossover the two pools differ by only 1-3% per step of concurrency, so short outputs need
    more requests: 64 at 64 tokens.
    """
    if requested is not None:
        return requested
    return max(16, 2 * concurrency, math.ceil(4096 / max(1.0, output_tokens)))


# -- one level -----------------------------------------------------------------------------------


@dataclass
class LevelRun:
    """Every request of one pool at one concurrency (wall-clock times)."""

    pool: str
    concurrency: int
    wanted: int  # measured requests asked for
    results: list[RequestResult] = field(default_factory=list)  # all: warm-up, measured, fillers
    measured: list[RequestResult] = field(default_factory=list)
    warm_at: float | None = None  # when the last worker finished its warm-up request
    seconds: float = 0.0
    timed_out: bool = False
    # (time, running + queued) as the engine reported them while the level ran, if it does
    engine_load: list[tuple[float, float]] = field(default_factory=list)

    def engine_loads(self) -> list[float]:
        """The engine's running + queued requests sampled after warm-up, in order."""
        ends = [r.end for r in self.measured if r.end is not None]
        start = self.warm_at if self.warm_at is not None else -math.inf
        end = max(ends) if ends else math.inf
        return [n for t, n in self.engine_load if start <= t <= end]

    def mean_engine_load(self) -> float | None:
        """The engine's mean running + queued requests after warm-up; None if not reported."""
        loads = self.engine_loads()
        return sum(loads) / len(loads) if loads else None

    def failures(self) -> list[RequestResult]:
        return [r for r in self.results if not r.ok and r.error != CANCELLED]


def total_tps(results: Sequence[RequestResult], start: float, end: float) -> float:
    """Output tokens of all requests that arrived in ``[start, end)``, per second."""
    if end <= start:
        return math.nan
    tokens = 0.0
    for r in results:
        for t, n in zip(r.chunk_times, r.token_counts(), strict=True):
            if start <= t < end:
                tokens += n
    return tokens / (end - start)


def point_from_run(run: LevelRun, time_scale: float = 1.0) -> Point:
    """The level's ``Point`` in model units (tok/s x time_scale, seconds / time_scale).

    Decode speed, TTFT and end-to-end latency come from the measured requests; total tok/s from
    every chunk between the end of the warm-up and the end of the last measured request, when
    the load was the level's concurrency throughout.
    """
    done = [r for r in run.measured if r.ok]
    rates = [x for x in map(decode_tps, done) if x is not None]
    ttfts = [x for x in (r.ttft for r in done) if x is not None]
    e2es = [r.end - r.start for r in done if r.end is not None]
    ends = [r.end for r in done if r.end is not None]
    end = max(ends) if ends else math.nan
    start = run.warm_at if run.warm_at is not None else math.nan
    if not start < end and done:
        start = min(r.start for r in done)
    total = total_tps(run.results, start, end) if start < end else math.nan

    def rate(x: float) -> float:
        return 0.0 if math.isnan(x) else x * time_scale

    def secs(x: float) -> float:
        return 0.0 if math.isnan(x) else x / time_scale

    return Point(
        concurrency=run.concurrency,
        decode_tps_p50=rate(percentile(rates, 50)),
        ttft_p50=secs(percentile(ttfts, 50)),
        ttft_p99=secs(percentile(ttfts, 99)),
        e2e_p50=secs(percentile(e2es, 50)),
        total_tps=rate(total),
        samples=len(rates),
        errors=len(run.failures()),
    )


def refusal(run: LevelRun, point: Point, min_samples: int) -> str | None:
    """Why this level must not go into a table, or None if it may."""
    where = f"{run.pool} pool at concurrency {run.concurrency}"
    failed = run.failures()
    if failed:
        first = (failed[0].error or f"HTTP {failed[0].status}").strip()
        ended = [r for r in run.results if r.error != CANCELLED]
        return (
            f"{where}: {len(failed)} of {len(ended)} requests failed "
            f"(first: {first[:200]}); a table is not written from a sweep with errors"
        )
    if point.samples < min_samples:
        if run.timed_out:
            why = f"the level timed out after {run.seconds:.0f} s"
        elif len(run.measured) >= run.wanted:
            why = "the others returned fewer than 2 tokens, which gives no decode speed"
        else:
            why = "the level ended early"
        return (
            f"{where}: only {point.samples} requests measured, at least {min_samples} "
            f"are needed ({why})"
        )
    return None


def disturbance(run: LevelRun, tolerance: float = 0.10) -> str | None:
    """Why the engine's own load says the level did not run as driven, or None.

    In a closed loop the engine holds about ``concurrency`` requests (running or queued) all
    the time (a little less with short outputs: a finished client's next request needs a
    moment to arrive). Clearly fewer means the requests did not reach it in time (this machine
    was too busy); clearly more means other traffic shared the pool. Either skews every number:
    with fewer requests in its batch the engine decodes each faster.

    "More" is read from the mean; "fewer" from the 90th percentile of the samples, with one
    request to spare, because SGLang's gauges read low between its reports: a prefill report
    leaves out the requests it admits, and the next report comes after --decode-log-interval
    (40) decode steps (docs/engines.md, section 3), while a finished client's next request is
    on its way. They reach the batch at its reports.
    """
    loads = run.engine_loads()
    if not loads:
        return None
    n = run.concurrency
    mean = sum(loads) / len(loads)
    high = sorted(loads)[min(len(loads) - 1, int(0.9 * len(loads)))]
    slack = max(0.5, tolerance * n)
    if mean - n <= slack and n - high <= slack + 1:
        return None
    return (
        f"the engine held {mean:.1f} requests on average ({high:.1f} at its 90th percentile) "
        f"while {n} were driven"
    )


def out_of_line(points: Sequence[Point], tolerance: float = 0.10) -> list[int]:
    """Levels to measure again: both of two neighbours where per-request decode speed rose by
    more than ``tolerance`` with concurrency. A batching engine only slows down as its batch
    grows (and stays flat once requests queue), so such a rise means one of the two was
    measured while the engine ran slower or faster than it does."""
    pts = sorted(points, key=lambda p: p.concurrency)
    odd: set[int] = set()
    for low, high in zip(pts, pts[1:], strict=False):
        if high.decode_tps_p50 > low.decode_tps_p50 * (1 + tolerance):
            odd.update((low.concurrency, high.concurrency))
    return sorted(odd)


# -- the table ------------------------------------------------------------------------------------


def describe(
    *,
    time_scale: float,
    tau: float,
    tau_source: str,
    counts: Sequence[int],
    ignore_eos: bool,
    disturbed: Sequence[str] = (),
    interleaved: bool = False,
) -> str:
    """The table's ``notes``: how its numbers were measured."""
    lo, hi = min(counts), max(counts)
    per_level = f"{lo}" if lo == hi else f"{lo} to {hi}"
    order = "level by level, the two in turn" if interleaved else "one after the other"
    notes = [
        f"Measured by spec-router calibrate: each pool alone, {order}, with a closed "
        "loop of N clients at each level (each sends its next request when the last one ends).",
        f"Each worker's first request is warm-up and not measured; then {per_level} measured "
        "requests per level, with fillers keeping the load at N until the last one ends.",
        "decode_tps_p50: median over measured requests of (output_tokens - 1) / "
        "(t_last_token - t_first_token). ttft_*: send to first token. e2e_p50: send to last "
        "token. total_tps: all output tokens per second after warm-up, whole pool.",
        "crossover: lowest concurrency from which the baseline is at least as good on the "
        "objective (curves interpolated linearly between measured levels); null when it never "
        "is up to the highest level measured (measured_up_to; margin: how many times better "
        "the speculative pool was there).",
        f"speculative fit at tau={tau:g} ({tau_source}); fits are seconds per iteration, "
        "alpha + beta * n.",
    ]
    if disturbed:
        notes.append(
            "Levels that failed a check even when measured again (the engine's running + "
            "queued count off the concurrency driven, or decode speed rising with "
            f"concurrency): {', '.join(disturbed)}."
        )
    if not ignore_eos:
        notes.append("Requests could stop at end-of-sequence (ignore_eos off).")
    if time_scale != 1.0:
        notes.append(
            f"Servers ran with --time-scale {time_scale:g}: measured tok/s were multiplied by "
            f"{time_scale:g} and seconds divided by it, so every number is in model time."
        )
    return " ".join(notes)


def build_table(
    spec: Sequence[Point],
    base: Sequence[Point],
    *,
    objective: Objective,
    workload: Workload,
    measured_at: str,
    spec_tau: float = 1.0,
    notes: str = "",
    time_scale: float = 1.0,
    spec_tau_sampling: float | None = None,
    prefill: Mapping[str, Prefill] | None = None,
    caps: Mapping[str, int | None] | None = None,
) -> Table:
    """The calibrated table: both curves, their fits, and the crossover from the points."""
    spec = sorted(spec, key=lambda p: p.concurrency)
    base = sorted(base, key=lambda p: p.concurrency)
    found = crossing(spec, base, objective)
    return Table(
        crossover=found.crossover,
        measured_up_to=found.measured_up_to,
        margin=found.margin,
        reason=found.reason,
        source="calibrated",
        objective=objective,
        measured_at=measured_at,
        workload=workload,
        speculative=PoolCurve(
            tuple(spec),
            replace(fit_points(spec, tau=max(1.0, spec_tau)), tau_sampling=spec_tau_sampling),
            (prefill or {}).get("speculative"),
            (caps or {}).get("speculative"),
        ),
        baseline=PoolCurve(
            tuple(base),
            fit_points(base),
            (prefill or {}).get("baseline"),
            (caps or {}).get("baseline"),
        ),
        notes=notes,
        time_scale=time_scale,
    )
