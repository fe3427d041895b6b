"""Which finished requests count against the SLO, and whether they met it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from router.account.objective import MISSED, Attained, within_slo
from router.account.outcome import Outcome
from router.decide.predict import Request
from router.upstream.stream import Usage

SLO = (1.0, 0.025)


def stream(ttft: float, tpot: float, tokens: int = 11, pool: str | None = "baseline") -> Outcome:
    out = Outcome(path="/v1/chat/completions", started=10.0)
    out.read(stream=True)
    if pool is not None:
        out.attempt(pool, "http://b", "above_crossover")  # type: ignore[arg-type]
    out.answered(200)
    out.first_bytes(10.0 + ttft, 0.0)
    out.counted(Usage(5, tokens))
    out.finish(10.0 + ttft + tpot * (tokens - 1))
    return out


@pytest.mark.parametrize(
    ("ttft", "tpot", "attained"),
    [
        (1.0, 0.025, Attained(True, True)),  # at the line: within
        (1.01, 0.01, Attained(False, True)),
        (3.0, 0.05, Attained(False, True)),
        (3.01, 0.01, MISSED),
        (0.1, 0.051, MISSED),
    ],
)
def test_strict_and_relaxed_tiers(ttft: float, tpot: float, attained: Attained) -> None:
    assert within_slo(stream(ttft, tpot), *SLO) == attained


def test_the_requests_own_slo_wins() -> None:
    out = stream(1.5, 0.01)
    out.request = Request(10.0, 10.0, True, 2.0, 0.02)
    assert within_slo(out, *SLO) == Attained(True, True)


def test_one_token_is_judged_on_ttft_alone() -> None:
    assert within_slo(stream(0.5, 9.0, tokens=1), *SLO) == Attained(True, True)


@pytest.mark.parametrize(
    "change",
    [{"stream": False}, {"client_gone": True}, {"status": 400}, {"status": 408}, {"status": 413}],
    ids=str,
)
def test_not_judged(change: dict[str, Any]) -> None:
    assert within_slo(dataclasses.replace(stream(0.1, 0.01), **change), *SLO) is None


@pytest.mark.parametrize(
    "change",
    [
        {"status": 500},
        {"status": 429, "pool": None},
        {"status": 503, "pool": None},
        {"error": "reset"},
        {"first_byte": None},
    ],
    ids=str,
)
def test_failures_and_refusals_are_misses(change: dict[str, Any]) -> None:
    assert within_slo(dataclasses.replace(stream(0.1, 0.01), **change), *SLO) == MISSED
