"""The crossover table: measured curves of both pools and the crossover derived from them. Pure.

A table is a versioned JSON document (``TABLE_VERSION``) written by ``spec-router calibrate``
and kept current by the router's online learner. It holds, per pool, the measured points
(per-request decode tok/s p50, TTFT p50/p99, end-to-end p50, total tok/s, errors, samples at
each concurrency), the workload they were measured with, the objective, when, and the
crossover: the lowest concurrency from which the baseline pool is at least as good.

When the baseline never catches up within the levels measured, there is no crossover to write:
the table says ``"crossover": null``, with ``measured_up_to`` (the highest level both pools were
measured at), ``margin`` (how many times better the speculative pool still was there) and a
``reason``. A crossover is never extrapolated past the levels measured. Routing then holds each
speculative engine to ``measured_up_to`` (``Table.limit``) and places the rest by load
(``router.decide.policy``). Version 1 tables (whose crossover was "one past the highest level"
when none was found) are still read: such a crossover is read as null.

Besides the points, each pool carries a *fit*: seconds per iteration (``spt * tau``) as a
straight line in concurrency, the shape of a batching engine (an iteration costs ``a + b * n``
and yields ``tau`` tokens per request). The fit is a summary for plots and readers; what matters
to the router is its ``tau``, the acceptance length the speculative points were measured at,
which lets ``router.learn.learner`` rescale the curve when the engine's acceptance length changes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

TABLE_VERSION = 2
# versions ``from_json`` reads (1: crossover always an integer)
READ_VERSIONS = (1, 2)
Objective = Literal["tpot", "e2e"]
# Where a crossover came from.
Source = Literal["default", "configured", "calibrated", "learned"]
SOURCES: tuple[Source, ...] = ("default", "configured", "calibrated", "learned")


class TableError(ValueError):
    """A table that cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class Point:
    """One pool measured at one concurrency."""

    concurrency: int
    decode_tps_p50: float  # per-request decode tok/s, median
    ttft_p50: float  # seconds
    ttft_p99: float
    e2e_p50: float  # seconds, arrival to last token
    total_tps: float  # the whole pool's output tok/s
    samples: int  # requests measured
    errors: int = 0


@dataclass(frozen=True, slots=True)
class Line:
    """``y = alpha + beta * n``: seconds per token (or per iteration) against concurrency."""

    alpha: float
    beta: float

    def at(self, n: float) -> float:
        return self.alpha + self.beta * n


@dataclass(frozen=True, slots=True)
class Fit:
    """A pool's fitted curve; ``line`` is seconds per iteration, ``tau`` tokens per iteration."""

    line: Line
    tau: float = 1.0  # acceptance length the line was measured at (1 for a baseline engine)
    # the same for requests at temperature > 0, when measured (drafts are accepted less often)
    tau_sampling: float | None = None

    def spt(self, n: float, tau: float | None = None) -> float:
        """Seconds per output token of one request at concurrency ``n``."""
        return max(self.line.at(max(1.0, n)), 1e-9) / (tau or self.tau)

    def per_request_tps(self, n: float, tau: float | None = None) -> float:
        return 1.0 / self.spt(n, tau)


@dataclass(frozen=True, slots=True)
class Workload:
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    dataset: str | None = None
    temperature: float = 0.0


@dataclass(frozen=True, slots=True)
class Prefill:
    """Prefill time of one joining request: ``base + prompt_tokens * per_token`` seconds."""

    base: float
    per_token: float


@dataclass(frozen=True, slots=True)
class PoolCurve:
    points: tuple[Point, ...] = ()
    fit: Fit | None = None
    prefill: Prefill | None = None
    # the most requests the engine runs at once, as it reported it (SGLang's
    # max_running_requests, llama.cpp's slots); more wait in its queue. None: not reported.
    cap: int | None = None


@dataclass(frozen=True, slots=True)
class Crossing:
    """What two measured curves say about the crossover.

    ``crossover``: the lowest concurrency from which the baseline is at least as good, or None
    when it never is within the levels measured. ``measured_up_to``: the highest level both
    pools were measured at. ``margin``: how many times better the speculative pool is there
    (decode speed over the baseline's for ``tpot``, the baseline's end-to-end time over its own
    for ``e2e``; below 1 once the baseline is better). ``reason``: the same in words.
    """

    crossover: int | None
    measured_up_to: int
    margin: float | None
    reason: str

    @property
    def limit(self) -> int:
        """Requests per speculative engine before the rest go elsewhere (see ``Table.limit``)."""
        return self.measured_up_to if self.crossover is None else self.crossover


