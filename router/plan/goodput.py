"""Expected goodput of a split: the share of requests meeting the strict and relaxed SLO when
``k`` engines run speculative and ``m`` baseline, at a total arrival rate and mix.

The router in front, as spillover: a speculative engine takes a request while the least
loaded one has fewer than a threshold in flight, the least loaded engine of a pool gets it,
and the rest spills to the baseline pool (in bursts: when all the speculative engines are
full; see ``overflow_peakedness``). With one pool empty the other takes everything. The
threshold: for the router's default policy (``slo``, ``ModelParams.router``) the one with the
best objective for the split and rate (``best_spill``), which is where that policy ends up;
for ``spillover`` the crossover (``spill_threshold``).

A pool of ``k`` alike engines is a birth-death process on the requests in flight ``n``
(Poisson arrivals; join-the-least-loaded keeps its engines within one request of each other).
An engine with ``b`` running serves them like a processor shared in iterations, with each
request's prefill as work no one else progresses during: it finishes
``1 / (spi(b) * work / b + prefill)`` requests per second (``work``: iterations per request,
its join included); past the running cap the rest queue.

A request arriving at ``n`` (Poisson arrivals see the process's own distribution) joins an
engine with ``c = n // k`` in flight:

- TTFT: its wait in the queue past the cap, the rest of the iteration under way (a decode
  iteration, or a prefill stall, length-biased), its join iteration: ``spi``, its own prefill
  and the prefills of those that join with it.
- TPOT: its ``(L - 1) / tau`` decode iterations at the batch it decodes in, plus the prefills
  of the requests that join its engine meanwhile, over its ``L - 1`` tokens. The batch starts
  where it joined and relaxes towards the mean at the pool's own rate (the slope of its
  departure rate), so a short request decodes at about the batch it found and a long one at
  about the mean, give or take the batch's own spread over its life.

Pure arithmetic over plain values (wall seconds); pool results are cached on a geometric grid
of rates and interpolated, so a planner can ask for many rates cheaply. A pool's states, decodes
and prefills are evaluated as arrays (numpy), each formula as it reads; numpy is imported in
the functions that use it, since the router's own process imports this module but plans in a
child (``router.planning.worker``).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING, Literal, NamedTuple

from router.plan.values import Curve, Mix, Slo

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Floats = npt.NDArray[np.float64]
    Ints = npt.NDArray[np.intp]

SQRT2 = math.sqrt(2.0)
SQRT3 = math.sqrt(3.0)


class ModelParams(NamedTuple):
    """The goodput model's own constants (provenance: ``bench/results/fleet-lab.md``'s model
    error table, the model against the lab's engines)."""

    # The rate grid's ratio: results are computed at rates r0 * step**i and interpolated.
    # 1.04: 4% steps keep the interpolation error under a tenth of a point where goodput falls
    # fastest (a pool at its knee), at ~60 grid points per decade.
    grid_step: float = 1.04
    # A request that would wait in the queue longer than this many relaxed TTFTs fails anyway:
    # the queue is cut there (what arrives then counts as failing).
    queue_ttfts: float = 2.0
    # The prefills' share of time is capped here (the engine is then past what it can serve).
    max_stall: float = 0.95
    # The router in front: "slo" (the router's default policy) is modelled as spillover at the
    # threshold with the best objective for the split and rate (``best_spill``); "spillover"
    # at the crossover (``spill_threshold``). Against the lab's slo router (flat loads, every
    # split, three regimes; fleet-lab.md's model table) the best threshold is within 1.3-1.5
    # points of the objective on average, the crossover 2.3-2.9 with mixed splits' relaxed
    # goodput 10-20 points low past 85% load.
    router: Literal["slo", "spillover"] = "slo"
    # The objective the best threshold is chosen for (the planner's ``strict_weight``).
    strict_weight: float = 0.2


DEFAULT = ModelParams()


class Goodput(NamedTuple):
    """Shares of the offered requests meeting each tier."""

    strict: float
    relaxed: float

    def value(self, strict_weight: float) -> float:
        """``strict_weight * strict + (1 - strict_weight) * relaxed``."""
        return strict_weight * self.strict + (1.0 - strict_weight) * self.relaxed


class PoolResult(NamedTuple):
    strict: float  # share of the offered requests admitted here and meeting the strict SLO
    relaxed: float
    blocked: float  # share not admitted (spilled over, or lost to a hopeless queue)
    batch: float  # mean requests in flight per engine


def phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / SQRT2))


def _phis(x: Floats) -> Floats:
    """``phi`` elementwise (numpy has no erf: ``math.erf`` over the values, one C call each,
    but where it is +-1 to the last bit: ``math.erf(6.0) == 1.0``)."""
    import numpy as np

    z = x / SQRT2
    erf = np.sign(z)
    body = np.abs(z) < 6.0
    inner = z[body].tolist()
    erf[body] = np.fromiter(map(math.erf, inner), np.float64, len(inner))
    return 0.5 * (1.0 + erf)


def _iterations(spi: Floats, batch: Floats) -> Floats:
    """``Curve.iteration`` elementwise (the same arithmetic), ``spi`` the curve's as an array."""
    import numpy as np

    top = len(spi) - 1
    b = np.maximum(1.0, batch)
    slope = max(0.0, spi[top] - spi[top - 1]) if top >= 2 else 0.0
    lo = np.minimum(b.astype(np.intp), max(0, top - 1))
    inside = spi[lo] + (spi[np.minimum(lo + 1, top)] - spi[lo]) * (b - lo)
    out: Floats = np.where(b >= top, spi[top] + slope * (b - top), inside)
    return out


# --- what one request's work looks like on a curve -----------------------------------------


class Law(NamedTuple):
    prefills: tuple[float, ...]  # seconds, one per prompt bin
    stall_mean: float
    stall_var: float
    decodes: tuple[tuple[float, float, float], ...]  # (tokens after the first, iterations, weight)
    work: float  # mean iterations per request, its join included
    departures: tuple[float, ...]  # requests finished per second by one engine with b in flight


@lru_cache(maxsize=256)
def law(curve: Curve, mix: Mix) -> Law:
    prefills = tuple(curve.prefill(p) for p in mix.prompts)
    m = sum(prefills) / len(prefills)
    var = sum((s - m) ** 2 for s in prefills) / len(prefills)
    decodes = []
    for out in mix.outputs:
        tokens = max(0.0, out - 1.0)
        for sampling, share in ((False, 1.0 - mix.sampling), (True, mix.sampling)):
            if share > 0:
                decodes.append((tokens, tokens / curve.tau(sampling), share / len(mix.outputs)))
    work = 1.0 + sum(iters * w for _, iters, w in decodes)
    departures = (0.0,) + tuple(
        1.0 / (curve.iteration(b) * work / b + m) for b in range(1, curve.limit + 1)
    )
    return Law(prefills, m, var, tuple(decodes), work, departures)


def mix_tau(curve: Curve, mix: Mix) -> float:
    """Tokens per iteration over the mix (harmonic: per token, iterations add up)."""
    h = mix.sampling
    return 1.0 / (h / curve.tau(True) + (1.0 - h) / curve.tau(False))


def slow_batch(curve: Curve, mix: Mix, target: float, mp: ModelParams = DEFAULT) -> int:
    """The first batch at which one engine's steady state misses ``target`` seconds per
    output token on average (the rate that keeps that many running, by Little's law, with the
    decode stretched by that rate's prefills); one past the cap if none does."""
    lw = law(curve, mix)
    tau = mix_tau(curve, mix)
    for b in range(1, curve.limit + 1):
        stalls = min(mp.max_stall, lw.departures[b] * lw.stall_mean)
        if curve.iteration(b) / tau / (1.0 - stalls) > target:
            return b
    return curve.limit + 1


@lru_cache(maxsize=256)
def spill_threshold(spec: Curve, base: Curve, mix: Mix, slo: Slo) -> int:
    """In flight on the least loaded speculative engine below which it takes a request (when
    a baseline engine is up to take the rest): the first batch at which speculation stops
    paying, because the baseline is as fast per token at the mix's acceptance (the crossover)
    or because a speculative engine there misses the strict TPOT target on average."""
    ts, tb = mix_tau(spec, mix), mix_tau(base, mix)
    slow = slow_batch(spec, mix, slo.tpot)
    for b in range(1, slow):
        if spec.iteration(b) / ts >= base.iteration(b) / tb:
            return b
    return max(1, min(slow, spec.limit))


# --- one request's chances at a state --------------------------------------------------------


