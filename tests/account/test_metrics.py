"""Prometheus metrics from finished requests (``RouterMetrics.observe``) and from live state
(``StateCollector``), each on a fresh registry, read back with ``get_sample_value``."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from router.account.inflight import InflightTracker
from router.account.metrics import (
    MAIN_REASONS,
    ROUTER_CODES,
    UPSTREAM_ERROR_CODES,
    RouterMetrics,
    StateCollector,
    observer,
)
from router.account.outcome import Outcome
from router.health.poller import EngineLoad
from router.health.state import HealthConfig, HealthRegistry, State
from router.learn.keeper import CrossoverKeeper
from router.pools import BASELINE, POOLS, SPECULATIVE, Pool
from router.settings import Settings
from router.upstream.stream import Usage

S1, B1 = "http://s1", "http://b1"


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def routed(
    status: int = 200,
    stream: bool = True,
    usage: Usage | None = None,
    pool: Pool = SPECULATIVE,
) -> Outcome:
    """Arrived at 0, first byte at 0.5, last at 2.5."""
    out = Outcome(path="/v1/chat/completions", started=0.0)
    out.read(stream)
    out.attempt(pool, f"http://{pool}", "failover")
    out.answered(status)
    out.first_bytes(0.5, 0.0)
    out.counted(usage)
    out.finish(2.5)
    return out


# -- RouterMetrics -------------------------------------------------------------------------------


def test_the_slo_series_exist_at_zero_and_count_what_the_objective_judges(
    registry: CollectorRegistry,
) -> None:
    metrics = RouterMetrics(registry, slo=(1.0, 0.025))
    for pool in (*POOLS, "none"):
        assert value(registry, "spec_router_slo_judged_total", pool=pool) == 0
        for tier in ("strict", "relaxed"):
            assert value(registry, "spec_router_slo_met_total", pool=pool, tier=tier) == 0
    # 0.5 s to the first byte, then 2 s for 10 tokens: TPOT 0.2 s, past both tiers
    metrics.observe(routed(usage=Usage(5, 11)))
    # 0.5 s, then 2 s for 100 tokens: 20 ms, strict
    metrics.observe(routed(usage=Usage(5, 101), pool=BASELINE))
    metrics.observe(routed(stream=False, usage=Usage(5, 101)))  # not judged
    refused = Outcome(path="/v1/chat/completions", started=0.0)
    refused.read(True)
    refused.answered(503)
    metrics.observe(refused)
    judged = {p: value(registry, "spec_router_slo_judged_total", pool=p) for p in (*POOLS, "none")}
    assert judged == {SPECULATIVE: 1, BASELINE: 1, "none": 1}
    strict = {
        p: value(registry, "spec_router_slo_met_total", pool=p, tier="strict")
        for p in (*POOLS, "none")
    }
    assert strict == {SPECULATIVE: 0, BASELINE: 1, "none": 0}


def test_the_slo_itself_is_a_gauge_for_the_dashboards_lines() -> None:
    registry = CollectorRegistry()
    health = HealthRegistry([S1, B1], HealthConfig(), 0.0)
    tracker = InflightTracker([(SPECULATIVE, S1), (BASELINE, B1)], lambda: 0.0)
    keeper = CrossoverKeeper(
        Settings(speculative_urls=[S1], baseline_urls=[B1]), tracker, {}, None, lambda: 0.0
    )
    collector = StateCollector(
        tracker, health, keeper, {}, "slo", "local", lambda: 0.0, slo=(0.5, 0.02)
    )
    registry.register(collector)
    seen = {
        (latency, tier): value(registry, "spec_router_slo_seconds", latency=latency, tier=tier)
        for latency in ("ttft", "tpot")
        for tier in ("strict", "relaxed")
    }
    assert seen == {
        ("ttft", "strict"): 0.5,
        ("ttft", "relaxed"): 1.5,
        ("tpot", "strict"): 0.02,
        ("tpot", "relaxed"): 0.04,
    }


def test_error_and_token_series_exist_at_zero_from_the_start(registry: CollectorRegistry) -> None:
    RouterMetrics(registry)
    for code in ROUTER_CODES:
        assert (
            value(registry, "spec_router_requests_total", pool="none", reason="none", code=code)
            == 0
        )
    for pool in POOLS:
        for reason in MAIN_REASONS:
            for code in UPSTREAM_ERROR_CODES:
                labels = {"pool": pool, "reason": reason, "code": code}
                assert value(registry, "spec_router_requests_total", **labels) == 0
        for name in (
            "spec_router_output_tokens_total",
            "spec_router_prompt_tokens_total",
            "spec_router_client_disconnects_total",
            "spec_router_slow_client_responses_total",
        ):
            assert value(registry, name, pool=pool) == 0, name
    # a series nobody created stays absent until a request creates it
    labels = {"pool": SPECULATIVE, "reason": "failover", "code": "200"}
    assert value(registry, "spec_router_requests_total", **labels) is None


def test_a_streamed_request_counts_everything_once(registry: CollectorRegistry) -> None:
    metrics = RouterMetrics(registry)
    out = routed(usage=Usage(prompt_tokens=7, completion_tokens=11))
    metrics.observe(out)
    metrics.observe(out)  # (the second goes through the cached children)
    spec = {"pool": SPECULATIVE}
    labels = {"pool": SPECULATIVE, "reason": "failover", "code": "200"}
    assert value(registry, "spec_router_requests_total", **labels) == 2
    decisions = {"pool": SPECULATIVE, "reason": "failover"}
    assert value(registry, "spec_router_routing_decisions_total", **decisions) == 2
    assert value(registry, "spec_router_request_duration_seconds_count", **spec) == 2
    assert value(registry, "spec_router_request_duration_seconds_sum", **spec) == 5.0
    assert value(registry, "spec_router_time_to_first_token_seconds_sum", **spec) == 1.0
    # 2 s of decode for the 10 tokens after the first: 0.2 s each
    assert value(registry, "spec_router_time_per_output_token_seconds_count", **spec) == 2
    tpot = value(registry, "spec_router_time_per_output_token_seconds_sum", **spec)
    assert tpot == pytest.approx(0.4)
    buckets = "spec_router_time_per_output_token_seconds_bucket"
    assert value(registry, buckets, pool=SPECULATIVE, le="0.15") == 0
    assert value(registry, buckets, pool=SPECULATIVE, le="0.2") == 2
    assert value(registry, "spec_router_output_tokens_total", **spec) == 22
    assert value(registry, "spec_router_prompt_tokens_total", **spec) == 14
    assert value(registry, "spec_router_output_tokens_total", pool=BASELINE) == 0


def test_an_engines_negative_token_count_is_not_counted(registry: CollectorRegistry) -> None:
    # The counters are incremented past prometheus-client's sign check (metrics.adder): the
    # observer makes it. Before, inc raised inside the observer and the request's TPOT was lost.
    metrics = RouterMetrics(registry)
    metrics.observe(routed(usage=Usage(prompt_tokens=-3, completion_tokens=11)))
    metrics.observe(routed(usage=Usage(prompt_tokens=5, completion_tokens=-2)))
    spec = {"pool": SPECULATIVE}
    assert value(registry, "spec_router_prompt_tokens_total", **spec) == 5
    assert value(registry, "spec_router_output_tokens_total", **spec) == 11
    assert value(registry, "spec_router_time_per_output_token_seconds_count", **spec) == 1


def test_no_ttft_or_tpot_without_a_stream_or_for_an_error(registry: CollectorRegistry) -> None:
    metrics = RouterMetrics(registry)
    metrics.observe(routed(stream=False, usage=Usage(7, 11)))  # first byte = whole answer
    metrics.observe(routed(status=503, usage=None))
    spec = {"pool": SPECULATIVE}
    assert value(registry, "spec_router_time_to_first_token_seconds_count", **spec) == 0
    assert value(registry, "spec_router_time_per_output_token_seconds_count", **spec) == 0
    assert value(registry, "spec_router_output_tokens_total", **spec) == 11  # usage still counts
    assert value(registry, "spec_router_request_duration_seconds_count", **spec) == 2
    labels = {"pool": SPECULATIVE, "reason": "failover", "code": "503"}
    assert value(registry, "spec_router_requests_total", **labels) == 1


def test_a_one_token_stream_has_a_ttft_but_no_tpot(registry: CollectorRegistry) -> None:
    metrics = RouterMetrics(registry)
    metrics.observe(routed(usage=Usage(7, 1)))
    spec = {"pool": SPECULATIVE}
    assert value(registry, "spec_router_time_to_first_token_seconds_count", **spec) == 1
    assert value(registry, "spec_router_time_per_output_token_seconds_count", **spec) == 0


def test_a_refused_request_counts_as_a_request_and_nothing_else(
    registry: CollectorRegistry,
) -> None:
    metrics = RouterMetrics(registry)
    out = Outcome(path="/v1/chat/completions", started=0.0)
    out.answered(401)
    out.finish(0.001)
    metrics.observe(out)
    assert (
        value(registry, "spec_router_requests_total", pool="none", reason="none", code="401") == 1
    )
    for pool in (*POOLS, "none"):
        assert not value(registry, "spec_router_request_duration_seconds_count", pool=pool)
    assert not value(registry, "spec_router_routing_decisions_total", pool="none", reason="none")


def test_an_unanswered_request_is_code_499(registry: CollectorRegistry) -> None:
    metrics = RouterMetrics(registry)
    out = routed(status=0)
    out.client_left()
    metrics.observe(out)
    labels = {"pool": SPECULATIVE, "reason": "failover", "code": "499"}
    assert value(registry, "spec_router_requests_total", **labels) == 1
    assert value(registry, "spec_router_client_disconnects_total", pool=SPECULATIVE) == 1
    assert value(registry, "spec_router_client_disconnects_total", pool=BASELINE) == 0


def test_retry_and_upstream_error_series_exist_at_zero_for_every_known_kind(
    registry: CollectorRegistry,
) -> None:
    """A healthy router's rate() of retries and upstream errors reads 0, not "No data"."""
    RouterMetrics(registry, [(SPECULATIVE, S1), (BASELINE, B1)])
    for pool in POOLS:
        for kind in ("connect", "connect_timeout", "reset", "http_429", "http_503"):
            assert value(registry, "spec_router_retries_total", pool=pool, kind=kind) == 0
        # a kind that is never retried has no retry series
        assert value(registry, "spec_router_retries_total", pool=pool, kind="protocol") is None
    errors = "spec_router_upstream_errors_total"
    kinds = ["first_byte_timeout", "idle_timeout", "protocol", "relay", "http_500", "http_504"]
    for pool, url in ((SPECULATIVE, S1), (BASELINE, B1)):
        for kind in kinds:
            assert value(registry, errors, pool=pool, backend=url, kind=kind) == 0
    assert value(registry, errors, pool=BASELINE, backend=S1, kind="connect") is None


