"""Predicting one request's latency on an engine, and what it costs the requests already there.

Pure arithmetic over plain values. A ``PoolModel`` is what the router knows of one pool's
engines: seconds per iteration at each batch size (from the calibrated or learned curves),
tokens per iteration for greedy and sampled requests (the speculative acceptance length; 1 for a
baseline engine), prefill time as ``base + tokens * per_token``, and the engine's cap on running
requests when one is known. All durations in the model are the engines' *model* time; ``scale``
turns them into the wall-clock seconds clients see (1 for real engines).

For a request with ``prompt`` tokens that wants ``output`` tokens, on a backend with ``load``
requests in flight of which ``prefill_share`` of the recent time went to prefilling joiners:

- iterations take ``spi(min(load + 1, cap))``, stretched by ``1 / (1 - prefill_share)``: every
  joining request stalls the whole batch for its prefill (the SGLang/vLLM continuous-batching
  behaviour the sims model);
- TTFT = the wait for a free slot (when ``load + 1 > cap``) + half an iteration (the boundary at
  which it joins) + its own prefill + its join iteration;
- TPOT = the stretched iteration time / tokens per iteration of its class;
- the requests already there get one stall of this prefill, spread over their output, and a batch
  one larger while this request runs.

Predictions outside the measured range of batch sizes are extrapolated by the curve (never
downhill) and flagged, so ``/router/status`` can say so.
"""

from __future__ import annotations

import math
from typing import NamedTuple

# Above this share of time spent prefilling, the estimate of the stretch stops growing: the
# queue of joiners is then the engine's real problem, and the TTFT prediction carries it.
MAX_PREFILL_SHARE = 0.8
# An expected load past this is a runaway estimate, not a batch (and must stay finite).
MAX_LOAD = 100_000.0


class PoolModel(NamedTuple):
    spi: tuple[float, ...]  # model seconds per iteration at batch b (index b >= 1; [0] = [1])
    tau_greedy: float = 1.0  # tokens per iteration, temperature 0
    tau_sampling: float = 1.0  # tokens per iteration, temperature > 0
    prefill_base: float = 0.03  # model seconds per joining request
    prefill_per_token: float = 0.0004  # model seconds per prompt token
    cap: int | None = None  # running requests the engine admits; more wait in its queue
    measured: int = 0  # largest batch size the curve was measured at (0: none)
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


class Prediction(NamedTuple):
    ttft: float  # wall seconds
    tpot: float  # wall seconds per output token after the first
    others_tpot: float  # the requests already there: their TPOT now (wall, mean class)
    others_delta: float  # ... and how much this request adds to it
    extrapolated: bool  # the batch size is beyond the measured range


def predict(
    model: PoolModel,
    load: int,
    prefill_share: float,
    req: Request,
    mean_output: float,
    sampling_share: float = 0.5,
    load_avg: float | None = None,
) -> Prediction:
    """``load_avg``: the backend's recent mean load. A request lives through many arrivals and
    departures, so the batch it decodes in tends from ``load`` towards that mean."""
    cap = model.cap if model.cap is not None else math.inf
    run_now = min(load, cap)
    lifetime = load if load_avg is None else (load + min(load_avg, MAX_LOAD)) / 2
    run_next = int(min(math.floor(lifetime + 0.5) + 1, cap))
    t_now = model.iteration(int(run_now)) if run_now else 0.0
    t_next = model.iteration(run_next)
    stretch = 1.0 / (1.0 - min(max(prefill_share, 0.0), MAX_PREFILL_SHARE))
    tau = model.tau(req.sampling)
    prefill = model.prefill(req.prompt_tokens)
    wait = 0.0
    if load + 1 > cap:
        # a slot frees each time one of ``cap`` running requests ends
        service = max(1.0, mean_output) / tau * t_next * stretch
        wait = (load + 1 - cap) * service / cap
    ttft = wait + t_now * stretch / 2 + prefill + t_next
    tpot = t_next * stretch / tau
    # the others: tokens per iteration of the traffic mix, and their share of this request
    tau_mix = 1.0 / (sampling_share / model.tau_sampling + (1 - sampling_share) / model.tau_greedy)
    others = t_now * stretch / tau_mix if run_now else 0.0
    overlap = min(1.0, max(1.0, req.output_tokens) / max(1.0, mean_output))
    delta = prefill / max(1.0, mean_output - 1) + (t_next - t_now) * stretch / tau_mix * overlap
    s = model.scale
    return Prediction(
        ttft * s,
        tpot * s,
        others * s,
        delta * s if run_now else 0.0,
        run_next > max(1, model.measured),
    )