def _poisson_below(mean: Floats, k: int) -> Floats:
    """P(X < k) elementwise, X ~ Poisson(mean) (from logs where exp(-mean) underflows)."""
    import numpy as np

    term = np.exp(-mean)
    total = term
    for i in range(1, k):
        term = term * (mean / i)
        total = total + term
    big = mean > 700.0
    if big.any():
        m = np.where(big, mean, 1.0)
        log_mean = np.log(m)
        terms = [np.exp(-m + i * log_mean - math.lgamma(i + 1.0)) for i in range(k)]
        total = np.where(big, sum(terms[1:], terms[0]), total)
    return total


def _lognormal_cdf(h: Floats, mean: Floats, sd: Floats) -> Floats:
    """P(X <= h) elementwise, X lognormal with this mean and standard deviation (``h`` may
    have more axes in front: one row per headroom)."""
    import numpy as np

    with np.errstate(divide="ignore", invalid="ignore"):
        s2 = np.log1p((sd / mean) ** 2)
        z = (np.log(h) - np.log(mean) + s2 / 2.0) / np.sqrt(s2)  # h / mean: underflow
    out = np.where(h >= mean, 1.0, 0.0)  # (no spread: a step)
    live = (h > 0) & (sd > 1e-12 * mean)
    out[live] = _phis(z[live])
    out[h <= 0] = 0.0
    return out


def stall_cdf(h: float, count: float, mean: float, var: float, engines: int = 1,
              spread: float = 1.0) -> float:  # fmt: skip
    """P(S <= h): S the prefills of the requests that join a request's engine while it
    decodes, ``count`` of them on average, each of this mean and variance.

    None join with the chance that the pool has had fewer than ``engines`` arrivals (behind a
    join-the-least-loaded router the request's engine has just taken one and takes about every
    ``engines``-th after). Given some, S is lognormal (prefills are skewed, and so is their
    sum) with the variance of a compound Poisson sum,
    ``count * E[s^2]``, times ``spread``: the request's life is a delay busy period (the
    joiners' prefills stall it, and more join meanwhile), which multiplies that variance by
    ``1 / (1 - stall share)^2``; and bursty arrivals (an overflow) by their peakedness.
    (``stall_cdfs``: the same over arrays.)"""
    import numpy as np

    return float(stall_cdfs(np.array([h]), np.array([count]), mean, var, engines, spread)[0])


def stall_cdfs(h: Floats, count: Floats, mean: float, var: float, engines: int = 1,
               spread: float = 1.0) -> Floats:  # fmt: skip
    """``stall_cdf`` elementwise over ``h`` and ``count`` (``h`` may have more axes in front:
    several headrooms at each count)."""
    import numpy as np

    if mean <= 0:
        return np.where(h < 0, 0.0, 1.0)
    k = engines
    pool = k * count
    none = np.where(pool < 700, _poisson_below(np.minimum(pool, 700.0), k), 0.0)
    more = 1.0 - none
    total = count * mean
    second = count * (var + mean * mean) * spread + total * total
    with np.errstate(divide="ignore", invalid="ignore"):
        m1 = np.maximum(total / more, mean)
        sd = np.sqrt(np.maximum(0.0, second / more - m1 * m1))
        got = np.minimum(1.0, none + more * _lognormal_cdf(h, m1, sd))
    sure = (count < 1e-9) | (more < 1e-12)
    return np.where(h < 0, 0.0, np.where(sure, 1.0, got))


def joined_within(window: float, rate: float, engines: int) -> float:
    """Expected arrivals an engine of ``engines`` takes within ``window`` after taking one
    (see ``stall_cdf``): the sum over j of P(the pool has >= j * engines arrivals), which is
    ``E[N // engines] = (E[N] - E[N mod engines]) / engines`` for the pool's count ``N``.

    In bounded steps for any rate: ``N mod engines`` is summed over the count's likely values
    only (eight standard deviations either side), and where the count is spread over many
    multiples of ``engines`` it is uniform (its periodic part falls as
    ``exp(-2 pi^2 mean / engines^2)``). (``joined``: the same over an array of windows.)"""
    import numpy as np

    return float(joined(np.array([window], dtype=np.float64), rate, engines)[0])