@dataclass(frozen=True, slots=True)
class Table:
    # None: no crossover within the levels measured (see ``measured_up_to``, ``margin``)
    crossover: int | None
    source: Source
    objective: Objective = "tpot"
    measured_at: str = ""
    workload: Workload = field(default_factory=Workload)
    speculative: PoolCurve = field(default_factory=PoolCurve)
    baseline: PoolCurve = field(default_factory=PoolCurve)
    version: int = TABLE_VERSION
    notes: str = ""
    # Durations here are the engines' model time; the engines the table describes run at this
    # time scale (1 for real engines; e.g. 0.1 for sims started with --time-scale 0.1), so the
    # router divides what it measures by it before learning.
    time_scale: float = 1.0
    # the highest level both pools were measured at, and how many times better the speculative
    # pool was there (see ``Crossing``); required when ``crossover`` is None
    measured_up_to: int | None = None
    margin: float | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if self.crossover is None and (self.measured_up_to is None or self.measured_up_to < 1):
            raise TableError("a table without a crossover needs measured_up_to >= 1")

    def pool(self, name: str) -> PoolCurve:
        return self.speculative if name == "speculative" else self.baseline

    @property
    def limit(self) -> int:
        """Requests per speculative engine before the rest go elsewhere: the crossover, or
        with none measured the highest level measured (past it the router places by load)."""
        if self.crossover is not None:
            return self.crossover
        assert self.measured_up_to is not None
        return self.measured_up_to


# -- deriving ------------------------------------------------------------------------------------


def _interpolate(points: Sequence[Point], n: float, attr: str) -> float:
    xs = [p.concurrency for p in points]
    ys = [float(getattr(p, attr)) for p in points]
    if n <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(
        zip(xs, ys, strict=True), zip(xs[1:], ys[1:], strict=True), strict=False
    ):
        if n <= x1:
            return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
    return ys[-1]


def _score(points: Sequence[Point], n: float, objective: Objective) -> float:
    """Higher is better: decode tok/s for ``tpot``, minus latency for ``e2e``."""
    if objective == "tpot":
        return _interpolate(points, n, "decode_tps_p50")
    return -_interpolate(points, n, "e2e_p50")


def crossing(
    spec: Sequence[Point], base: Sequence[Point], objective: Objective = "tpot"
) -> Crossing:
    """Where the baseline becomes at least as good, within the levels both pools measured.

    Curves are compared at every integer between the measured levels (linear interpolation).
    If the baseline never catches up in the measured range there is no crossover: never one
    extrapolated past the highest level measured.
    """
    if not spec or not base:
        raise TableError("both pools need measured points")
    top = min(spec[-1].concurrency, base[-1].concurrency)
    bottom = max(spec[0].concurrency, base[0].concurrency, 1)
    for n in range(1, top + 1):
        m = max(n, bottom)
        if _score(base, m, objective) >= _score(spec, m, objective):
            return Crossing(
                n, top, _margin(spec, base, top, objective),
                f"the baseline is at least as good from {n} concurrent requests on "
                f"(measured up to {top}; {objective}, interpolated between levels)",
            )  # fmt: skip
    margin = _margin(spec, base, top, objective)
    return Crossing(None, top, margin, no_crossover_reason(top, margin, objective))


def _margin(
    spec: Sequence[Point], base: Sequence[Point], n: float, objective: Objective
) -> float | None:
    """How many times better the speculative pool is at ``n`` (see ``Crossing``)."""
    if objective == "tpot":
        mine = _interpolate(spec, n, "decode_tps_p50")
        theirs = _interpolate(base, n, "decode_tps_p50")
    else:
        theirs, mine = _interpolate(spec, n, "e2e_p50"), _interpolate(base, n, "e2e_p50")
    return round(mine / theirs, 4) if theirs > 0 else None


def no_crossover_reason(measured_up_to: int, margin: float | None, objective: str) -> str:
    """Why a table has no crossover, in one sentence."""
    better = "" if margin is None else f" (x{margin:.2f} at {measured_up_to})"
    what = "decode speed per request" if objective == "tpot" else "end-to-end time"
    return (
        f"no crossover measured up to {measured_up_to}: the baseline never caught up on "
        f"{what} at the levels measured; the speculative pool was better at each{better}"
    )


def no_crossover_advice(
    measured_up_to: int,
    margin: float | None = None,
    speculative_engines: int | None = None,
    baseline_engines: int | None = None,
) -> str:
    """What follows from a table without a crossover, for an operator (status, the live page,
    calibrate's summary, the doctor)."""
    better = "" if margin is None else f", x{margin:.2f} at {measured_up_to}"
    text = (
        f"No crossover measured up to {measured_up_to} requests per engine: speculation was "
        f"faster at every level measured{better}. The router speculates up to "
        f"{measured_up_to} per speculative engine and places the rest by load. "
        "More engines should speculate"
    )
    if speculative_engines is not None and baseline_engines:
        total = speculative_engines + baseline_engines
        text += (
            f": e.g. {total} speculative engines rather than {speculative_engines} + "
            f"{baseline_engines}"
        )
    else:
        text += ": e.g. two speculative engines rather than a speculative + baseline pair"
    return text + ("; calibrate higher levels to find where (if anywhere) the baseline catches up.")


