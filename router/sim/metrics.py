"""What a simulated engine counts, and its Prometheus view under SGLang's metric names.

The engine updates plain numbers (``EngineStats``) on its hot path; ``SglangCollector`` turns
them into metric families only when ``/metrics`` is scraped, on a registry the server owns.
Names, label sets and histogram buckets follow SGLang's ``metrics/collector.py``: scheduler
gauges carry ``engine_type, model_name, moe_ep_rank, pp_rank, tp_rank``; tokenizer-side
counters and histograms carry ``model_name``. All times here are wall-clock seconds as an
observer sees them (already stretched by ``--time-scale``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

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
class EngineStats:
    """Counters the engine keeps; read by the collector and ``/server_info``."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests: int = 0  # finished normally
    aborted: int = 0
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
    spec_accept_length: float = 0.0
    # Scheduling fidelity: how late iterations ended against their deadlines.
    iterations: int = 0
    late_sum: float = 0.0
    late_max: float = 0.0
    lag_resets: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))

    def avg_spec_accept_length(self) -> float:
        return self.spec_tokens / self.spec_steps if self.spec_steps else 0.0

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


class SglangCollector(Collector):
    """Exposes ``EngineStats`` and live gauges under SGLang's names at scrape time."""

    def __init__(self, model_name: str, stats: EngineStats, gauges: Callable[[], Gauges]) -> None:
        self._stats = stats
        self._gauges = gauges
        self._sched = {
            "engine_type": "unified",
            "model_name": model_name,
            "moe_ep_rank": "0",
            "pp_rank": "0",
            "tp_rank": "0",
        }
        self._tok = {"model_name": model_name}

    def collect(self) -> Iterator[Metric]:
        s, g = self._stats, self._gauges()
        names, values = list(self._sched), list(self._sched.values())

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            return family

        yield gauge("sglang:num_running_reqs", "The number of running requests.", g.running)
        yield gauge(
            "sglang:num_queue_reqs", "The number of requests in the waiting queue.", g.queued
        )
        yield gauge("sglang:num_used_tokens", "The number of used tokens.", g.context_tokens)
        yield gauge(
            "sglang:gen_throughput", "The generation throughput (token/s).", s.gen_throughput
        )
        yield gauge(
            "sglang:spec_accept_length",
            "The average acceptance length of speculative decoding.",
            s.spec_accept_length,
        )

        tok_names, tok_values = list(self._tok), list(self._tok.values())

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=tok_names)
            family.add_metric(tok_values, value)
            return family

        def histogram(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
            family = HistogramMetricFamily(name, doc, labels=tok_names)
            family.add_metric(tok_values, h.cumulative(), h.sum)
            return family

        yield counter(
            "sglang:prompt_tokens_total", "Number of prefill tokens processed.", s.prompt_tokens
        )
        yield counter(
            "sglang:generation_tokens_total",
            "Number of generation tokens processed.",
            s.generation_tokens,
        )
        yield counter("sglang:num_requests_total", "Number of requests processed.", s.requests)
        yield counter("sglang:num_aborted_requests_total", "Number of requests aborted.", s.aborted)
        yield histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            s.ttft,
        )
        yield histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            s.itl,
        )
        yield histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            s.e2e,
        )