def joined(window: Floats, rate: float, engines: int) -> Floats:
    """``joined_within`` elementwise over ``window``."""
    import numpy as np

    with np.errstate(invalid="ignore", over="ignore"):
        pool = rate * engines * window
    k = max(1, engines)
    live = pool > 0  # (not NaN either)
    if k == 1:
        return np.where(live, pool / k, 0.0)
    spread = live & (pool > 4.0 * k * k + 400.0)  # (infinite too)
    out = np.where(spread, (pool - (k - 1) / 2.0) / k, 0.0)
    near = live & ~spread
    if near.any():
        m = pool[near]
        sd = np.sqrt(m)
        lo = np.maximum(0.0, np.floor(m - 8.0 * sd))
        hi = np.ceil(m + 8.0 * sd) + k
        i = np.arange(lo.min(), hi.max() + 1.0)[None, :]  # every window's counts, masked
        inside = (i >= lo[:, None]) & (i <= hi[:, None])
        lgam = np.fromiter(map(math.lgamma, (i[0] + 1.0).tolist()), np.float64, i.shape[1])
        terms = np.where(inside, np.exp(-m[:, None] + i * np.log(m)[:, None] - lgam), 0.0)
        remainder = (terms * (i % k)).sum(axis=1) / terms.sum(axis=1)
        out[near] = np.maximum(0.0, (m - remainder) / k)
    return out


class _Arrays(NamedTuple):
    """A curve's and a mix's numbers as arrays: the curve's seconds per iteration, the law's
    departures and prefills, its decodes with tokens to decode, and the weight of the rest (a
    single token: no TPOT to miss)."""

    spi: Floats
    departures: Floats
    prefills: Floats
    tokens: Floats
    iters: Floats
    weight: Floats
    done: float


@lru_cache(maxsize=256)
def _arrays(curve: Curve, mix: Mix) -> _Arrays:
    lw = law(curve, mix)
    live = [d for d in lw.decodes if d[0] > 0]
    done = sum((w for tokens, _, w in lw.decodes if tokens <= 0), 0.0)
    tokens, iters, weight = (_array(tuple(d[i] for d in live)) for i in range(3))
    return _Arrays(_array(curve.spi), _array(lw.departures), _array(lw.prefills), tokens, iters,
                   weight, done)  # fmt: skip


class _Pool(NamedTuple):
    """What the chances at each state share: the pool's rate and spread."""

    curve: Curve
    arrays: _Arrays
    lw: Law
    slo: Slo
    engines: int
    limit: int  # the most running on one engine: its cap, or the spill threshold if lower
    rate: float  # admitted per engine
    stall_share: float  # of time, per engine
    discount: float  # the least loaded engine's chance of being mid-stall, against one engine's
    mean: float  # running per engine (the tagged request's company: itself excluded)
    var: float
    relax: float  # seconds for the batch to relax towards its mean
    peakedness: float  # of the arrivals (1: Poisson)


def _tpot_ok(pool: _Pool, others: Ints) -> tuple[Floats, Floats]:
    """The chances of a request that finds ``others`` in flight on its engine (one per
    element) of keeping the strict and the relaxed TPOT (see the module's docstring)."""
    import numpy as np

    curve, lw, slo = pool.curve, pool.lw, pool.slo
    dec = pool.arrays
    cap = pool.limit
    start = (np.minimum(others, cap - 1) + 1.0)[:, None]
    # Its company: the others in flight (the mean, as Poisson arrivals see it), fewer as the
    # engine fills towards its limit, where all but this one's slot are someone else's; and the
    # requests joining while it decodes arrive as fast as that company turns over.
    company = 1.0 - pool.mean / (cap * cap)
    centre = min(float(cap), 1.0 + pool.mean * company)
    spi_centre = curve.iteration(centre)
    stretch = 1.0 / (1.0 - pool.stall_share)
    spread = (1.0 + (pool.peakedness - 1.0) / pool.engines) * stretch * stretch  # see stall_cdf
    t_strict, t_relaxed = slo.tpot, slo.tpot * slo.relaxed_tpot
    # each decode's batch starts where it joined and relaxes towards the centre over its life
    life = dec.iters * spi_centre * stretch
    x = life / pool.relax
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.exp(-x)
        w = np.where(x < 1e-6, 1.0, (1.0 - e) / x)
        v = np.where(x < 1e-6, 1.0, (2.0 / x) * (1.0 - (1.0 - e) / x))
    sd = np.sqrt(pool.var * np.maximum(0.0, v - w * w))
    # three-point Gauss-Hermite over the batch's spread (one point where it has none): the
    # points (decode d, offset) each state's batch is judged at
    three = sd >= 1e-3
    d = np.concatenate([np.arange(len(sd)), np.flatnonzero(three), np.flatnonzero(three)])
    offsets = np.concatenate([np.zeros(len(sd)), -SQRT3 * sd[three], SQRT3 * sd[three]])
    q = np.concatenate([np.where(three, 2 / 3, 1.0), np.full(2 * int(three.sum()), 1 / 6)])
    mid = centre + (start - centre) * w[d]  # (state, point)
    b = np.minimum(float(cap), np.maximum(1.0, mid + offsets))
    t0 = dec.iters[d] * _iterations(dec.spi, b)
    count = pool.rate * t0 * stretch * company
    tokens = dec.tokens[d]
    h = np.stack([t_strict * tokens - t0, t_relaxed * tokens - t0])
    ok = stall_cdfs(h, count, lw.stall_mean, lw.stall_var, pool.engines, spread)
    got = dec.done + (ok * (dec.weight[d] * q)).sum(axis=2)
    return got[0], got[1]


