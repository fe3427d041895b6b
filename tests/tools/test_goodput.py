"""Scoring on plain values: results from measured instants, SLOs, the summary."""

from __future__ import annotations

import math

import pytest

from router.tools import goodput
from router.tools.goodput import RELAXED, SLO, STRICT, Result
from router.tools.traffic import Arrival

A = Arrival(4.0, 100, 11)


def result(
    ttft: float | None = 0.5,
    tpot: float | None = 0.02,
    *,
    status: int | None = 200,
    error: str | None = None,
    pool: str | None = "speculative",
    at: float = 0.0,
    sent_at: float | None = None,
    output_tokens: int | None = 11,
) -> Result:
    arrival = Arrival(at, 100, 11)
    return Result(
        arrival=arrival,
        sent_at=at if sent_at is None else sent_at,
        status=status,
        ttft=ttft,
        tpot=tpot,
        e2e=None if ttft is None else ttft + 1.0,
        output_tokens=output_tokens,
        pool=pool,
        reason=None,
        error=error,
    )


def test_timed_result_converts_wall_instants_to_model_time() -> None:
    r = goodput.timed_result(
        A, start=9.0, sent=10.0, status=200, first_token=10.1, last_token=10.6, end=10.7,
        output_tokens=11, pool="baseline", reason="above_crossover", time_scale=0.25,
    )  # fmt: skip
    assert r.sent_at == pytest.approx(4.0)
    assert r.lateness == pytest.approx(0.0)
    assert r.ttft == pytest.approx(0.4)
    assert r.tpot == pytest.approx(0.5 / 10 / 0.25)  # (last - first) / (n - 1), in model time
    assert r.e2e == pytest.approx(2.8)
    assert (r.ok, r.pool, r.reason, r.error) == (True, "baseline", "above_crossover", None)


def test_a_single_token_has_no_tpot_and_is_judged_on_ttft() -> None:
    r = goodput.timed_result(
        A, start=0.0, sent=4.0, status=200, first_token=4.5, last_token=4.5, end=4.6,
        output_tokens=1,
    )  # fmt: skip
    assert r.tpot is None
    assert r.meets(STRICT)
    assert not r.meets(SLO("tight", 0.4, 0.001))


def test_a_stream_without_usage_or_content_is_an_error() -> None:
    no_usage = goodput.timed_result(
        A, start=0, sent=4, status=200, first_token=5, last_token=6, end=6, output_tokens=None
    )
    assert no_usage.error == "no usage chunk" and not no_usage.ok
    no_content = goodput.timed_result(
        A, start=0, sent=4, status=200, first_token=None, last_token=None, end=6, output_tokens=3
    )
    assert no_content.error == "no content" and not no_content.ok


def test_never_sent_has_no_times() -> None:
    r = goodput.timed_result(
        A, start=0, sent=None, status=None, first_token=None, last_token=None, end=None,
        output_tokens=None, error="not sent",
    )  # fmt: skip
    assert (r.sent_at, r.ttft, r.e2e, r.lateness, r.ok) == (None, None, None, None, False)


def test_slo_bounds_are_inclusive_and_both_must_hold() -> None:
    assert result(1.0, 0.025).meets(STRICT)
    assert not result(1.001, 0.01).meets(STRICT)
    assert not result(0.1, 0.0251).meets(STRICT)
    assert result(2.9, 0.049).meets(RELAXED) and not result(2.9, 0.049).meets(STRICT)
    # A failed request misses every SLO whatever its times.
    assert not result(0.1, 0.01, status=500, error="HTTP 500: boom").meets(RELAXED)
    assert not result(0.1, 0.01, error="unfinished: ...").meets(RELAXED)


def test_summary_counts_failures_against_goodput() -> None:
    results = [
        result(0.5, 0.020, pool="speculative"),  # strict and relaxed
        result(2.0, 0.030, pool="baseline"),  # relaxed only
        result(5.0, 0.010, pool="baseline"),  # neither
        result(None, None, status=503, error="HTTP 503: busy", pool=None),
        result(None, None, status=429, error="HTTP 429: slow down", pool="speculative"),
        result(None, None, status=500, error="HTTP 500: boom", pool="baseline"),
        result(0.3, None, status=None, error="unfinished: still running", pool=None),
        result(None, None, status=None, error="ReadError: reset", pool=None, sent_at=0.2),
    ]
    s = goodput.summarize(results)
    assert (s.count, s.ok, s.rejections, s.errors) == (8, 3, 2, 3)
    assert s.strict == 1 / 8 and s.relaxed == 2 / 8
    assert s.goodput == {"strict": 1 / 8, "relaxed": 2 / 8}
    # Latencies are over the successful requests only.
    assert s.ttft_p50 == 2.0 and s.ttft_p99 == pytest.approx(5.0 - 0.02 * 3.0)
    assert s.tpot_p50 == 0.020 and s.tpot_p90 == pytest.approx(0.028)
    assert s.e2e_p50 == 3.0
    # Placed by the router: 5 carry the header, 2 of them speculative.
    assert s.speculative_share == pytest.approx(2 / 5)
    assert s.pools == {"speculative": 1, "baseline": 2}
    assert s.error_kinds == {"HTTP 503": 1, "HTTP 429": 1, "HTTP 500": 1, "unfinished": 1,
                             "ReadError": 1}  # fmt: skip
    assert s.lateness_max == pytest.approx(0.2)


def test_summary_of_direct_engine_traffic_has_no_speculative_share() -> None:
    s = goodput.summarize([result(pool=None)])
    assert math.isnan(s.speculative_share) and s.ok == 1


def test_short_outputs_are_counted() -> None:
    s = goodput.summarize([result(output_tokens=5), result()])
    assert s.short == 1 and s.ok == 2


def test_empty_summary_and_warmup() -> None:
    s = goodput.summarize([])
    assert s.count == 0 and math.isnan(s.strict) and math.isnan(s.ttft_p99)
    rs = [result(at=t) for t in (0.0, 5.0, 10.0)]
    assert [r.arrival.at for r in goodput.scored(rs, 5.0)] == [5.0, 10.0]


def test_custom_slos() -> None:
    s = goodput.summarize([result(0.5, 0.02), result(0.9, 0.02)], [SLO("fast", 0.6, 0.05)])
    assert s.goodput == {"fast": 0.5}
    assert math.isnan(s.strict)