def crossover_from_points(
    spec: Sequence[Point], base: Sequence[Point], objective: Objective = "tpot"
) -> int | None:
    """The crossover ``crossing`` finds, or None when the baseline never catches up."""
    return crossing(spec, base, objective).crossover


def fit_line(
    xs: Sequence[float], ys: Sequence[float], weights: Sequence[float] | None = None
) -> Line:
    """Weighted least squares; a flat line through the mean when ``xs`` has no spread."""
    w = list(weights) if weights is not None else [1.0] * len(xs)
    sw = sum(w)
    if not xs or sw <= 0:
        raise TableError("no points to fit")
    mx = sum(wi * x for wi, x in zip(w, xs, strict=True)) / sw
    my = sum(wi * y for wi, y in zip(w, ys, strict=True)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, xs, strict=True))
    if sxx <= 1e-12:
        return Line(my, 0.0)
    sxy = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, xs, ys, strict=True))
    beta = sxy / sxx
    return Line(my - beta * mx, beta)


def fit_points(points: Sequence[Point], tau: float = 1.0) -> Fit:
    """Fit seconds per iteration against concurrency from measured decode speeds."""
    usable = [p for p in points if p.decode_tps_p50 > 0]
    if not usable:
        raise TableError("no point with a decode speed to fit")
    xs = [float(p.concurrency) for p in usable]
    ys = [tau / p.decode_tps_p50 for p in usable]
    return Fit(fit_line(xs, ys, [float(max(1, p.samples)) for p in usable]), tau)


# -- JSON ----------------------------------------------------------------------------------------


def to_json(table: Table) -> dict[str, Any]:
    return asdict(table)