def _ttft_ok(pool: _Pool, others: Ints, wait: Floats) -> tuple[Floats, Floats]:
    """The chances of a request that finds ``others`` in flight on its engine and waits
    ``wait`` in its queue (one per element) of keeping the strict and the relaxed TTFT."""
    import numpy as np

    curve, lw, slo = pool.curve, pool.lw, pool.slo
    cap = curve.limit
    running = np.minimum(others, cap)
    arrays = pool.arrays
    spi_join = _iterations(arrays.spi, np.minimum(others + 1, cap).astype(np.float64))
    spi_now = _iterations(arrays.spi, running.astype(np.float64))
    through = np.maximum(arrays.departures[running], pool.rate)
    stalled = np.minimum(0.95, through * lw.stall_mean * pool.discount)
    # mid-stall: the iteration under way holds a prefill, length-biased (a long one is more
    # likely under way), the request waits out a uniform share of it; idle (nothing running,
    # no wait): its own iteration starts at once
    prefills = arrays.prefills
    total = sum(lw.prefills)
    idle = ((running == 0) & (wait == 0))[:, None]
    p = np.concatenate([(1.0 - stalled)[:, None], stalled[:, None] * prefills / total], axis=1)
    p = np.where(idle, np.eye(1, len(prefills) + 1), p)
    width = np.concatenate([spi_now[:, None], prefills + spi_now[:, None]], axis=1)
    width = np.where(idle, 0.0, width)
    stall = (lw.stall_var + lw.stall_mean**2) / (2.0 * lw.stall_mean) + spi_now / 2.0
    residual = np.where(idle[:, 0], 0.0, (1.0 - stalled) * spi_now / 2.0 + stalled * stall)
    joiners = joined(residual, pool.rate, pool.engines)
    fixed = (wait + spi_join)[:, None] + prefills + (joiners * lw.stall_mean)[:, None]
    # the headroom x (per target, state, own prefill) against each width: a width it covers
    # counts whole (its p), another x / width of it
    x = np.stack([slo.ttft - fixed, slo.ttft * slo.relaxed_ttft - fixed])
    covered = (width[:, None, :] <= x[..., None]).astype(np.float64)
    per = np.where(width > 0, p / np.where(width > 0, width, 1.0), 0.0)
    whole = (covered @ p[:, :, None])[..., 0]
    part = ((1.0 - covered) @ per[:, :, None])[..., 0]
    got = np.where(x > 0, whole + x * part, 0.0).sum(axis=2) / len(lw.prefills)
    return got[0], got[1]


def _stalled(prefills: Floats, rate: float, engines: int) -> float:
    """The chance that the least loaded of ``engines`` is mid-prefill when a request comes:
    that it took an arrival within the last prefill's duration, which under join-the-least-
    loaded means the pool has had ``engines`` arrivals in that time."""
    pool = rate * engines
    below = _poisson_below(pool * prefills, engines)
    return sum((1.0 - below).tolist(), 0.0) / len(prefills)


@lru_cache(maxsize=1024)
def _array(xs: tuple[float, ...]) -> Floats:
    """A read-only array of these values (the law's, the curve's: cached with them)."""
    import numpy as np

    a = np.array(xs, dtype=np.float64)
    a.flags.writeable = False
    return a


# --- a pool ---------------------------------------------------------------------------------