def test_failures_retries_and_slow_clients(registry: CollectorRegistry) -> None:
    metrics = RouterMetrics(registry)
    out = Outcome(path="/v1/chat/completions", started=0.0)
    out.attempt(SPECULATIVE, S1, "below_crossover")
    out.attempt_failed("connect")
    out.retried("connect")
    out.attempt(SPECULATIVE, "http://s2", "retry")
    out.attempt_failed("status_503")
    out.retried("status_503")
    out.attempt(BASELINE, B1, "failover")
    out.answered(200)
    out.fell_behind()
    out.finish(1.0)
    metrics.observe(out)
    errors = "spec_router_upstream_errors_total"
    assert value(registry, errors, pool=SPECULATIVE, backend=S1, kind="connect") == 1
    assert value(registry, errors, pool=SPECULATIVE, backend="http://s2", kind="status_503") == 1
    assert value(registry, errors, pool=BASELINE, backend=B1, kind="connect") is None
    assert value(registry, "spec_router_retries_total", pool=SPECULATIVE, kind="connect") == 1
    assert value(registry, "spec_router_retries_total", pool=SPECULATIVE, kind="status_503") == 1
    assert value(registry, "spec_router_slow_client_responses_total", pool=BASELINE) == 1
    assert value(registry, "spec_router_slow_client_responses_total", pool=SPECULATIVE) == 0
    # the request is counted where it ended, under the reason it ended with
    labels = {"pool": BASELINE, "reason": "failover", "code": "200"}
    assert value(registry, "spec_router_requests_total", **labels) == 1


