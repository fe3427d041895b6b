"""Prometheus metrics, on a registry passed in (never the global one).

Two kinds: counters and histograms updated once per finished request (``observe``, an
``Outcome`` observer; nothing per chunk), and gauges read from live state at scrape time by a
collector (in-flight counts, health, crossover, engine signals), so the hot path pays nothing
for them. Names follow Prometheus conventions: ``spec_router_`` prefix, base units, ``_total``
on counters, labels limited to pool, backend, reason, code, kind, state, tier, latency.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from router import __version__, compiled
from router.account.objective import TIERS, within_slo
from router.decide.capacity import RELAXED_TPOT, RELAXED_TTFT
from router.health.mode import ModeReading, mode_mismatch
from router.health.state import State
from router.members.member import Member
from router.pools import POOLS, SPECULATIVE
from router.upstream.verdicts import failure_kinds, retry_kinds

if TYPE_CHECKING:
    from router.account.inflight import InflightTracker
    from router.account.outcome import Outcome
    from router.health.poller import EngineLoad
    from router.health.state import HealthRegistry
    from router.learn.keeper import CrossoverKeeper


class Queue(Protocol):
    """The router's queue as the gauges read it (``router.forward.admission.Admission``)."""

    @property
    def queued(self) -> int: ...
    @property
    def admitted(self) -> int: ...
    @property
    def timed_out(self) -> int: ...
    @property
    def full(self) -> int: ...
    @property
    def sent_fine(self) -> int: ...
    @property
    def sent_changing(self) -> int: ...


# LLM-serving buckets, after vLLM's (TTFT, inter-token and end-to-end latency histograms),
# extended downwards for fast engines and time-scaled simulations.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


# The router's own refusals, and the usual answers of a failing engine, by the usual reasons.
ROUTER_CODES = ("400", "401", "404", "408", "413", "503")
UPSTREAM_ERROR_CODES = ("500", "502", "503", "504")
QUEUE_OUTCOMES = ("admitted", "timed_out", "refused_full")
# Why an overflowing request was sent on without waiting in the queue (label ``why``): its
# engine's measured latency is within the relaxed SLO, or capacity is loading or switching.
QUEUE_SENT_ON = {"sent_fine": "measured_fine", "sent_changing": "capacity_changing"}
SENT_ON_HELP = (
    "Overflowing requests the router's queue did not hold, by why (router.forward.admission)."
)
MAIN_REASONS = (
    "below_crossover",
    "above_crossover",
    "predicted_gain",
    "within_slo",
    "within_relaxed",
    "overflow",
    "beyond_slo",
    "failover",
    "beyond_measured",
)


class RouterMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        backends: Iterable[tuple[str, str]] = (),
        slo: tuple[float, float] = (1.0, 0.025),
    ) -> None:
        """``backends``: (pool, url) of every backend, whose error series start at 0; ``slo``:
        the TTFT and TPOT (seconds) a request without its own is judged against."""
        self.registry = registry
        self.slo = slo
        p = "spec_router_"
        self.requests = Counter(
            p + "requests", "Requests answered, by pool, routing reason and HTTP status.",
            ["pool", "reason", "code"], registry=registry,
        )  # fmt: skip
        self.decisions = Counter(
            p + "routing_decisions", "Routing decisions, by pool and reason.",
            ["pool", "reason"], registry=registry,
        )  # fmt: skip
        self.duration = Histogram(
            p + "request_duration_seconds", "Request duration, arrival to last byte.",
            ["pool"], buckets=E2E_BUCKETS, registry=registry,
        )  # fmt: skip
        self.ttft = Histogram(
            p + "time_to_first_token_seconds", "Arrival to the first response byte.",
            ["pool"], buckets=TTFT_BUCKETS, registry=registry,
        )  # fmt: skip
        self.tpot = Histogram(
            p + "time_per_output_token_seconds",
            "Mean time between output tokens after the first, per streamed request.",
            ["pool"], buckets=TPOT_BUCKETS, registry=registry,
        )  # fmt: skip
        self.output_tokens = Counter(
            p + "output_tokens", "Generated tokens, from the engines' usage.", ["pool"],
            registry=registry,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            p + "prompt_tokens", "Prompt tokens, from the engines' usage.", ["pool"],
            registry=registry,
        )  # fmt: skip
        self.upstream_errors = Counter(
            p + "upstream_errors", "Failures talking to a backend, by kind.",
            ["pool", "backend", "kind"], registry=registry,
        )  # fmt: skip
        self.retries = Counter(
            p + "retries", "Requests re-sent elsewhere before any byte reached the client.",
            ["pool", "kind"], registry=registry,
        )  # fmt: skip
        self.disconnects = Counter(
            p + "client_disconnects", "Requests whose client went away before the end.",
            ["pool"], registry=registry,
        )  # fmt: skip
        self.slow_clients = Counter(
            p + "slow_client_responses",
            "Responses whose client read slower than the engine wrote, so the router buffered "
            "(up to 256 KiB each) and then stopped reading from the engine until it caught up.",
            ["pool"], registry=registry,
        )  # fmt: skip
        # The objective of the default policy (router.account.objective): counters, so that
        # PromQL takes the share over any window and sums it over replicas and workers:
        #   sum by (pool) (rate(spec_router_slo_met_total{tier="strict"}[5m]))
        #     / sum by (pool) (rate(spec_router_slo_judged_total[5m]))
        self.slo_judged = Counter(
            p + "slo_judged",
            "Streamed requests judged against the SLO, by pool (none: refused by the router "
            "for want of a backend or room, a miss).",
            ["pool"], registry=registry,
        )  # fmt: skip
        self.slo_met = Counter(
            p + "slo_met",
            "Judged requests within the SLO, by pool and tier: strict (SLO_TTFT_MS and "
            "SLO_TPOT_MS, or the request's own x-slo-*), relaxed (3x TTFT, 2x TPOT).",
            ["pool", "tier"], registry=registry,
        )  # fmt: skip
        self._slo_children: dict[str, tuple[Callable[[float], None], ...]] = {}
        for pool in (*POOLS, "none"):
            self._slo_children[pool] = (
                adder(self.slo_judged.labels(pool)),
                *(adder(self.slo_met.labels(pool, tier)) for tier in TIERS),
            )
        self._cache: dict[tuple[str, str, int], tuple[Any, ...]] = {}
        for pool in POOLS:
            self.output_tokens.labels(pool)
            self.prompt_tokens.labels(pool)
            self.disconnects.labels(pool)
            self.slow_clients.labels(pool)
        # Error series exist from the start at 0: rate() cannot see a burst that creates its own
        # series between two scrapes (seen in tests/deploy: 559 router 503s, a rate of 0).
        for code in ROUTER_CODES:
            self.requests.labels("none", "none", code)
        for pool in POOLS:
            for reason in MAIN_REASONS:
                for code in UPSTREAM_ERROR_CODES:
                    self.requests.labels(pool, reason, code)
            for kind in retry_kinds():
                self.retries.labels(pool, kind)
        for backend_pool, url in backends:
            self.add_backend(backend_pool, url)
        # DNS discovery (SPEC_ROUTER_DISCOVERY=dns), per watched name; under --workers only the
        # leader discovers, so its value is the one kept (livemax)
        self.resolutions = Counter(
            p + "discovery_resolutions",
            "DNS resolutions of a pool's name, by result: resolved, empty (NXDOMAIN/NODATA), "
            "failed (the last good set is kept).",
            ["pool", "dns_name", "result"], registry=registry,
        )  # fmt: skip
        self.name_failing = Gauge(
            p + "discovery_failing",
            "1 while a pool's name fails to resolve and its last good set is kept.",
            ["pool", "dns_name"], registry=registry, multiprocess_mode="livemax",
        )  # fmt: skip
        self.cuts = Counter(
            p + "drain_cuts",
            "Requests still running on a backend that left its pool when its drain timed "
            "out (SPEC_ROUTER_DRAIN_TIMEOUT): cut, as on an upstream failure.",
            ["pool"], registry=registry,
        )  # fmt: skip
        for pool in POOLS:
            self.cuts.labels(pool)
        self.name_addresses = Gauge(
            p + "discovery_addresses",
            "Addresses in force for a pool's name (its last good answer, held over a grace "
            "period for empty answers).",
            ["pool", "dns_name"], registry=registry, multiprocess_mode="livemax",
        )  # fmt: skip

    def drain_cut(self, pool: str, requests: int) -> None:
        """Requests still running on a leaving backend when its drain timed out."""
        self.cuts.labels(pool).inc(requests)

    def add_backend(self, pool: str, url: str) -> None:
        """A backend's error series, from 0 (at start-up, and when it joins)."""
        for kind in failure_kinds():
            self.upstream_errors.labels(pool, url, kind)

    def remove_backend(self, pool: str, url: str) -> None:
        """A backend that left: its series go, and start again from 0 if it comes back. (Set
        to 0 first: under --workers a series' value lives on in this worker's file, where a
        new series of the same labels would pick it up.)"""
        known = getattr(self.upstream_errors, "_metrics", {})
        for child_labels in [tuple(k) for k in known if k[1] == url]:
            child = self.upstream_errors.labels(*child_labels)
            value = getattr(child, "_value", None)
            if value is not None and hasattr(value, "set"):
                value.set(0)
            self.upstream_errors.remove(*child_labels)

    def discovered(self, pool: str, name: str, result: str, addresses: int, failing: bool) -> None:
        """One resolution of a pool's name (``router.members.discovery``)."""
        self.resolutions.labels(pool, name, result).inc()
        self.name_failing.labels(pool, name).set(1.0 if failing else 0.0)
        self.name_addresses.labels(pool, name).set(addresses)

    def queue_meter(self) -> Callable[[str, int], None]:
        """The queue's metrics as prometheus-client objects, for ``serve --workers`` (where
        every worker queues on its own and the files of all are merged at a scrape); with one
        process ``StateCollector`` reads the queue's own counts instead."""
        p = "spec_router_"
        queued = Gauge(
            p + "queued_requests", "Requests waiting in the router's own queue (QUEUE_SIZE).",
            registry=self.registry, multiprocess_mode="livesum",
        )  # fmt: skip
        outcomes = Counter(
            p + "queue_outcomes", "How requests left the router's queue.", ["outcome"],
            registry=self.registry,
        )  # fmt: skip
        sent_on = Counter(p + "queue_sent_on", SENT_ON_HELP, ["why"], registry=self.registry)
        children = {kind: outcomes.labels(kind) for kind in QUEUE_OUTCOMES}
        children |= {kind: sent_on.labels(why) for kind, why in QUEUE_SENT_ON.items()}

        def meter(kind: str, delta: int) -> None:
            if kind == "queued":
                queued.inc(delta)
            else:
                children[kind].inc(delta)

        return meter

    def _children(self, pool: str, reason: str, code: int) -> tuple[Any, ...]:
        """The labelled series one request touches, looked up once per label set:
        ``labels()`` takes a lock and builds keys, too dear for every request."""
        key = (pool, reason, code)
        found = self._cache.get(key)
        if found is None:
            found = (
                adder(self.requests.labels(pool, reason, str(code or 499))),
                adder(self.decisions.labels(pool, reason)),
                observer(self.duration.labels(pool)),
                observer(self.ttft.labels(pool)),
                observer(self.tpot.labels(pool)),
                adder(self.output_tokens.labels(pool)),
                adder(self.prompt_tokens.labels(pool)),
                adder(self.disconnects.labels(pool)),
            )
            self._cache[key] = found
        return found

    def observe(self, out: Outcome) -> None:
        pool = out.pool or "none"
        requests, decisions, duration, ttft, tpot, output, prompt, gone = self._children(
            pool, out.reason, out.status
        )
        requests(1)
        attained = within_slo(out, *self.slo)
        if attained is not None:
            judged, strict, relaxed = self._slo_children[pool]
            judged(1)
            if attained.strict:
                strict(1)
            if attained.relaxed:
                relaxed(1)
        if out.pool is None:
            return
        decisions(1)
        duration(out.ended - out.started)
        if out.client_gone:
            gone(1)
        if out.slow_client:
            self.slow_clients.labels(pool).inc()
        for failed_pool, backend, kind in out.failures:
            self.upstream_errors.labels(failed_pool, backend, kind).inc()
        for left, kind in out.retries:
            self.retries.labels(left, kind).inc()
        if out.stream and out.first_byte is not None and out.status < 400:
            # (a non-streamed answer's first byte is the whole generation: not a TTFT)
            ttft(out.first_byte - out.started)
        usage = out.usage
        if usage is not None:
            # (an engine's negative count is not counted: a counter never goes down)
            if usage.completion_tokens > 0:
                output(usage.completion_tokens)
            if usage.prompt_tokens > 0:
                prompt(usage.prompt_tokens)
            if out.stream and out.first_byte is not None and usage.completion_tokens > 1:
                decode = out.ended - out.first_byte
                tpot(decode / (usage.completion_tokens - 1))