def pool_result(
    curve: Curve,
    mix: Mix,
    slo: Slo,
    engines: int,
    rate: float,
    limit: int | None = None,
    mp: ModelParams = DEFAULT,
    peakedness: float = 1.0,
) -> PoolResult:
    """``engines`` alike engines offered ``rate`` requests per second (see the module's
    docstring); ``limit``: in flight on the least loaded one past which arrivals spill over;
    ``peakedness``: of the arrivals (1: Poisson; more: overflow, see ``overflow_peakedness``)."""
    import numpy as np

    if engines < 1:
        raise ValueError("a pool needs at least one engine")
    rate = max(rate, 1e-6)
    lw = law(curve, mix)
    cap = curve.limit
    k = engines
    mu = lw.departures
    if limit is not None:
        top = k * min(limit, cap)
    else:
        queue = math.ceil(mp.queue_ttfts * slo.ttft * slo.relaxed_ttft * mu[cap])
        top = k * (cap + max(1, queue))
    arrays = _arrays(curve, mix)
    pi = _birth_death(rate, arrays.departures, k, top, peakedness)
    blocked = float(pi[top]) if len(pi) > top else 0.0
    per_engine = rate * (1.0 - blocked) / k
    n = np.arange(len(pi))
    load = np.minimum(n / k, cap)
    mean = float((pi * load).sum())
    var = float((pi * (load - mean) ** 2).sum())
    b = min(cap - 1, max(1, round(mean)))
    slope = max(mu[b + 1] - mu[b], 1e-6) if cap > 1 else mu[1]
    one = _stalled(arrays.prefills, per_engine, 1)
    pool = _Pool(
        curve,
        arrays,
        lw,
        slo,
        k,
        min(cap, limit) if limit is not None else cap,
        per_engine,
        min(mp.max_stall, per_engine * lw.stall_mean),
        _stalled(arrays.prefills, per_engine, k) / one if one > 0 else 1.0,
        mean,
        var,
        1.0 / slope,
        peakedness,
    )
    # the chances at each state a request may find (per engine: n // k), all at once
    counted = (n < top) & (pi >= 1e-7)
    found = n[counted] // k
    others = np.unique(found)
    wait = np.where(others >= cap, (others - cap + 1) / mu[cap], 0.0)
    t_strict, t_relaxed = _tpot_ok(pool, others)
    f_strict, f_relaxed = _ttft_ok(pool, others, wait)
    at = np.searchsorted(others, found)
    p = pi[counted]
    strict = float((p * (t_strict * f_strict)[at]).sum())
    relaxed = float((p * (t_relaxed * f_relaxed)[at]).sum())
    return PoolResult(strict, relaxed, blocked, mean)


def _birth_death(rate: float, departures: Floats, k: int, top: int,
                 peakedness: float = 1.0) -> Floats:  # fmt: skip
    """The stationary distribution of the in-flight count on [0, top] (cut where negligible:
    past the mode, once 30 nats under it).

    Arrivals of peakedness ``z`` (Hayward's approximation: the pool behaves as ``k / z``
    engines offered ``rate / z``, its count scaled by ``z``) leave each step's log-ratio
    divided by ``z``: the same mean load, a wider spread. ``departures``: one engine's rate
    of finishing requests with b in flight (``Law.departures``)."""
    import numpy as np

    cap = len(departures) - 1
    q, r = np.divmod(np.arange(1, top + 1), k)
    out = (k - r) * departures[np.minimum(q, cap)] + r * departures[np.minimum(q + 1, cap)]
    logs = np.concatenate([[0.0], np.cumsum((math.log(rate) - np.log(out)) / peakedness)])
    best = np.maximum.accumulate(logs)
    past = np.flatnonzero((logs[1:] < best[1:] - 30.0) & (logs[1:] < logs[:-1]))
    if len(past):
        logs = logs[: past[0] + 2]  # (the rest is smaller still)
    weights = np.exp(logs - best[len(logs) - 1])
    pi: Floats = weights / weights.sum()
    return pi


# --- a split, on a grid of rates ------------------------------------------------------------

GRID_LOW = 1e-3  # requests per second at grid index 0


def grid_index(rate: float, step: float) -> float:
    """Where ``rate`` falls on the grid (a real number: between two points)."""
    return math.log(max(rate, GRID_LOW) / GRID_LOW) / math.log(step)


def grid_rate(index: int, step: float) -> float:
    return GRID_LOW * step**index


