"""What a simulated engine counts: plain numbers the engine updates on its hot path.

``router.sim.exposition`` turns them into SGLang's or vLLM's metric families only when
``/metrics`` is scraped. All times here are wall-clock seconds as an observer sees them
(already stretched by ``--time-scale``).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

# SGLang's default buckets (TokenizerMetricsCollector).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
    0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0,
)  # fmt: skip
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600,
               1200, 1800, 2400)  # fmt: skip


class Histogram:
    """Bucket counts and a sum; ``observe(v, n)`` records ``n`` observations of ``v``."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float, n: int = 1, total: float | None = None) -> None:
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n if total is None else total

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(running)))
        return out


@dataclass
class Tally:
    """SGLang's tokenizer-side counters for one label set, moved when a request ends."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    verify_calls: int = 0
    requests: int = 0


@dataclass
class EngineStats:
    """Counters the engine keeps; read by the collector and ``/server_info``."""

    prompt_tokens: int = 0  # admitted to the batch (vLLM counts them there)
    generation_tokens: int = 0  # as generated, per iteration (vLLM)
    requests: int = 0  # finished normally
    aborted: int = 0
    refused: int = 0  # the waiting queue was full
    health_generations: int = 0  # /health probes that ran a generation (SGLang)
    abort_lag: float | None = None  # the last client that left: seconds until its abort
    abort_age: float | None = None  # the same request: seconds from its arrival to its abort
    # SGLang: by (priority label, is_streaming), counted when each request ends
    finished: dict[tuple[str, bool], Tally] = field(default_factory=dict)
    # Speculation: tokens gained and request-iterations in decode, cumulative and since the
    # last gauge update (SGLang updates its gauges every ``decode_log_interval`` iterations).
    spec_tokens: int = 0
    spec_steps: int = 0
    window_tokens: int = 0
    window_spec_tokens: int = 0
    window_spec_steps: int = 0
    window_iterations: int = 0
    window_start: float = 0.0
    gen_throughput: float = 0.0
    spec_accept_length: float = 0.0  # the last window's mean; 0.0 before the first window
    reported_spec_tokens: int = 0  # the windows reported so far (/server_info's lifetime mean)
    reported_spec_steps: int = 0
    # vLLM: per draft position, the steps whose draft was accepted up to there
    accepted_per_pos: list[int] = field(default_factory=lambda: [0] * 8)
    # Scheduling fidelity: how late iterations ended against their deadlines.
    iterations: int = 0
    late_sum: float = 0.0
    late_max: float = 0.0
    lag_resets: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))

    def avg_spec_accept_length(self) -> float | None:
        """SGLang's lifetime mean over the reported windows; None before the first one."""
        if not self.reported_spec_steps:
            return None
        return self.reported_spec_tokens / self.reported_spec_steps

    def scheduling(self) -> dict[str, float]:
        """Cumulative: how late iterations ended, and the speculation counts."""
        n = max(1, self.iterations)
        return {
            "iterations": self.iterations,
            "late_mean_ms": 1e3 * self.late_sum / n,
            "late_max_ms": 1e3 * self.late_max,
            "lag_resets": self.lag_resets,
            "spec_tokens": self.spec_tokens,
            "spec_steps": self.spec_steps,
        }


@dataclass(frozen=True)
class Gauges:
    running: int
    queued: int
    context_tokens: int
    # by SGLang priority label ("None" for requests without one): (running, queued)
    by_priority: dict[str, tuple[int, int]] = field(default_factory=dict)