# -- StateCollector ------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def collector(registry: CollectorRegistry) -> tuple[InflightTracker, HealthRegistry, Clock]:
    clock = Clock()
    tracker = InflightTracker([(SPECULATIVE, S1), (BASELINE, B1)], clock)
    health = HealthRegistry([S1, B1], HealthConfig(), clock())
    settings = Settings(speculative_urls=[S1], baseline_urls=[B1], crossover=5)
    keeper = CrossoverKeeper(settings, tracker, {}, None, clock)
    loads = {
        S1: EngineLoad(3, 1, 2.5, clock(), 0, "sglang"),
        B1: EngineLoad(6, 2, 1.7, clock(), 0, "sglang"),
    }
    registry.register(StateCollector(tracker, health, keeper, loads, "predictive", "engine", clock))
    return tracker, health, clock


def test_in_flight_gauges_are_read_at_scrape_time(registry: CollectorRegistry) -> None:
    tracker, _, _ = collector(registry)
    assert value(registry, "spec_router_in_flight_requests", pool=SPECULATIVE) == 0
    leases = [tracker.acquire(S1), tracker.acquire(S1), tracker.acquire(B1)]
    leases[0].mark_slow()
    assert value(registry, "spec_router_in_flight_requests", pool=SPECULATIVE) == 2
    assert value(registry, "spec_router_in_flight_requests", pool=BASELINE) == 1
    backend = "spec_router_backend_in_flight_requests"
    assert value(registry, backend, pool=SPECULATIVE, backend=S1) == 2
    assert value(registry, backend, pool=BASELINE, backend=B1) == 1
    assert value(registry, "spec_router_slow_client_requests", pool=SPECULATIVE) == 1
    for lease in leases:
        lease.release()
    assert value(registry, backend, pool=SPECULATIVE, backend=S1) == 0
    assert value(registry, "spec_router_slow_client_requests", pool=SPECULATIVE) == 0


