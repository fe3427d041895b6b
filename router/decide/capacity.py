"""Each pool's SLO capacity for the traffic as it is: the decision surface of the ``slo`` policy.

An engine that runs ``n`` requests at once in its steady state takes a new one as each ends
(Little: ``n`` over a request's life per second), and each arrival stalls every running request
for its prefill. Its time per output token is then its iteration time at ``n`` over the tokens
an iteration yields, stretched by the share of the time spent on those prefills; the share in
turn depends on how long a request lives, a fixed point. From the engine's model
(``router.decide.predict.PoolModel``: the calibrated or learned curves) and the traffic's mix
(mean prompt and output, the share at temperature > 0) this gives, for every load, the time per
token a request of each class would see (greedy requests gain more from speculation), and the
two numbers the policy routes by:

- ``strict``: the most requests one engine runs with them meeting the strict TPOT target;
- ``relaxed``: the same for the relaxed target (``RELAXED_TPOT`` times it),

with the requests per second one engine serves at each (``strict_rate``, ``relaxed_rate``), the
pool whose engines give the most tokens per second (``most``), the strict pool
(``reserved``: one whose strict capacity clearly exceeds the other's, kept within the strict
SLO) and the pool that takes a relaxed-only request last (``taken_last``).

Computed off the hot path, when the models or the mix change (the keeper's timer); a decision
reads it with a few comparisons. Pure arithmetic over plain values, in the engines' model seconds.
A surface takes tens of milliseconds, so it is also offered in steps (``surface_steps``: a
generator that yields between loads), for a caller that interleaves it with other work (the
router's event loop: ``router.lifecycle.keep_learning``).
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping
from typing import NamedTuple, TypeVar

from router.decide.params import Params
from router.decide.predict import PoolModel
from router.pools import BASELINE, SPECULATIVE, Pool

# The relaxed tier: a request that misses its SLO but stays within these multiples of it still
# counts (the traffic benchmark's relaxed goodput: TTFT 1 s -> 3 s, TPOT 25 ms -> 50 ms).
RELAXED_TTFT, RELAXED_TPOT = 3.0, 2.0
# Past this share of the time spent prefilling, an engine serves nothing within any TPOT target
# (the fixed point would divide by nearly zero).
MAX_STALL_SHARE = 0.95
# Where the output lengths are taken (standard normal quantiles: the deciles 10, 30, 50, 70 and
# 90 of a lognormal), each standing for a fifth of the requests.
QUANTILES = (-1.2816, -0.5244, 0.0, 0.5244, 1.2816)
# A capacity holds the median request within the target: the share of requests that must meet
# it (swept +-25% over the policy family: under a point of mean goodput either way).
MEET_SHARE = 0.5
# The largest load a surface tabulates; past it a request sees the last entry's time per token.
TOP = 256


class Mix(NamedTuple):
    """The traffic the surface is computed for (recent requests' decayed means)."""

    prompt: float = 1024.0  # prompt tokens
    output: float = 256.0  # output tokens
    sampling: float = 0.5  # share at temperature > 0
    spread: float = 0.0  # sigma of log(output tokens): lognormal about the mean


class Slo(NamedTuple):
    """The strict targets (model seconds); the relaxed ones are ``RELAXED_*`` times them."""

    ttft: float
    tpot: float


class Capacity(NamedTuple):
    """One pool's engines against the SLO, for one mix (see the module's docstring)."""

    strict: tuple[int, int]  # [sampling]: most requests running with this class within strict
    relaxed: tuple[int, int]  # ... within relaxed
    strict_rate: float  # requests/s one engine serves at the mix's strict capacity
    relaxed_rate: float
    # [sampling][n]: a request's time per token with n running (n >= 1; [0] repeats [1])
    tpot: tuple[tuple[float, ...], tuple[float, ...]]
    spi: tuple[float, ...]  # seconds per iteration with n running (as ``tpot``)
    prefill_base: float
    prefill_per_token: float
    cap: int | None  # the engine's running cap: past it requests wait in its queue
    measured: int  # the largest batch the curve was measured at
    tau: tuple[float, float] = (1.0, 1.0)  # [sampling]: tokens per iteration
    prefill: float = 0.0  # seconds of one of the mix's prefills
    lowest: int = 1  # the smallest batch the curve was measured at (below: held flat)

    def ttft(self, prompt: float, n: int, busy: float = 0.0) -> float:
        """A request's time to first token joining with ``n`` running (itself included): half an
        iteration's wait for the boundary (and half a prefill, the ``busy`` share of the time
        the engine is prefilling others), then its prefill in its join iteration; past the cap,
        the wait for a place (an iteration per request ahead of it, a rough bound)."""
        spi = self.spi[n if n <= TOP else TOP]
        wait = 1.5 * spi + busy * self.prefill / 2
        cap = self.cap
        if cap is not None and n > cap:
            wait += (n - cap) * spi
        return wait + self.prefill_base + prompt * self.prefill_per_token

    def busy(self, arriving: float) -> float:
        """The share of the time an engine prefills, ``arriving`` requests a second."""
        return min(MAX_STALL_SHARE, arriving * self.prefill)

    def own_tpot(self, c: int, n: int, busy: float) -> float:
        """A request's time per token with ``n`` running, the engine ``busy`` prefilling."""
        return self.spi[n if n <= TOP else TOP] / self.tau[c] / (1.0 - busy)


class Surface(NamedTuple):
    """Both pools' capacities, for one mix and arrival rate."""

    pools: Mapping[Pool, Capacity]
    mix: Mix
    slo: Slo
    scale: float = 1.0  # wall seconds per model second (the table's time scale)
    most: Pool = BASELINE  # the pool whose engines give the most tokens per second
    params: Params = Params()
    arriving: float | None = None  # requests/s reaching one engine it was computed for
    # [sampling]: the pool kept within the strict SLO (``reserved``), or None
    strict_pool: tuple[Pool | None, Pool | None] = (None, None)
    # [sampling]: the pool step 2 takes last (``taken_last``), or None
    last: tuple[Pool | None, Pool | None] = (None, None)


def reserved(spec: Capacity, base: Capacity, c: int, ratio: float) -> Pool | None:
    """The strict pool for requests of class ``c``: the pool whose strict capacity is at least
    ``ratio`` times the other's (None: neither). It is where the strict SLO is served: a
    request that only fits within the relaxed SLO goes to the other pool while that has room,
    and under sustained overload the excess goes to the other pool too."""
    s, b = spec.strict[c], base.strict[c]
    if s > b and s >= ratio * b:
        return SPECULATIVE
    if b > s and b >= ratio * s:
        return BASELINE
    return None


def taken_last(
    spec: Capacity, base: Capacity, c: int, strict_pool: Pool | None, lead: float
) -> Pool | None:
    """The pool that takes a request of class ``c`` last when it fits only within the relaxed
    SLO (step 2 of the ``slo`` policy): the strict pool, or with none, the pool whose strict
    capacity exceeds the other's by at least ``lead`` requests (None: neither). It keeps its
    room within the strict SLO while the other has relaxed room; unlike the strict pool it
    does not turn the excess away under sustained overload."""
    if strict_pool is not None:
        return strict_pool
    s, b = spec.strict[c], base.strict[c]
    if s >= b + lead:
        return SPECULATIVE
    if b >= s + lead:
        return BASELINE
    return None


def stall_share(n: float, prefill: float, decode: float) -> float:
    """The share of the time an engine spends prefilling when it runs ``n`` requests in its
    steady state, each ``prefill`` seconds to join and ``decode`` seconds of decode unstalled.

    With ``x`` that share, a request lives ``prefill + decode / (1 - x)``, ``n`` of them end
    (and are replaced) per life, each stalling the engine for ``prefill``: ``x = n * prefill /
    life``, the smaller root of ``P x^2 - (P (1 + n) + D) x + n P = 0``."""
    if prefill <= 0 or n <= 0:
        return 0.0
    b = prefill * (1.0 + n) + decode
    x = (b - math.sqrt(max(0.0, b * b - 4.0 * prefill * prefill * n))) / (2.0 * prefill)
    return min(MAX_STALL_SHARE, max(0.0, x))


def poisson_cdf(k: float, mean: float) -> float:
    """P(N <= k) for N ~ Poisson(mean), linear between whole k (smooth in the headroom)."""
    if k < 0:
        return 0.0
    if mean <= 0 or k > mean + 8.0 * math.sqrt(mean) + 8.0:
        return 1.0  # (the rest of the tail is below 1e-9)
    whole = int(k)
    term = total = math.exp(-mean)
    for i in range(1, whole + 2):
        if i == whole + 1:
            return total + (k - whole) * term * mean / i
        term *= mean / i
        total += term
    return total  # (not reached)


T = TypeVar("T")
Steps = Generator[None, None, T]  # yields between pieces of work, returns the result


def finish(steps: Steps[T]) -> T:
    """Run ``steps`` to the end, at once."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: T = done.value
            return result


def capacity(
    model: PoolModel, mix: Mix, slo: Slo, params: Params, arriving: float | None = None
) -> Capacity:
    """``capacity_steps``, at once."""
    return finish(capacity_steps(model, mix, slo, params, arriving))


def capacity_steps(
    model: PoolModel, mix: Mix, slo: Slo, params: Params, arriving: float | None = None
) -> Steps[Capacity]:
    """``model``'s engines against ``slo`` for traffic like ``mix`` (see the module).

    With ``n`` running, a request of the mix's size decodes for ``D`` seconds unstalled while
    prefills of ``P`` seconds each join: at the rate that keeps ``n`` running in the steady
    state, or at ``arriving`` (requests per second reaching one engine lately), whichever is
    lower (a burst that ran the engine up to ``n`` is not a rate that keeps it there). It meets
    a target ``T`` per token if at most ``(T (L - 1) - D) / P`` of them land in its decode, a
    Poisson count, over the quantiles of the output lengths: the share of requests that meet
    it. An engine's capacity is the most it runs with at least ``MEET_SHARE`` of them
    meeting it; its rate, the requests per second it serves there in the steady state. Yields
    after each load it tries."""
    h = min(1.0, max(0.0, mix.sampling))
    greedy, sampling = model.tau(False), model.tau(True)
    tau_mix = 1.0 / (h / sampling + (1.0 - h) / greedy)
    prefill = model.prefill(mix.prompt)
    tokens = max(1.0, mix.output - 1.0)  # after the first
    cap = model.cap
    top = min(TOP, cap) if cap is not None else TOP
    spi = [model.iteration(max(1, n)) for n in range(TOP + 1)]
    target = slo.tpot * params.tpot_margin
    # with n running: the steady state's rate, and the joins' rate and stretch of the decode
    steady = [0.0] * (TOP + 1)
    stretch = {False: [1.0] * (TOP + 1), True: [1.0] * (TOP + 1)}  # [lately][n]
    joins = {False: [0.0] * (TOP + 1), True: [0.0] * (TOP + 1)}
    for n in range(1, TOP + 1):
        running = min(n, top)
        decode = tokens * spi[running] / tau_mix
        x = stall_share(running, prefill, decode)
        steady[n] = running / (prefill + decode / (1.0 - x))
        stretch[False][n], joins[False][n] = 1.0 / (1.0 - x), steady[n]
        lately = steady[n] if arriving is None else min(steady[n], arriving)
        stretch[True][n] = 1.0 / (1.0 - min(MAX_STALL_SHARE, lately * prefill))
        joins[True][n] = lately
    for table in (*stretch.values(), *joins.values()):
        table[0] = table[1]
    tpot = tuple(
        tuple(spi[min(n, top) if n else 1] / tau * stretch[True][n] for n in range(TOP + 1))
        for tau in (greedy, sampling)
    )

    # the outputs' quantiles (a lognormal of the mix's mean and spread), each a share of them
    median = tokens * math.exp(-mix.spread * mix.spread / 2)
    lengths = [max(1.0, median * math.exp(mix.spread * z)) for z in QUANTILES]

    def meets(tau: float, n: int, bound: float, lately: bool) -> float:
        """The share of requests within ``bound`` per token with ``n`` running."""
        per_token = spi[min(n, top)] / tau
        rate, s = joins[lately][n], stretch[lately][n]
        share = 0.0
        for length in lengths:
            if prefill <= 0:
                share += 1.0 if per_token <= bound else 0.0
                continue
            exposure = rate * length * per_token * s
            share += poisson_cdf((bound - per_token) * length / prefill, exposure)
        return share / len(lengths)

    def most(tau: float, bound: float, lately: bool = True) -> Steps[int]:
        k = 0
        for n in range(1, top + 1):
            yield
            if meets(tau, n, bound, lately) < MEET_SHARE:
                break
            k = n
        return k

    relax = target * RELAXED_TPOT
    strict_mix = yield from most(tau_mix, target)
    relaxed_mix = yield from most(tau_mix, relax)
    strict, relaxed = [], []
    for tau in (greedy, sampling):
        strict.append(min(strict_mix, (yield from most(tau, target))))
    for tau in (greedy, sampling):
        relaxed.append(min(relaxed_mix, (yield from most(tau, relax))))
    strict_steady = yield from most(tau_mix, target, False)
    relaxed_steady = yield from most(tau_mix, relax, False)
    return Capacity(
        (strict[0], strict[1]),
        (relaxed[0], relaxed[1]),
        steady[strict_steady],
        steady[relaxed_steady],
        (tpot[0], tpot[1]),
        tuple(spi),
        model.prefill_base,
        model.prefill_per_token,
        cap,
        model.measured,
        tau=(greedy, sampling),
        prefill=prefill,
        lowest=model.lowest,
    )


def surface(
    models: Mapping[Pool, PoolModel],
    mix: Mix,
    slo: Slo,
    params: Params,
    arriving: float | None = None,
) -> Surface:
    """``surface_steps``, at once."""
    return finish(surface_steps(models, mix, slo, params, arriving))


def surface_steps(
    models: Mapping[Pool, PoolModel],
    mix: Mix,
    slo: Slo,
    params: Params,
    arriving: float | None = None,
) -> Steps[Surface]:
    """Both pools' capacities for ``mix`` with ``arriving`` requests per second reaching each
    engine lately (None: as many as keep it at each load), in steps (``capacity_steps``)."""
    spec = yield from capacity_steps(models[SPECULATIVE], mix, slo, params, arriving)
    base = yield from capacity_steps(models[BASELINE], mix, slo, params, arriving)
    pools: dict[Pool, Capacity] = {SPECULATIVE: spec, BASELINE: base}
    most: Pool = (
        SPECULATIVE if models[SPECULATIVE].capacity() > models[BASELINE].capacity() else BASELINE
    )
    strict_pool = (
        reserved(spec, base, 0, params.reserve),
        reserved(spec, base, 1, params.reserve),
    )
    last = (
        taken_last(spec, base, 0, strict_pool[0], params.lead),
        taken_last(spec, base, 1, strict_pool[1], params.lead),
    )
    scale = models[SPECULATIVE].scale
    return Surface(pools, mix, slo, scale, most, params, arriving, strict_pool, last)