def adder(child: Any) -> Callable[[float], None]:
    """``child.inc`` for a counter's labelled series, for amounts known to be >= 0: without
    the checks ``inc`` makes on every call (the amount's sign, an exemplar), straight to its
    value, which keeps its lock (and, under ``PROMETHEUS_MULTIPROC_DIR``, its file). The
    router increments up to five counters per request. Falls back to ``inc`` when the series
    is not built as this expects (another prometheus-client)."""
    inc = getattr(getattr(child, "_value", None), "inc", None)
    return inc if callable(inc) else child.inc  # type: ignore[no-any-return]


def observer(child: Any) -> Callable[[float], None]:
    """``child.observe`` for a histogram's labelled series, with its bucket found by bisection:
    prometheus-client walks the buckets in Python, one comparison each, and the router
    observes three histograms per request. The same values, sum and counts (its buckets count
    observations ``<= bound``, not yet cumulated: ``bisect_left``); falls back to ``observe``
    when the series is not built as this expects (another prometheus-client)."""
    try:
        bounds: list[float] = list(child._upper_bounds)
        incs = [bucket.inc for bucket in child._buckets]
        add = child._sum.inc
    except AttributeError:
        return child.observe  # type: ignore[no-any-return]
    if len(bounds) != len(incs) or not bounds or bounds[-1] != float("inf"):
        return child.observe  # type: ignore[no-any-return]

    def observe(amount: float) -> None:
        add(amount)
        if amount == amount:  # (NaN falls in no bucket, as with observe)
            incs[bisect_left(bounds, amount)](1)

    return observe