# How soft ``meets`` is: the spread of a request's real latency around the prediction, as a share
# of the target. (A lab sweep, bench/results/policy-lab.md, found 0.4 with HARM_WEIGHT 1.5 and
# STRICT_WEIGHT 1.0 better in the lab at 70% and 110% load; one HTTP pass did not confirm it at
# 110%, so the defaults stay as they were until it is measured again.)
MEETS_WIDTH = 0.1
# Weight of the chance a placement takes from the requests already there, against its own.
HARM_WEIGHT = 1.0


def meets(value: float, target: float, width: float | None = None) -> float:
    """A soft ``value <= target``: 1 well below, 0 well above, linear within ``width``."""
    w = MEETS_WIDTH if width is None else width
    lo, hi = target * (1 - w), target * (1 + w)
    if value <= lo:
        return 1.0
    if value >= hi:
        return 0.0
    return (hi - value) / (hi - lo)


# The relaxed tier: a request that misses its SLO but stays within these multiples of it still
# counts for something (the same factors as the strict and relaxed goodput of the traffic
# benchmark: TTFT 1 s -> 3 s, TPOT 25 ms -> 50 ms).
RELAXED_TTFT, RELAXED_TPOT = 3.0, 2.0
# The strict tier counts half as much as the relaxed one: a request past its SLO but within the
# relaxed tier is still served well enough for most clients, and protecting that tier keeps
# more requests usable when the engines are busy (bench/policy_lab.py).
STRICT_WEIGHT = 0.5
# Among placements that add as much goodput, the faster one: a small pull towards lower latency.
TIE_WEIGHT = 0.01


def _tier(p: Prediction, ttft: float, tpot: float, others: int) -> float:
    own = meets(p.ttft, ttft) * meets(p.tpot, tpot)
    if not others or p.others_delta <= 0:
        return own
    before = meets(p.others_tpot, tpot)
    after = meets(p.others_tpot + p.others_delta, tpot)
    return own - HARM_WEIGHT * others * (before - after)


def chance(p: Prediction, req: Request) -> float:
    """The request's own chance to meet the relaxed SLO with this prediction."""
    ttft, tpot = req.slo_ttft * RELAXED_TTFT, req.slo_tpot * RELAXED_TPOT
    return meets(p.ttft, ttft) * meets(p.tpot, tpot)


def failing(p: Prediction, req: Request) -> bool:
    """Whether the requests already on that backend miss even the relaxed TPOT target."""
    return p.others_tpot > req.slo_tpot * RELAXED_TPOT


def value(p: Prediction, req: Request, others: int, tie: float = TIE_WEIGHT) -> float:
    """Expected goodput this placement adds, at the request's SLO and at a relaxed one: its own
    chance to meet each, minus the chance it takes from the ``others`` in flight there (their
    TPOT target taken to be this request's); and a small pull towards the lower latency to
    break ties (under overload, where nothing meets either, it spreads the excess by latency)."""
    strict = _tier(p, req.slo_ttft, req.slo_tpot, others)
    relaxed = _tier(p, req.slo_ttft * RELAXED_TTFT, req.slo_tpot * RELAXED_TPOT, others)
    latency = p.ttft / req.slo_ttft + p.tpot / req.slo_tpot
    return STRICT_WEIGHT * strict + relaxed - tie * latency