@lru_cache(maxsize=65536)
def _pool_at(
    curve: Curve, mix: Mix, slo: Slo, engines: int, index: int, limit: int | None,
    mp: ModelParams, peakedness: float = 1.0,
) -> PoolResult:  # fmt: skip
    return pool_result(curve, mix, slo, engines, GRID_LOW * mp.grid_step**index, limit, mp,
                       peakedness)  # fmt: skip


def pool_on_grid(
    curve: Curve,
    mix: Mix,
    slo: Slo,
    engines: int,
    rate: float,
    limit: int | None,
    mp: ModelParams,
    peakedness: float = 1.0,
) -> PoolResult:
    """``pool_result`` interpolated between the grid's rates around ``rate``."""
    x = grid_index(rate, mp.grid_step)
    i = int(math.floor(x))
    f = x - i
    lo = _pool_at(curve, mix, slo, engines, i, limit, mp, peakedness)
    if f < 1e-9:
        return lo
    hi = _pool_at(curve, mix, slo, engines, i + 1, limit, mp, peakedness)
    return PoolResult(*(a + f * (b - a) for a, b in zip(lo, hi, strict=True)))


def split_goodput(
    spec: Curve,
    base: Curve,
    mix: Mix,
    slo: Slo,
    k: int,
    m: int,
    rate: float,
    mp: ModelParams = DEFAULT,
) -> Goodput:
    """Expected shares meeting each tier with ``k`` speculative and ``m`` baseline engines up
    at ``rate`` requests per second (nothing up: none); interpolated between the rate grid's
    points around ``rate``."""
    if k < 0 or m < 0:
        raise ValueError("engine counts must be >= 0")
    if k + m == 0:
        return Goodput(0.0, 0.0)
    x = grid_index(rate, mp.grid_step)
    i = int(math.floor(x))
    f = x - i
    lo = _split_at(spec, base, mix, slo, k, m, i, mp)
    if f < 1e-9:
        return lo
    hi = _split_at(spec, base, mix, slo, k, m, i + 1, mp)
    return Goodput(lo[0] + f * (hi[0] - lo[0]), lo[1] + f * (hi[1] - lo[1]))


@lru_cache(maxsize=65536)
def _split_at(spec: Curve, base: Curve, mix: Mix, slo: Slo, k: int, m: int, index: int,
              mp: ModelParams) -> Goodput:  # fmt: skip
    if m == 0:
        s = _pool_at(spec, mix, slo, k, index, None, mp)
        return Goodput(s.strict, s.relaxed)
    if k == 0:
        b = _pool_at(base, mix, slo, m, index, None, mp)
        return Goodput(b.strict, b.relaxed)
    if mp.router == "spillover":
        return _spill_at(spec, base, mix, slo, k, m, index, spill_threshold(spec, base, mix, slo),
                         mp)  # fmt: skip
    return best_spill(spec, base, mix, slo, k, m, index, mp)[1]


def best_spill(spec: Curve, base: Curve, mix: Mix, slo: Slo, k: int, m: int, index: int,
               mp: ModelParams) -> tuple[int, Goodput]:  # fmt: skip
    """The slo policy (the router's default) as the spill threshold with the best objective
    (``mp.strict_weight``) for this split at the grid's ``index``-th rate, and its goodput.

    The slo policy fills the speculative engines while they keep the strict SLO, then spreads
    by each engine's fill against its relaxed capacity, and under sustained overload sends the
    excess to one pool: per load, it ends up near the spillover that suits that load. The
    search starts at the crossover (``spill_threshold``) and moves by single steps, up then
    down, while the objective improves, from 1 up to the batch at which a speculative engine
    misses the relaxed TPOT on average (``slow_batch``; past it the speculative engines only
    add misses). It judges the baseline pool fed the overflow as fed Poisson arrivals (one
    cached pool per rate, shared by every threshold and split); the threshold found and the
    crossover are then valued with the overflow's peakedness, and the better kept (so it never
    does worse than spillover at the crossover)."""
    top = max(1, min(spec.limit, slow_batch(spec, mix, slo.tpot * slo.relaxed_tpot, mp)))
    cross = spill_threshold(spec, base, mix, slo)
    tried: dict[int, float] = {}

    def value(t: int) -> float:
        if t not in tried:
            g = _spill_at(spec, base, mix, slo, k, m, index, t, mp, bursts=False)
            tried[t] = g.value(mp.strict_weight)
        return tried[t]

    best = min(cross, top)
    for step in (1, -1):
        t = best + step
        while 1 <= t <= top and value(t) > value(best):
            best = t
            t += step
    at_cross = _spill_at(spec, base, mix, slo, k, m, index, cross, mp)
    if best == cross:
        return cross, at_cross
    found = _spill_at(spec, base, mix, slo, k, m, index, best, mp)
    w = mp.strict_weight
    return (best, found) if found.value(w) > at_cross.value(w) else (cross, at_cross)


