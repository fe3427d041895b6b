"""The Prometheus view of simulated engines, under SGLang's or vLLM's names and label sets.

Collectors build metric families only when ``/metrics`` is scraped, from what the engines
publish (``Engine.published``: on the real engine's cadence, see ``router.sim.engine``).

SGLang (``observability/metrics_collector.py`` in 0.5.23, ``metrics/collector.py`` in 0.5.3):

- scheduler gauges carry ``engine_type, model_name, pp_rank, tp_rank`` (0.5.23 adds
  ``moe_ep_rank``), ``dp_rank`` with data parallelism, one series per scheduler: only TP rank 0
  reports unless ``--enable-metrics-for-all-schedulers``, then every TP rank writes the same
  values. A scheduler that has not reported yet has no series at all.
- with priority scheduling (0.5.23) the total goes under ``priority=""`` and a breakdown under
  ``priority="<int>"`` (``"None"`` for requests without one) for the queue gauges.
- tokenizer-side counters carry no rank: ``model_name`` (0.5.3), plus ``engine_type``,
  ``priority`` and ``is_streaming`` (0.5.23), and move when a request ends.

vLLM (``v1/metrics/loggers.py``): ``model_name`` and ``engine`` (the DP engine's index),
gauges refreshed every step, speculative-decoding counters exposed with ``_total`` and
``_created`` samples.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from router.sim.behaviour import Behaviour
from router.sim.engine import Engine
from router.sim.metrics import Gauges, Histogram, Tally


@dataclass(frozen=True)
class Topology:
    """How the engine is split across GPUs, as far as its metrics show it."""

    dp_size: int = 1
    tp_size: int = 1
    all_schedulers: bool = False  # --enable-metrics-for-all-schedulers
    priority: bool = False  # --enable-priority-scheduling


def _merged(hists: Sequence[Histogram]) -> Histogram:
    out = Histogram(hists[0].bounds)
    for h in hists:
        out.counts = [a + b for a, b in zip(out.counts, h.counts, strict=True)]
        out.sum += h.sum
    return out


class SglangCollector(Collector):
    def __init__(
        self, model: str, engines: Sequence[Engine], how: Behaviour, topology: Topology
    ) -> None:
        self._model = model
        self._engines = engines
        self._how = how
        self._topology = topology
        self._priority = topology.priority and how.has_priority_label
        self._known: set[str] = set()  # breakdown series, once seen, keep being written

    def _scheduler_labels(self, dp_rank: int, tp_rank: int) -> dict[str, str]:
        labels = {
            "engine_type": "unified",
            "model_name": self._model,
            "pp_rank": "0",
            "tp_rank": str(tp_rank),
        }
        if self._how.has_moe_ep_rank:
            labels["moe_ep_rank"] = "0"
        if self._priority:
            labels["priority"] = ""
        if self._topology.dp_size > 1:
            labels["dp_rank"] = str(dp_rank)
        return labels

    def _tokenizer_labels(self) -> dict[str, str]:
        if not self._how.has_priority_label:  # 0.5.3
            return {"model_name": self._model}
        labels = {"engine_type": "unified", "model_name": self._model}
        if self._priority:
            labels["priority"] = ""
        return labels

    def collect(self) -> Iterator[Metric]:
        yield from self._scheduler_gauges()
        yield from self._tokenizer_metrics()

    def _scheduler_gauges(self) -> Iterator[Metric]:
        topo = self._topology
        tp_ranks = range(topo.tp_size) if topo.all_schedulers else range(1)
        reports: list[tuple[dict[str, str], Gauges, Engine]] = []
        for dp_rank, engine in enumerate(self._engines):
            seen = engine.published
            if seen is None:
                continue
            for tp_rank in tp_ranks:
                reports.append((self._scheduler_labels(dp_rank, tp_rank), seen, engine))
        if not reports:
            return
        names = sorted(reports[0][0])
        for g in (seen for _, seen, _ in reports):
            self._known.update(g.by_priority)

        def family(
            name: str, doc: str, value: Callable[[Gauges, Engine], float], slot: int | None = None
        ) -> GaugeMetricFamily:
            out = GaugeMetricFamily(name, doc, labels=names)
            for labels, seen, engine in reports:
                out.add_metric([labels[n] for n in names], value(seen, engine))
                if slot is not None and self._priority:
                    for p in sorted(self._known):
                        counts = seen.by_priority.get(p, (0, 0))
                        out.add_metric([p if n == "priority" else labels[n] for n in names],
                                       counts[slot])  # fmt: skip
            return out

        yield family(
            "sglang:num_running_reqs", "The number of running requests.", lambda g, _: g.running, 0
        )
        yield family(
            "sglang:num_queue_reqs",
            "The number of requests in the waiting queue.",
            lambda g, _: g.queued,
            1,
        )
        yield family(
            "sglang:num_used_tokens", "The number of used tokens.", lambda g, _: g.context_tokens
        )
        yield family(
            "sglang:gen_throughput",
            "The generation throughput (token/s).",
            lambda _, e: e.stats.gen_throughput,
        )
        yield family(
            "sglang:spec_accept_length",
            "The average acceptance length of speculative decoding.",
            lambda _, e: e.stats.spec_accept_length,
        )

    def _tokenizer_metrics(self) -> Iterator[Metric]:
        base = self._tokenizer_labels()
        tallies: dict[tuple[str, bool], Tally] = {}
        for engine in self._engines:
            for key, tally in engine.stats.finished.items():
                total = tallies.setdefault(key, Tally())
                total.prompt_tokens += tally.prompt_tokens
                total.generation_tokens += tally.generation_tokens
                total.verify_calls += tally.verify_calls
                total.requests += tally.requests
        streaming = self._how.has_priority_label  # 0.5.23 splits by is_streaming

        def counter(name: str, doc: str, field: str, split: bool) -> CounterMetricFamily:
            sums: dict[tuple[str, ...], float] = {}
            extra = ["is_streaming"] if split and streaming else []
            names = sorted([*base, *extra])
            for (priority, is_streaming), tally in tallies.items():
                labels = dict(base)
                if "priority" in labels:
                    labels["priority"] = priority
                if extra:
                    labels["is_streaming"] = "true" if is_streaming else "false"
                key = tuple(labels[n] for n in names)
                sums[key] = sums.get(key, 0.0) + getattr(tally, field)
            if not sums:  # before any request ended, as an unlabelled family: one 0 series
                sums[tuple(base.get(n, "false") for n in names)] = 0.0
            out = CounterMetricFamily(name, doc, labels=names)
            for key, value in sorted(sums.items()):
                out.add_metric(list(key), value)
            return out

        yield counter(
            "sglang:prompt_tokens_total",
            "Number of prefill tokens processed.",
            "prompt_tokens",
            True,
        )
        yield counter(
            "sglang:generation_tokens_total",
            "Number of generation tokens processed.",
            "generation_tokens",
            True,
        )
        if self._how.has_verify_counter and any(e.preset.spec_k for e in self._engines):
            yield counter(
                "sglang:spec_verify_calls_total",
                "Number of speculative decoding verification calls.",
                "verify_calls",
                False,
            )
        yield counter(
            "sglang:num_requests_total", "Number of requests processed.", "requests", False
        )
        names, values = sorted(base), [base[n] for n in sorted(base)]
        aborted = CounterMetricFamily(
            "sglang:num_aborted_requests_total", "Number of requests aborted.", labels=names
        )
        aborted.add_metric(values, sum(e.stats.aborted for e in self._engines))
        yield aborted
        stats = [e.stats for e in self._engines]
        for name, doc, hists in (
            (
                "sglang:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                [s.ttft for s in stats],
            ),
            (
                "sglang:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                [s.itl for s in stats],
            ),
            (
                "sglang:e2e_request_latency_seconds",
                "Histogram of End-to-end request latency in seconds",
                [s.e2e for s in stats],
            ),
        ):
            h = _merged(hists)
            family = HistogramMetricFamily(name, doc, labels=names)
            family.add_metric(values, h.cumulative(), h.sum)
            yield family


class VllmCollector(Collector):
    def __init__(self, model: str, engines: Sequence[Engine]) -> None:
        self._model = model
        self._engines = engines
        self._created = time.time()

    def collect(self) -> Iterator[Metric]:
        names = ["engine", "model_name"]
        ranks = [([str(i), self._model], e) for i, e in enumerate(self._engines)]

        def gauge(name: str, doc: str, value: Callable[[Engine], float]) -> GaugeMetricFamily:
            out = GaugeMetricFamily(name, doc, labels=names)
            for labels, engine in ranks:
                out.add_metric(labels, value(engine))
            return out

        def counter(name: str, doc: str, value: Callable[[Engine], float]) -> CounterMetricFamily:
            out = CounterMetricFamily(name, doc, labels=names)
            for labels, engine in ranks:
                out.add_metric(labels, value(engine), created=self._created)
            return out

        def published(engine: Engine) -> Gauges:
            return engine.published or Gauges(0, 0, 0)

        yield gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            lambda e: published(e).running,
        )
        yield gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            lambda e: published(e).queued,
        )
        yield counter(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            lambda e: e.stats.prompt_tokens,
        )
        yield counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            lambda e: e.stats.generation_tokens,
        )
        finished = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*names, "finished_reason"],
        )
        for labels, engine in ranks:  # (the sims end every request at its length)
            finished.add_metric([*labels, "length"], engine.stats.requests, created=self._created)
        yield finished
        k = self._engines[0].preset.spec_k
        if k:
            yield counter(
                "vllm:spec_decode_num_drafts",
                "Number of spec decoding drafts.",
                lambda e: e.stats.spec_steps,
            )
            yield counter(
                "vllm:spec_decode_num_draft_tokens",
                "Number of draft tokens.",
                lambda e: e.stats.spec_steps * k,
            )
            yield counter(
                "vllm:spec_decode_num_accepted_tokens",
                "Number of accepted tokens.",
                lambda e: e.stats.spec_tokens - e.stats.spec_steps,
            )
            per_pos = CounterMetricFamily(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                labels=[*names, "position"],
            )
            for labels, engine in ranks:
                for pos, count in enumerate(engine.stats.accepted_per_pos[:k]):
                    per_pos.add_metric([*labels, str(pos)], count, created=self._created)
            yield per_pos
        for name, doc, attr in (
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token.", "ttft"),
            ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency.", "itl"),
            ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency.", "e2e"),
        ):
            family = HistogramMetricFamily(name, doc, labels=names)
            for labels, engine in ranks:
                h: Histogram = getattr(engine.stats, attr)
                family.add_metric(labels, h.cumulative(), h.sum)
            yield family
