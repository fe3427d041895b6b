"""What the router knows of one pool's engines, and of one request, for the ``slo`` policy.

Plain values. A ``PoolModel`` is what the router knows of one pool's engines: seconds per
iteration at each batch size (from the calibrated or learned curves), tokens per iteration for
greedy and sampled requests (the speculative acceptance length; 1 for a baseline engine),
prefill time as ``base + tokens * per_token``, and the engine's cap on running requests when one
is known. All durations in the model are the engines' *model* time; ``scale`` turns them into
the wall-clock seconds clients see (1 for real engines). ``router.decide.capacity`` derives
each pool's SLO capacity from it; ``router.learn.models`` learns it.

Batch sizes past the table are extrapolated by its last slope (never downhill).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from router.pools import Pool


class PoolModel(NamedTuple):
    spi: tuple[float, ...]  # model seconds per iteration at batch b (index b >= 1; [0] = [1])
    tau_greedy: float = 1.0  # tokens per iteration, temperature 0
    tau_sampling: float = 1.0  # tokens per iteration, temperature > 0
    prefill_base: float = 0.03  # model seconds per joining request
    prefill_per_token: float = 0.0004  # model seconds per prompt token
    cap: int | None = None  # running requests the engine admits; more wait in its queue
    measured: int = 0  # largest batch size the curve was measured at (0: none)
    lowest: int = 1  # smallest batch size it was measured at (below it: the curve held flat)
    scale: float = 1.0  # wall seconds per model second
    peak: float = 0.0  # most output tokens/s one engine gives (``peak_throughput``); 0: unknown

    def iteration(self, batch: int) -> float:
        """Model seconds per iteration with ``batch`` running (past the table: linear)."""
        spi = self.spi
        top = len(spi) - 1
        if batch <= top:
            return spi[max(1, batch)]
        slope = max(0.0, spi[top] - spi[top - 1]) if top >= 2 else 0.0
        return spi[top] + slope * (batch - top)

    def capacity(self) -> float:
        """Most output tokens per second (model time) one engine gives, at any admitted batch."""
        return self.peak or peak_throughput(self)

    def tau(self, sampling: bool) -> float:
        return self.tau_sampling if sampling else self.tau_greedy

    def prefill(self, prompt_tokens: float) -> float:
        return self.prefill_base + prompt_tokens * self.prefill_per_token


def peak_throughput(model: PoolModel) -> float:
    top = min(len(model.spi) - 1, model.cap or len(model.spi) - 1)
    tau = (model.tau_greedy + model.tau_sampling) / 2
    return max(b * tau / model.iteration(b) for b in range(1, top + 1))


class Request(NamedTuple):
    """What is known of a request when it arrives (wall-clock SLO targets, in seconds)."""

    prompt_tokens: float
    output_tokens: float
    sampling: bool
    slo_ttft: float
    slo_tpot: float


# A request's predicted effect: the change in the objective when one more request joins a
# replica of ``pool`` already running ``load`` (``router.learn.learner.marginal_gain``).
Gain = Callable[[Pool, int], float]