def _spill_at(spec: Curve, base: Curve, mix: Mix, slo: Slo, k: int, m: int, index: int,
              theta: int, mp: ModelParams, bursts: bool = True) -> Goodput:  # fmt: skip
    """Spillover at ``theta`` (see the module's docstring) with both pools up; ``bursts``:
    the overflow's peakedness counted (else the baseline pool as fed Poisson arrivals, on the
    grid)."""
    rate = GRID_LOW * mp.grid_step**index
    s = _pool_at(spec, mix, slo, k, index, theta, mp)
    over = rate * s.blocked
    if over <= GRID_LOW:
        return Goodput(s.strict, s.relaxed)
    if bursts:
        z = overflow_peakedness(law(spec, mix).departures[theta] / theta, k * theta, rate,
                                s.blocked)  # fmt: skip
        b = pool_result(base, mix, slo, m, over, None, mp, z)  # (this split point is cached)
    else:
        b = pool_on_grid(base, mix, slo, m, over, None, mp)
    return Goodput(s.strict + s.blocked * b.strict, s.relaxed + s.blocked * b.relaxed)


def overflow_peakedness(slot_rate: float, slots: int, rate: float, blocked: float) -> float:
    """The peakedness of what overflows a pool of ``slots`` (each freed at ``slot_rate`` when
    busy) offered Poisson ``rate``, of which ``blocked`` overflows (Riordan's formula for an
    Erlang loss system: ``Z = 1 - M + A / (N + 1 + M - A)``): overflow comes in bursts, when
    the speculative engines are all full, and a baseline engine fed it queues more than the
    same mean rate of Poisson arrivals would make it (held within 1..8)."""
    offered = rate / max(slot_rate, 1e-9)
    overflow = offered * blocked
    room = slots + 1 + overflow - offered
    if room <= 0:
        return 8.0
    return min(8.0, max(1.0, 1.0 - overflow + offered / room))


# The grid index each split's last capacity was found at, per share: where the next search
# (other curves or mix, after learning moved them) starts. A hint, not a result: the search
# from it ends where the full bisection would.
_CAPACITY_AT: dict[tuple[int, int, float, float], int] = {}


@lru_cache(maxsize=4096)
def slo_capacity(
    spec: Curve,
    base: Curve,
    mix: Mix,
    slo: Slo,
    k: int,
    m: int,
    share: float,
    mp: ModelParams = DEFAULT,
) -> float:
    """The highest rate (requests per second, to the grid's step) at which the split's expected
    relaxed goodput is still at least ``share`` (goodput falls with the rate); 0 if never.

    A bisection over the grid, bracketed by galloping out from where this split's capacity
    was found last (``_CAPACITY_AT``): a few grid points near it instead of nine across the
    whole grid, most of them at rates no plan asks about (each a search for the best spill
    threshold when the split is mixed)."""
    if k + m == 0:
        return 0.0

    def ok(i: int) -> bool:
        rate = GRID_LOW * mp.grid_step**i
        return split_goodput(spec, base, mix, slo, k, m, rate, mp).relaxed >= share

    top = int(grid_index(1e4, mp.grid_step))
    key = (k, m, share, mp.grid_step)
    hint = _CAPACITY_AT.get(key)
    if hint is None or not 0 < hint < top:
        if not ok(0):
            return 0.0
        lo, hi = 0, top
    elif ok(hint):  # ok(lo), not ok(hi)
        lo, step = hint, 1
        while lo + step < top and ok(lo + step):
            lo += step
            step *= 2
        hi = min(lo + step, top)
    else:
        hi, step = hint, 1
        while hi - step > 0 and not ok(hi - step):
            hi -= step
            step *= 2
        lo = max(0, hi - step)
        if lo == 0 and not ok(0):
            return 0.0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    _CAPACITY_AT[key] = lo
    return GRID_LOW * mp.grid_step**lo