def test_crossover_and_policy(registry: CollectorRegistry) -> None:
    collector(registry)
    assert value(registry, "spec_router_crossover") == 5
    assert value(registry, "spec_router_crossover_source_info", source="configured") == 1
    policy = {"policy": "predictive", "load_signal": "engine"}
    assert value(registry, "spec_router_policy_info", **policy) == 1


def test_health_gauges_show_one_state_and_usability_now(registry: CollectorRegistry) -> None:
    _, health, clock = collector(registry)
    health.probe(S1, True, clock())
    health.eject(B1, clock(), "connect")  # never healthy, and ejected on top

    def state(url: str, pool: str) -> dict[str, float | None]:
        return {
            s.value: value(
                registry, "spec_router_backend_health", pool=pool, backend=url, state=s.value
            )
            for s in State
        }

    assert state(S1, SPECULATIVE) == {"starting": 0, "healthy": 1, "unhealthy": 0}
    assert state(B1, BASELINE) == {"starting": 1, "healthy": 0, "unhealthy": 0}
    usable = "spec_router_backend_usable"
    assert value(registry, usable, pool=SPECULATIVE, backend=S1) == 1
    assert value(registry, usable, pool=BASELINE, backend=B1) == 0
    health.eject(S1, clock(), "reset")
    assert value(registry, usable, pool=SPECULATIVE, backend=S1) == 0
    clock.now += 1.0  # the back-off ran out: the collector reads the clock at each scrape
    assert value(registry, usable, pool=SPECULATIVE, backend=S1) == 1


def test_engine_gauges_and_acceptance_only_for_speculative(registry: CollectorRegistry) -> None:
    collector(registry)
    p = "spec_router_engine_"
    assert value(registry, p + "running_requests", pool=SPECULATIVE, backend=S1) == 3
    assert value(registry, p + "queued_requests", pool=SPECULATIVE, backend=S1) == 1
    assert value(registry, p + "running_requests", pool=BASELINE, backend=B1) == 6
    assert value(registry, p + "queued_requests", pool=BASELINE, backend=B1) == 2
    assert value(registry, p + "spec_accept_length", pool=SPECULATIVE, backend=S1) == 2.5
    assert value(registry, p + "spec_accept_length", pool=BASELINE, backend=B1) is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.floats(allow_nan=True, allow_infinity=True),
            st.sampled_from([0.0, 0.005, 0.01, 0.1, 1.0, 2.5, 10.0, -0.0]),
        ),
        max_size=30,
    )
)
def test_the_bisecting_observer_counts_as_prometheus_client_does(values: list[float]) -> None:
    """``observer``: the router's faster ``observe`` for a histogram series gives the same
    buckets, count and sum as prometheus-client's own, at the bounds and between them."""

    def histogram() -> tuple[CollectorRegistry, Any]:
        registry = CollectorRegistry()
        metric = Histogram(
            "h", "h", ["pool"], registry=registry, buckets=(0.005, 0.01, 0.1, 1, 2.5)
        )
        return registry, metric.labels("p")

    theirs_registry, theirs = histogram()
    ours_registry, child = histogram()
    ours = observer(child)
    assert ours != child.observe  # (the fast one engaged)
    for value in values:
        theirs.observe(value)
        ours(value)

    def samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float | str]]:
        found = []
        for family in registry.collect():
            for s in family.samples:
                if not s.name.endswith("_created"):
                    value = s.value if s.value == s.value else "nan"
                    found.append((s.name, s.labels, value))
        return found

    assert samples(ours_registry) == samples(theirs_registry)
