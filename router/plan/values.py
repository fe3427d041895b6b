"""The planner's inputs as plain values: an engine curve per mode, the request mix, the SLO.

A ``Curve`` is what the router knows of one mode's engines, in the shape of its own
``PoolModel`` (router/decide/predict.py): seconds per iteration by batch size, tokens per
iteration for greedy and sampled requests, prefill as ``base + tokens * per_token``, the running
cap. ``curve_of`` takes that model (or anything with the same fields) and turns its model
seconds into wall seconds with its ``scale``; everything the planner computes is wall seconds.

A ``Mix`` is what the traffic looks like: prompt and output lengths at equal-probability
quantiles (each point the mean of its bin, so means are kept) and the share of requests at
temperature > 0. ``mix_of`` builds one from observed lengths.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple, Protocol


class CurveLike(Protocol):
    """What ``curve_of`` reads: ``router.decide.predict.PoolModel`` has these fields."""

    @property
    def spi(self) -> tuple[float, ...]: ...
    @property
    def tau_greedy(self) -> float: ...
    @property
    def tau_sampling(self) -> float: ...
    @property
    def prefill_base(self) -> float: ...
    @property
    def prefill_per_token(self) -> float: ...
    @property
    def cap(self) -> int | None: ...


class Curve(NamedTuple):
    """One mode's engine (wall seconds)."""

    spi: tuple[float, ...]  # seconds per iteration at batch b (index b >= 1; [0] = [1])
    tau_greedy: float = 1.0  # tokens per iteration, temperature 0
    tau_sampling: float = 1.0  # tokens per iteration, temperature > 0
    prefill_base: float = 0.03  # seconds per joining request
    prefill_per_token: float = 0.0004  # seconds per prompt token
    cap: int | None = None  # running requests the engine admits; more wait in its queue

    @property
    def limit(self) -> int:
        """The running cap, or the table's end when none is known."""
        return self.cap if self.cap is not None else max(1, len(self.spi) - 1)

    def iteration(self, batch: float) -> float:
        """Seconds per iteration at ``batch`` running (linear between whole sizes and past
        the table by its last slope, never downhill)."""
        spi = self.spi
        top = len(spi) - 1
        b = max(1.0, batch)
        if b >= top:
            slope = max(0.0, spi[top] - spi[top - 1]) if top >= 2 else 0.0
            return spi[top] + slope * (b - top)
        lo = int(b)
        return spi[lo] + (spi[lo + 1] - spi[lo]) * (b - lo)

    def tau(self, sampling: bool) -> float:
        return self.tau_sampling if sampling else self.tau_greedy

    def prefill(self, prompt_tokens: float) -> float:
        return self.prefill_base + prompt_tokens * self.prefill_per_token


def curve_of(model: CurveLike, scale: float | None = None) -> Curve:
    """A ``Curve`` from a ``PoolModel`` (or alike), in wall seconds (its ``scale``)."""
    s = scale if scale is not None else float(getattr(model, "scale", 1.0))
    return Curve(
        tuple(x * s for x in model.spi),
        model.tau_greedy,
        model.tau_sampling,
        model.prefill_base * s,
        model.prefill_per_token * s,
        model.cap,
    )


class Mix(NamedTuple):
    """The traffic's lengths and temperature share."""

    prompts: tuple[float, ...]  # prompt tokens, one point per equal-probability bin
    outputs: tuple[float, ...]  # output tokens, likewise
    sampling: float  # share at temperature > 0

    @property
    def prompt_mean(self) -> float:
        return sum(self.prompts) / len(self.prompts)

    @property
    def output_mean(self) -> float:
        return sum(self.outputs) / len(self.outputs)

    def close_to(self, other: Mix, tolerance: float) -> bool:
        """Means within ``tolerance`` (relative) and sampling shares within it (absolute)."""
        return (
            abs(self.sampling - other.sampling) <= tolerance
            and _near(self.prompt_mean, other.prompt_mean, tolerance)
            and _near(self.output_mean, other.output_mean, tolerance)
        )


def _near(a: float, b: float, tolerance: float) -> bool:
    return abs(a - b) <= tolerance * max(abs(a), abs(b), 1e-9)


def quantile_means(values: Sequence[float], bins: int) -> tuple[float, ...]:
    """The means of ``bins`` equal-count groups of the sorted values (fewer if few values)."""
    if not values:
        raise ValueError("need at least one value")
    xs = sorted(values)
    n = len(xs)
    bins = max(1, min(bins, n))
    out = []
    for i in range(bins):
        lo, hi = i * n // bins, (i + 1) * n // bins
        out.append(sum(xs[lo:hi]) / (hi - lo))
    return tuple(out)


def mix_of(
    prompts: Sequence[float], outputs: Sequence[float], sampling: float, bins: int = 12
) -> Mix:
    """A ``Mix`` from observed prompt and output lengths and the share at temperature > 0."""
    if not 0.0 <= sampling <= 1.0 or math.isnan(sampling):
        raise ValueError(f"the sampling share must be in [0, 1], got {sampling}")
    return Mix(quantile_means(prompts, bins), quantile_means(outputs, bins), sampling)


class Slo(NamedTuple):
    """The targets, wall seconds. The defaults are the router's (``SPEC_ROUTER_SLO_TTFT_MS``
    1000, ``SPEC_ROUTER_SLO_TPOT_MS`` 25) and its relaxed tier's multiples (3x TTFT, 2x TPOT:
    ``router.decide.capacity.RELAXED_TTFT`` / ``RELAXED_TPOT``)."""

    ttft: float = 1.0
    tpot: float = 0.025
    relaxed_ttft: float = 3.0  # multiple of ttft
    relaxed_tpot: float = 2.0  # multiple of tpot
