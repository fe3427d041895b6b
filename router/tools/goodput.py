"""Scoring an open-loop replay: per-request results, SLOs, and the summary over a run.

Pure: ``router.tools.replay`` measures wall-clock instants and hands them to ``timed_result``,
which turns them into a ``Result`` in *model* time (durations divided by the engines' time
scale). Everything after that is arithmetic over ``Result`` s.

Definitions (those of vLLM's and SGLang's serving benchmarks):

* TTFT: first content token received - request sent;
* TPOT: (last token received - first token received) / (output tokens - 1);
* e2e: last byte received - request sent;
* goodput under an SLO: the share of *all* requests that succeeded with TTFT <= ``ttft_s``
  and TPOT <= ``tpot_s``. A request that failed, was rejected or did not finish counts as
  missing the SLO; one with a single output token has no TPOT and is judged on TTFT alone.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from router.calibrate.loadgen import percentile
from router.tools.traffic import Arrival

REJECTED = (429, 503)
SPECULATIVE = "speculative"


@dataclass(frozen=True)
class SLO:
    name: str
    ttft_s: float
    tpot_s: float


STRICT = SLO("strict", 1.0, 0.025)
RELAXED = SLO("relaxed", 3.0, 0.050)
DEFAULT_SLOS = (STRICT, RELAXED)


@dataclass(frozen=True)
class Result:
    """One replayed request; times in model seconds (``sent_at`` from the replay's start)."""

    arrival: Arrival
    sent_at: float | None  # None: never sent (the replay ended first)
    status: int | None
    ttft: float | None
    tpot: float | None
    e2e: float | None
    output_tokens: int | None  # from the usage chunk
    pool: str | None  # x-spec-router-pool (None when talking to an engine directly)
    reason: str | None  # x-spec-router-reason
    error: str | None
    # what the router's slo policy predicted (x-spec-router-predicted-*), model seconds
    predicted_ttft: float | None = None
    predicted_tpot: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def rejected(self) -> bool:
        return self.status in REJECTED

    @property
    def lateness(self) -> float | None:
        """How much later than scheduled the client sent it: the load generator's own lag."""
        return None if self.sent_at is None else self.sent_at - self.arrival.at

    def meets(self, slo: SLO) -> bool:
        if not self.ok or self.ttft is None or self.ttft > slo.ttft_s:
            return False
        return self.tpot is None or self.tpot <= slo.tpot_s


def timed_result(
    arrival: Arrival,
    *,
    start: float,
    sent: float | None,
    status: int | None,
    first_token: float | None,
    last_token: float | None,
    end: float | None,
    output_tokens: int | None,
    pool: str | None = None,
    reason: str | None = None,
    error: str | None = None,
    time_scale: float = 1.0,
    predicted: tuple[float, float] | None = None,
) -> Result:
    """A ``Result`` from wall-clock instants (any one clock; ``start`` = the replay's zero)."""

    def model(seconds: float | None) -> float | None:
        return None if seconds is None else seconds / time_scale

    if error is None and status is None:
        error = "no response"
    if error is None and status == 200:
        if output_tokens is None:
            error = "no usage chunk"
        elif first_token is None:
            error = "no content"
    ttft = e2e = tpot = None
    if sent is not None:
        ttft = None if first_token is None else model(first_token - sent)
        e2e = None if end is None else model(end - sent)
    n = output_tokens or 0
    if first_token is not None and last_token is not None and n >= 2:
        tpot = model((last_token - first_token) / (n - 1))
    return Result(
        arrival=arrival,
        sent_at=None if sent is None else model(sent - start),
        status=status,
        ttft=ttft,
        tpot=tpot,
        e2e=e2e,
        output_tokens=output_tokens,
        pool=pool,
        reason=reason,
        error=error,
        predicted_ttft=None if predicted is None else model(predicted[0]),
        predicted_tpot=None if predicted is None else model(predicted[1]),
    )


@dataclass(frozen=True)
class Summary:
    count: int
    ok: int
    goodput: dict[str, float]  # SLO name -> share of all requests meeting it
    ttft_p50: float  # over successful requests, model seconds
    ttft_p99: float
    tpot_p50: float
    tpot_p90: float
    e2e_p50: float
    speculative_share: float  # of the requests the router placed (x-spec-router-pool)
    rejections: int  # 429 / 503
    errors: int  # every other failure, unfinished ones included
    short: int  # succeeded with fewer output tokens than asked for
    lateness_p99: float  # sent_at - arrival.at, model seconds
    lateness_max: float
    pools: dict[str, int] = field(default_factory=dict)
    error_kinds: dict[str, int] = field(default_factory=dict)

    @property
    def strict(self) -> float:
        return self.goodput.get(STRICT.name, math.nan)

    @property
    def relaxed(self) -> float:
        return self.goodput.get(RELAXED.name, math.nan)


def _present(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def error_kind(result: Result) -> str:
    if result.status not in (None, 200):
        return f"HTTP {result.status}"
    return (result.error or "").split(":")[0]


def summarize(results: Sequence[Result], slos: Sequence[SLO] = DEFAULT_SLOS) -> Summary:
    n = len(results)
    done = [r for r in results if r.ok]
    placed = [r.pool for r in results if r.pool is not None]
    late = _present(r.lateness for r in results)
    failed = [r for r in results if not r.ok]
    return Summary(
        count=n,
        ok=len(done),
        goodput={s.name: sum(r.meets(s) for r in results) / n if n else math.nan for s in slos},
        ttft_p50=percentile(_present(r.ttft for r in done), 50),
        ttft_p99=percentile(_present(r.ttft for r in done), 99),
        tpot_p50=percentile(_present(r.tpot for r in done), 50),
        tpot_p90=percentile(_present(r.tpot for r in done), 90),
        e2e_p50=percentile(_present(r.e2e for r in done), 50),
        speculative_share=placed.count(SPECULATIVE) / len(placed) if placed else math.nan,
        rejections=sum(r.rejected for r in results),
        errors=sum(not r.ok and not r.rejected for r in results),
        short=sum(
            r.output_tokens is not None and r.output_tokens < r.arrival.output_tokens for r in done
        ),  # fmt: skip
        lateness_p99=percentile(late, 99),
        lateness_max=max(late) if late else math.nan,
        pools=dict(Counter(r.pool or "-" for r in done)),
        error_kinds=dict(Counter(error_kind(r) for r in failed)),
    )


def scored(results: Sequence[Result], warmup: float = 0.0) -> list[Result]:
    """The results whose arrival is at or after ``warmup`` seconds (earlier ones only load)."""
    return [r for r in results if r.arrival.at >= warmup]