def _point(raw: Any) -> Point:
    if not isinstance(raw, Mapping):
        raise TableError("a point must be an object")
    try:
        point = Point(
            concurrency=int(raw["concurrency"]),
            decode_tps_p50=float(raw["decode_tps_p50"]),
            ttft_p50=float(raw["ttft_p50"]),
            ttft_p99=float(raw["ttft_p99"]),
            e2e_p50=float(raw["e2e_p50"]),
            total_tps=float(raw["total_tps"]),
            samples=int(raw["samples"]),
            errors=int(raw.get("errors", 0)),
        )
    except KeyError as exc:
        raise TableError(f"a point lacks {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise TableError(f"a point has a bad value: {exc}") from None
    values = (point.decode_tps_p50, point.ttft_p50, point.ttft_p99, point.e2e_p50, point.total_tps)
    if (
        point.concurrency < 1
        or point.samples < 0
        or not all(math.isfinite(v) and v >= 0 for v in values)
    ):
        raise TableError(f"point at concurrency {point.concurrency} has out-of-range values")
    return point


def _fit(raw: Any) -> Fit | None:
    if raw is None:
        return None
    try:
        line = raw["line"]
        sampling = raw.get("tau_sampling")
        fit = Fit(
            Line(float(line["alpha"]), float(line["beta"])),
            float(raw.get("tau", 1.0)),
            None if sampling is None else float(sampling),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise TableError(f"bad fit: {exc}") from None
    if not (math.isfinite(fit.line.alpha) and math.isfinite(fit.line.beta) and fit.tau >= 1.0):
        raise TableError("fit values out of range")
    if fit.tau_sampling is not None and not (
        math.isfinite(fit.tau_sampling) and fit.tau_sampling >= 1.0
    ):
        raise TableError("fit tau_sampling out of range")
    return fit


def _prefill(raw: Any) -> Prefill | None:
    if raw is None:
        return None
    try:
        prefill = Prefill(float(raw["base"]), float(raw["per_token"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise TableError(f"bad prefill: {exc}") from None
    if not all(math.isfinite(v) and v >= 0 for v in (prefill.base, prefill.per_token)):
        raise TableError("prefill values out of range")
    return prefill


def _pool(raw: Any, name: str) -> PoolCurve:
    if raw is None:
        return PoolCurve()
    if not isinstance(raw, Mapping):
        raise TableError(f"{name} must be an object")
    points = tuple(sorted((_point(p) for p in raw.get("points", ())), key=lambda p: p.concurrency))
    if len({p.concurrency for p in points}) != len(points):
        raise TableError(f"{name}: a concurrency is listed twice")
    cap = raw.get("cap")
    if cap is not None and (type(cap) is not int or cap < 1):
        raise TableError(f"{name}: cap must be a positive integer")
    return PoolCurve(points, _fit(raw.get("fit")), _prefill(raw.get("prefill")), cap)


def from_json(raw: Any) -> Table:
    """Validate a parsed table document; raise ``TableError`` saying what is wrong."""
    if not isinstance(raw, Mapping):
        raise TableError("a table must be a JSON object")
    version = raw.get("version")
    if version not in READ_VERSIONS:
        raise TableError(
            f"unsupported table version {version!r} (this router reads "
            f"{', '.join(map(str, READ_VERSIONS))})"
        )
    crossover = raw.get("crossover")
    if crossover is None and version == TABLE_VERSION:
        pass
    elif type(crossover) is not int or crossover < 0:
        raise TableError(
            "crossover must be a non-negative integer"
            + (" or null (none measured)" if version == TABLE_VERSION else "")
        )
    measured_up_to = raw.get("measured_up_to")
    if measured_up_to is not None and (type(measured_up_to) is not int or measured_up_to < 1):
        raise TableError("measured_up_to must be a positive integer")
    if crossover is None and measured_up_to is None:
        raise TableError("a table without a crossover (null) needs measured_up_to")
    margin = raw.get("margin")
    if margin is not None:
        if isinstance(margin, bool) or not isinstance(margin, int | float):
            raise TableError("margin must be a number")
        margin = float(margin)
        if not (math.isfinite(margin) and margin > 0):
            raise TableError("margin must be positive")
    source = next((s for s in SOURCES if s == raw.get("source", "calibrated")), None)
    if source is None:
        raise TableError(f"source must be one of {', '.join(SOURCES)}")
    objective = raw.get("objective", "tpot")
    if objective not in ("tpot", "e2e"):
        raise TableError("objective must be 'tpot' or 'e2e'")
    w = raw.get("workload") or {}
    if not isinstance(w, Mapping):
        raise TableError("workload must be an object")
    try:
        workload = Workload(
            prompt_tokens=None if w.get("prompt_tokens") is None else int(w["prompt_tokens"]),
            output_tokens=None if w.get("output_tokens") is None else int(w["output_tokens"]),
            dataset=w.get("dataset"),
            temperature=float(w.get("temperature", 0.0)),
        )
    except (TypeError, ValueError) as exc:
        raise TableError(f"bad workload: {exc}") from None
    try:
        time_scale = float(raw.get("time_scale", 1.0))
    except (TypeError, ValueError):
        raise TableError("time_scale must be a number") from None
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise TableError("time_scale must be positive")
    table = Table(
        crossover=crossover,
        source=source,
        objective=objective,
        time_scale=time_scale,
        measured_at=str(raw.get("measured_at", "")),
        workload=workload,
        speculative=_pool(raw.get("speculative"), "speculative"),
        baseline=_pool(raw.get("baseline"), "baseline"),
        notes=str(raw.get("notes", "")),
        measured_up_to=measured_up_to,
        margin=margin,
        reason=str(raw.get("reason", "")),
    )
    return _upgraded(table) if version == 1 else table


def _upgraded(table: Table) -> Table:
    """A version-1 table as version 2 would have written it. Version 1 wrote "one past the
    highest level measured" when the baseline never caught up: from its points, such a
    crossover is read as none measured (a crossover it could have measured stays)."""
    spec, base = table.speculative.points, table.baseline.points
    if not spec or not base or table.crossover is None:
        return table
    found = crossing(spec, base, table.objective)
    if found.crossover is None and table.crossover > found.measured_up_to:
        reason = (
            f"{found.reason} (read from a version 1 table, whose crossover "
            f"{table.crossover} was one past the highest level measured)"
        )
        return replace(table, crossover=None, measured_up_to=found.measured_up_to,
                       margin=found.margin, reason=reason, version=TABLE_VERSION)  # fmt: skip
    return replace(table, measured_up_to=found.measured_up_to, margin=found.margin,
                   version=TABLE_VERSION)  # fmt: skip


def load(path: Path) -> Table:
    try:
        text = path.read_text()
    except OSError as exc:
        raise TableError(f"cannot read {path}: {exc.strerror}") from None
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise TableError(f"{path} is not valid JSON: {exc}") from None
    try:
        return from_json(raw)
    except TableError as exc:
        raise TableError(f"{path}: {exc}") from None


def save(table: Table, path: Path) -> None:
    """Write atomically: a reader (or a crash) never sees half a table."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(to_json(table), indent=2, sort_keys=False) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        # mkstemp makes the file 0600; keep the mode of the table we replace, else 0644, so a
        # router running as another user (a container, a service account) can still read it.
        try:
            mode = os.stat(path).st_mode & 0o777
        except OSError:
            mode = 0o644
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
