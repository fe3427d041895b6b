"""Open-loop traffic as plain values: when each request arrives and what it asks for.

A workload is a list of ``Arrival`` s sorted by time. They come from a trace file (Azure LLM
inference CSV, Mooncake-style JSONL) or from a seeded generator (Poisson, on/off bursts, a
diurnal sinusoid) with lognormal prompt and output lengths, and are then shaped by pure
functions: a window, a rate (time-compress or thin), caps on the lengths, a temperature mix.

Nothing here sends anything (``router.tools.replay`` does); the only I/O is reading a trace.
Times are seconds of *model* time from the start of the workload.
"""

from __future__ import annotations

import csv
import json
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path


@dataclass(frozen=True)
class Arrival:
    at: float  # seconds from the start of the workload
    prompt_tokens: int
    output_tokens: int
    temperature: float = 0.0


Arrivals = list[Arrival]


# --- traces ------------------------------------------------------------------------------------


def _from_start(rows: list[tuple[float, int, int]]) -> Arrivals:
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0] if rows else 0.0
    return [Arrival(t - t0, max(1, p), max(1, o)) for t, p, o in rows]


def load_azure_csv(path: str | Path) -> Arrivals:
    """Azure LLM inference trace: ``TIMESTAMP`` (e.g. ``2023-11-16 18:15:46.6805900``),
    ``ContextTokens``, ``GeneratedTokens``. Times become seconds from the earliest row."""
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            stamp = datetime.fromisoformat(row["TIMESTAMP"].strip()).timestamp()
            rows.append((stamp, int(row["ContextTokens"]), int(row["GeneratedTokens"])))
    return _from_start(rows)


def load_mooncake_jsonl(path: str | Path) -> Arrivals:
    """Mooncake-style JSONL: one object a line with ``timestamp`` (ms), ``input_length``,
    ``output_length`` (other keys, e.g. ``hash_ids``, are ignored)."""
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                obj = json.loads(line)
                rows.append(
                    (obj["timestamp"] / 1000, int(obj["input_length"]), int(obj["output_length"]))
                )
    return _from_start(rows)


def load_trace(path: str | Path) -> Arrivals:
    """Either format, by the file's extension (``.csv``, else JSONL)."""
    if str(path).lower().endswith(".csv"):
        return load_azure_csv(path)
    return load_mooncake_jsonl(path)


# --- synthetic ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lengths:
    """Lognormal token counts: ``median * exp(sigma * N(0, 1))``, rounded, clipped."""

    median: float
    sigma: float
    lo: int = 1
    hi: int = 1 << 30

    def __post_init__(self) -> None:
        if self.median <= 0 or self.sigma < 0 or not 1 <= self.lo <= self.hi:
            raise ValueError(f"bad lengths {self}: need median > 0, sigma >= 0, 1 <= lo <= hi")

    def draw(self, rng: random.Random) -> int:
        value = round(self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0)))
        return min(self.hi, max(self.lo, value))


RateFn = Callable[[float], float]


def inhomogeneous(
    rate: RateFn,
    peak: float,
    duration: float,
    prompt: Lengths,
    output: Lengths,
    *,
    temperature_share: float = 0.0,
    seed: int = 0,
) -> Arrivals:
    """A Poisson process of intensity ``rate(t) <= peak`` on ``[0, duration)``, by thinning a
    homogeneous one of rate ``peak`` (Lewis & Shedler). Times, lengths and temperatures use
    separate seeded streams, so changing the lengths does not move the arrivals."""
    if peak <= 0 or duration <= 0:
        raise ValueError("the peak rate and the duration must be > 0")
    times_rng = random.Random(f"{seed}:times")
    lengths_rng = random.Random(f"{seed}:lengths")
    out: Arrivals = []
    t = 0.0
    while True:
        t += times_rng.expovariate(peak)
        if t >= duration:
            break
        if times_rng.random() * peak < rate(t):
            out.append(Arrival(t, prompt.draw(lengths_rng), output.draw(lengths_rng)))
    return with_temperatures(out, temperature_share, seed)


def poisson(
    rate: float,
    duration: float,
    prompt: Lengths,
    output: Lengths,
    *,
    temperature_share: float = 0.0,
    seed: int = 0,
) -> Arrivals:
    return inhomogeneous(
        lambda _: rate,
        rate,
        duration,
        prompt,
        output,
        temperature_share=temperature_share,
        seed=seed,
    )


def on_off_rate(rate: float, burst: float, on_s: float, off_s: float) -> tuple[RateFn, float]:
    """On/off rate: ``burst`` times the off-phase rate during on-phases, chosen so the mean
    over a cycle stays ``rate``. A cycle starts with its off-phase. Returns (rate(t), peak)."""
    if burst < 1 or on_s <= 0 or off_s < 0:
        raise ValueError("need burst >= 1, on_s > 0, off_s >= 0")
    low = rate * (on_s + off_s) / (on_s * burst + off_s)
    cycle = on_s + off_s

    def at(t: float) -> float:
        return low * burst if t % cycle >= off_s else low

    return at, low * burst