class Members(Protocol):
    """The members as the gauges read them (``router.members.roster.Roster``)."""

    @property
    def generation(self) -> int: ...
    @property
    def members(self) -> Mapping[str, Member]: ...

    def sync(self) -> object: ...


class StateCollector(Collector):
    """Gauges read from the router's live state when Prometheus scrapes."""

    def __init__(
        self,
        tracker: InflightTracker,
        health: HealthRegistry,
        tuning: CrossoverKeeper,
        loads: Mapping[str, EngineLoad],
        policy: str,
        load_signal: str,
        clock: Callable[[], float],
        admission: Queue | None = None,
        slo: tuple[float, float] = (1.0, 0.025),
        members: Members | None = None,
        modes: Mapping[str, ModeReading] | None = None,
    ) -> None:
        self.slo = slo  # TTFT, TPOT (s): the SLO requests are judged against
        self.tracker = tracker
        self.health = health
        self.tuning = tuning
        self.loads = loads
        self.policy = policy
        self.load_signal = load_signal
        self.clock = clock
        self.admission = admission
        self.members = members
        self.modes = modes

    def collect(self) -> Iterator[Metric]:
        tracker = self.tracker
        p = "spec_router_"
        g = GaugeMetricFamily(
            p + "in_flight_requests", "Requests in flight, by pool.", labels=["pool"]
        )
        for pool in POOLS:
            g.add_metric([pool], tracker.by_pool[pool])
        yield g
        b = GaugeMetricFamily(
            p + "backend_in_flight_requests",
            "Requests in flight, by backend.",
            labels=["pool", "backend"],
        )
        for url, n in tracker.by_backend.items():
            b.add_metric([tracker.pool_of[url], url], n)
        yield b
        slow = GaugeMetricFamily(
            p + "slow_client_requests",
            "Requests in flight whose client reads slower than the engine writes.",
            labels=["pool"],
        )
        for pool in POOLS:
            slow.add_metric([pool], tracker.slow_clients[pool])
        yield slow
        yield GaugeMetricFamily(
            p + "crossover",
            "Current crossover (concurrent requests per speculative engine); with no crossover "
            "measured (spec_router_crossover_measured 0), the highest level measured.",
            value=self.tuning.crossover,
        )  # fmt: skip
        yield GaugeMetricFamily(
            p + "crossover_measured",
            "1 when the crossover was measured; 0 when the baseline never caught up within the "
            "levels measured (the router then places requests past that level by load).",
            value=0 if self.tuning.no_crossover else 1,
        )
        info = InfoMetricFamily(p + "crossover_source", "Where the current crossover came from.")
        info.add_metric([], {"source": self.tuning.source})
        yield info
        pol = InfoMetricFamily(p + "policy", "The routing policy in use.")
        pol.add_metric([], {"policy": self.policy, "load_signal": self.load_signal})
        yield pol
        built = compiled.status()
        build = InfoMetricFamily(
            p + "build",
            "What runs: compiled 'true' when the decision's hot path runs compiled (mypyc), "
            "'false' when it runs from source (a pure build, SPEC_ROUTER_PURE, or sources "
            "edited since the build); modules: those loaded compiled.",
        )
        build.add_metric(
            [],
            {
                "version": __version__,
                "compiled": "true" if built["compiled"] else "false",
                "modules": ",".join(built["compiled_modules"]),
            },
        )
        yield build
        target = GaugeMetricFamily(
            p + "slo_seconds",
            "The SLO requests are judged against (spec_router_slo_met_total), by latency "
            "(ttft, tpot) and tier (strict: SLO_TTFT_MS / SLO_TPOT_MS; relaxed: 3x, 2x).",
            labels=["latency", "tier"],
        )
        ttft, tpot = self.slo
        target.add_metric(["ttft", "strict"], ttft)
        target.add_metric(["ttft", "relaxed"], ttft * RELAXED_TTFT)
        target.add_metric(["tpot", "strict"], tpot)
        target.add_metric(["tpot", "relaxed"], tpot * RELAXED_TPOT)
        yield target
        health = GaugeMetricFamily(
            p + "backend_health", "1 for the backend's current health state.",
            labels=["pool", "backend", "state"],
        )  # fmt: skip
        usable = GaugeMetricFamily(
            p + "backend_usable", "1 when the backend can take new requests now.",
            labels=["pool", "backend"],
        )  # fmt: skip
        now = self.clock()
        for url, h in self.health.states.items():
            pool = tracker.pool_of[url]
            for state in State:
                health.add_metric([pool, url, state.value], 1.0 if h.state is state else 0.0)
            usable.add_metric([pool, url], 1.0 if self.health.usable(url, now) else 0.0)
        yield health
        yield usable
        yield from self._engine()
        yield from self._queue()
        yield from self._members()

    def _members(self) -> Iterator[Metric]:
        roster = self.members
        if roster is None:
            return
        p = "spec_router_"
        count = GaugeMetricFamily(
            p + "backends", "Backends in each pool, by membership state (active, draining).",
            labels=["pool", "state"],
        )  # fmt: skip
        counts = {(pool, state): 0 for pool in POOLS for state in ("active", "draining")}
        for m in roster.members.values():
            counts[(m.pool, m.state)] += 1
        for (pool, state), n in counts.items():
            count.add_metric([pool, state], n)
        yield count
        yield GaugeMetricFamily(
            p + "membership_generation",
            "Changes of the set of backends so far (joins, drains, removals).",
            value=roster.generation,
        )
        wrong = GaugeMetricFamily(
            p + "backend_mode_mismatch",
            "1 when a backend's engine runs in the other pool's mode (a speculative engine in "
            "the baseline pool, or the reverse), as the engine reports it.",
            labels=["pool", "backend"],
        )
        modes = self.modes or {}
        for url, m in roster.members.items():
            reading = modes.get(url)
            if reading is not None:
                wrong.add_metric([m.pool, url], 1.0 if mode_mismatch(m.pool, reading) else 0.0)
        yield wrong

    def _queue(self) -> Iterator[Metric]:
        a = self.admission
        if a is None:
            return
        p = "spec_router_"
        yield GaugeMetricFamily(
            p + "queued_requests", "Requests waiting in the router's own queue (QUEUE_SIZE).",
            value=a.queued,
        )  # fmt: skip
        outcomes = CounterMetricFamily(
            p + "queue_outcomes", "How requests left the router's queue.", labels=["outcome"]
        )
        outcomes.add_metric(["admitted"], a.admitted)
        outcomes.add_metric(["timed_out"], a.timed_out)
        outcomes.add_metric(["refused_full"], a.full)
        yield outcomes
        sent_on = CounterMetricFamily(p + "queue_sent_on", SENT_ON_HELP, labels=["why"])
        sent_on.add_metric([QUEUE_SENT_ON["sent_fine"]], a.sent_fine)
        sent_on.add_metric([QUEUE_SENT_ON["sent_changing"]], a.sent_changing)
        yield sent_on

    def _engine(self) -> Iterator[Metric]:
        p = "spec_router_engine_"
        labels = ["pool", "backend"]
        running = GaugeMetricFamily(
            p + "running_requests", "Running requests the engine reported.", labels=labels
        )
        queued = GaugeMetricFamily(
            p + "queued_requests", "Queued requests the engine reported.", labels=labels
        )
        accept = GaugeMetricFamily(
            p + "spec_accept_length",
            "Mean speculative acceptance length the engine reported.",
            labels=labels,
        )
        for url, seen in self.loads.items():
            pool = self.tracker.pool_of[url]
            running.add_metric([pool, url], seen.running)
            queued.add_metric([pool, url], seen.queued)
            if seen.accept_length is not None and pool == SPECULATIVE:
                accept.add_metric([pool, url], seen.accept_length)
        yield running
        yield queued
        yield accept


class MembersOnly(Collector):
    """Another collector's series, less those of backends that are no longer members: under
    ``--workers`` each worker's file (and a dead worker's) keeps every series it ever wrote,
    so a departed backend's would stay in the merged output for good."""

    def __init__(self, inner: Collector, current: Callable[[], Container[str]]) -> None:
        self.inner = inner
        self.current = current

    def collect(self) -> Iterator[Metric]:
        keep = self.current()
        for metric in self.inner.collect():
            metric.samples = [
                s
                for s in metric.samples
                if s.labels.get("backend", "") in keep or "backend" not in s.labels
            ]
            yield metric
