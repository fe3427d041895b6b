"""The fleet lab's workloads: a trace's lengths under a rate envelope, Poisson arrivals.

Lengths are (prompt, output) pairs drawn at random from an Azure LLM 2023 trace (conversation
or code), so their joint distribution is the trace's. Arrivals are an inhomogeneous Poisson
process (thinning) under an envelope given as shares of a fleet's SLO capacity: the
``spec-router fleet`` tool's ``Envelope`` (``router.tools.fleet.workload``: diurnal, diurnal
with a surge, or flat), so the lab and the tool run the same days.

Capacity is what the issue asks for: the all-baseline fleet's SLO capacity from the engines'
performance model (``router.sim.model``): per engine, the most requests per second whose
steady state keeps the mean time per output token within the relaxed target (Little's law:
``b`` running at the rate that keeps them there, the decode stretched by that rate's prefills),
the router's own notion of what an engine "serves within the SLO" (``router.decide.capacity``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from fleet_engine import Req

from router.sim.model import Preset
from router.tools.fleet.workload import Envelope as Envelope
from router.tools.fleet.workload import engine_slo_capacity as slo_capacity_at
from router.tools.traffic import load_trace

TRACES = Path("/work/shared/traces")
HOUR = 3600.0


@lru_cache(maxsize=4)
def trace_lengths(kind: str) -> tuple[tuple[int, int], ...]:
    """Every (prompt, output) pair of the Azure 2023 ``kind`` trace (conv or code)."""
    return tuple((a.prompt_tokens, a.output_tokens)
                 for a in load_trace(TRACES / f"azure-llm-2023-{kind}.csv"))  # fmt: skip


def arrivals(env: Envelope, capacity: float, kind: str, hot: float, seed: int) -> list[Req]:
    """Poisson arrivals at ``env.share(t) * capacity`` requests per second, lengths drawn from
    the ``kind`` trace, each at temperature 1 with probability ``hot``."""
    rng = random.Random(f"fleet:{seed}:times")
    draw = random.Random(f"fleet:{seed}:lengths")
    temp = random.Random(f"fleet:{seed}:temperature")
    lengths = trace_lengths(kind)
    peak = env.peak() * capacity
    rate: Callable[[float], float] = lambda t: env.share(t) * capacity  # noqa: E731
    out: list[Req] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= env.duration:
            return out
        if rng.random() * peak < rate(t):
            prompt, output = lengths[draw.randrange(len(lengths))]
            out.append(Req(t, prompt, output, temp.random() < hot, len(out)))


def mean_lengths(kind: str) -> tuple[float, float]:
    pairs = trace_lengths(kind)
    return (sum(p for p, _ in pairs) / len(pairs), sum(o for _, o in pairs) / len(pairs))


def engine_slo_capacity(p: Preset, kind: str, hot: float, tpot: float = 0.05) -> float:
    """Requests per second one engine serves with its mean time per output token within
    ``tpot`` (the relaxed target), in its steady state, at the ``kind`` trace's mean lengths
    (``router.tools.fleet.workload.engine_slo_capacity``; see the module's docstring)."""
    return slo_capacity_at(p, *mean_lengths(kind), hot, tpot)