def on_off(
    rate: float,
    duration: float,
    prompt: Lengths,
    output: Lengths,
    *,
    burst: float = 4.0,
    on_s: float = 10.0,
    off_s: float = 20.0,
    temperature_share: float = 0.0,
    seed: int = 0,
) -> Arrivals:
    """Bursty arrivals with mean rate ``rate`` (see ``on_off_rate``)."""
    fn, peak = on_off_rate(rate, burst, on_s, off_s)
    return inhomogeneous(
        fn, peak, duration, prompt, output, temperature_share=temperature_share, seed=seed
    )


def diurnal(
    rate: float,
    duration: float,
    prompt: Lengths,
    output: Lengths,
    *,
    period_s: float = 120.0,
    amplitude: float = 0.5,
    temperature_share: float = 0.0,
    seed: int = 0,
) -> Arrivals:
    """``rate * (1 + amplitude * sin(2 pi t / period))``: mean ``rate`` over whole periods."""
    if not 0 <= amplitude <= 1 or period_s <= 0:
        raise ValueError("need 0 <= amplitude <= 1 and period_s > 0")

    def at(t: float) -> float:
        return rate * (1 + amplitude * math.sin(2 * math.pi * t / period_s))

    return inhomogeneous(
        at,
        rate * (1 + amplitude),
        duration,
        prompt,
        output,
        temperature_share=temperature_share,
        seed=seed,
    )


# --- shaping -----------------------------------------------------------------------------------


def mean_rate(arrivals: Sequence[Arrival]) -> float:
    """Requests per second between the first and the last arrival; NaN for fewer than two."""
    if len(arrivals) < 2 or arrivals[-1].at <= arrivals[0].at:
        return math.nan
    return (len(arrivals) - 1) / (arrivals[-1].at - arrivals[0].at)


def compress(arrivals: Sequence[Arrival], rate: float) -> Arrivals:
    """Scale the times so the mean rate becomes ``rate`` (below the trace's: stretch them)."""
    factor = mean_rate(arrivals) / rate
    if not factor > 0:
        raise ValueError("need at least two arrivals at different times and a rate > 0")
    return [replace(a, at=a.at * factor) for a in arrivals]


def thin(
    arrivals: Sequence[Arrival], rate: float, duration: float | None = None, seed: int = 0
) -> Arrivals:
    """Keep a seeded random subset with mean rate ``rate``; times stay as they are. The rate
    is measured over ``duration`` if given (a window's length), else first to last arrival.

    Each arrival keeps the same draw at every target rate, so a lower rate keeps a subset of
    what a higher one keeps: loads compared on one seed share their requests."""
    have = len(arrivals) / duration if duration else mean_rate(arrivals)
    if not rate > 0 or not have > 0:
        raise ValueError("need a rate > 0 and a workload with a rate")
    if rate > have * (1 + 1e-9):
        raise ValueError(f"cannot thin {have:.3g} req/s up to {rate:.3g} req/s; compress instead")
    rng = random.Random(f"{seed}:thin")
    keep = rate / have
    return [a for a in arrivals if rng.random() < keep]


def window(
    arrivals: Sequence[Arrival],
    start: float = 0.0,
    duration: float | None = None,
    count: int | None = None,
) -> Arrivals:
    """The arrivals in ``[start, start + duration)`` (at most ``count`` of them), with times
    shifted so that ``start`` becomes 0."""
    end = math.inf if duration is None else start + duration
    out = [replace(a, at=a.at - start) for a in arrivals if start <= a.at < end]
    return out if count is None else out[:count]


def cap_lengths(
    arrivals: Sequence[Arrival], prompt: int | None = None, output: int | None = None
) -> Arrivals:
    """Clip prompt and output lengths to at most ``prompt`` / ``output`` tokens."""
    return [
        replace(
            a,
            prompt_tokens=min(a.prompt_tokens, prompt or a.prompt_tokens),
            output_tokens=min(a.output_tokens, output or a.output_tokens),
        )
        for a in arrivals
    ]


def with_temperatures(arrivals: Sequence[Arrival], share: float, seed: int = 0) -> Arrivals:
    """Exactly ``round(share * n)`` arrivals, picked at random (seeded), at temperature 1.0;
    the rest at 0.0."""
    if not 0 <= share <= 1:
        raise ValueError("the temperature share must be in [0, 1]")
    rng = random.Random(f"{seed}:temperature")
    hot = set(rng.sample(range(len(arrivals)), round(share * len(arrivals))))
    return [replace(a, temperature=1.0 if i in hot else 0.0) for i, a in enumerate(arrivals)]


@dataclass(frozen=True)
class Profile:
    """What a workload looks like, for reports."""

    count: int
    span: float  # first to last arrival, seconds
    rate: float  # mean_rate()
    prompt_mean: float
    prompt_median: float
    output_mean: float
    output_median: float
    hot_share: float  # share at temperature > 0


def describe(arrivals: Sequence[Arrival]) -> Profile:
    if not arrivals:
        return Profile(0, 0.0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
    prompts = [a.prompt_tokens for a in arrivals]
    outputs = [a.output_tokens for a in arrivals]
    return Profile(
        count=len(arrivals),
        span=arrivals[-1].at - arrivals[0].at,
        rate=mean_rate(arrivals),
        prompt_mean=statistics.fmean(prompts),
        prompt_median=statistics.median(prompts),
        output_mean=statistics.fmean(outputs),
        output_median=statistics.median(outputs),
        hot_share=sum(a.temperature > 0 for a in arrivals) / len(arrivals),
    )
