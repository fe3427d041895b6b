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
of rates and interpolated, so a planner can ask for many rates cheaply.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal, NamedTuple

from router.plan.values import Curve, Mix, Slo

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


def _poisson_terms(mean: float, top: int) -> list[float]:
    """P(X = i) for i in 0..top, X ~ Poisson(mean) (0 where it underflows)."""
    term = math.exp(-mean)
    out = [term]
    for i in range(1, top + 1):
        term *= mean / i
        out.append(term)
    return out


def _poisson_below(mean: float, k: int) -> float:
    """P(X < k), X ~ Poisson(mean)."""
    if mean > 700.0:  # exp(-mean) underflows: from logs
        return _poisson_window(mean, 0, k - 1)[1]
    return sum(_poisson_terms(mean, k - 1))


def _poisson_window(mean: float, lo: int, hi: int) -> tuple[list[float], float]:
    """P(X = i) for i in lo..hi, X ~ Poisson(mean), from logs (no underflow at the mean), and
    their sum."""
    log_mean = math.log(mean)
    terms = [math.exp(-mean + i * log_mean - math.lgamma(i + 1.0)) for i in range(lo, hi + 1)]
    return terms, sum(terms)


def _lognormal_cdf(h: float, mean: float, sd: float) -> float:
    """P(X <= h), X lognormal with this mean and standard deviation."""
    if h <= 0:
        return 0.0
    if sd <= 1e-12 * mean:
        return 1.0 if h >= mean else 0.0
    s2 = math.log1p((sd / mean) ** 2)
    return phi((math.log(h) - math.log(mean) + s2 / 2.0) / math.sqrt(s2))  # h / mean: underflow


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
    ``1 / (1 - stall share)^2``; and bursty arrivals (an overflow) by their peakedness."""
    if h < 0:
        return 0.0
    if count < 1e-9 or mean <= 0:
        return 1.0
    k = engines
    pool = k * count
    none = _poisson_below(pool, k) if pool < 700 else 0.0
    more = 1.0 - none
    if more < 1e-12:
        return 1.0
    total = count * mean
    second = count * (var + mean * mean) * spread + total * total
    m1 = max(total / more, mean)
    sd = math.sqrt(max(0.0, second / more - m1 * m1))
    return min(1.0, none + more * _lognormal_cdf(h, m1, sd))


def joined_within(window: float, rate: float, engines: int) -> float:
    """Expected arrivals an engine of ``engines`` takes within ``window`` after taking one
    (see ``stall_cdf``): the sum over j of P(the pool has >= j * engines arrivals), which is
    ``E[N // engines] = (E[N] - E[N mod engines]) / engines`` for the pool's count ``N``.

    In bounded steps for any rate: ``N mod engines`` is summed over the count's likely values
    only (eight standard deviations either side), and where the count is spread over many
    multiples of ``engines`` it is uniform (its periodic part falls as
    ``exp(-2 pi^2 mean / engines^2)``)."""
    pool = rate * engines * window
    if not pool > 0:
        return 0.0
    k = max(1, engines)
    if k == 1 or not math.isfinite(pool):
        return pool / k
    if pool > 4.0 * k * k + 400.0:
        return (pool - (k - 1) / 2.0) / k
    sd = math.sqrt(pool)
    lo = max(0, math.floor(pool - 8.0 * sd))
    hi = math.ceil(pool + 8.0 * sd) + k
    terms, total = _poisson_window(pool, lo, hi)
    remainder = sum(p * ((lo + i) % k) for i, p in enumerate(terms)) / total
    return max(0.0, (pool - remainder) / k)


def _uniform_cdf(x: float, width: float) -> float:
    if x <= 0:
        return 0.0
    if width <= 0 or x >= width:
        return 1.0
    return x / width


class _Pool(NamedTuple):
    """What the chances at each state share: the pool's rate and spread."""

    curve: Curve
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


def _tpot_ok(pool: _Pool, others: int) -> tuple[float, float]:
    curve, lw, slo = pool.curve, pool.lw, pool.slo
    cap = pool.limit
    start = float(min(others, cap - 1) + 1)
    # Its company: the others in flight (the mean, as Poisson arrivals see it), fewer as the
    # engine fills towards its limit, where all but this one's slot are someone else's; and the
    # requests joining while it decodes arrive as fast as that company turns over.
    company = 1.0 - pool.mean / (cap * cap)
    centre = min(float(cap), 1.0 + pool.mean * company)
    spi_centre = curve.iteration(centre)
    stretch = 1.0 / (1.0 - pool.stall_share)
    spread = (1.0 + (pool.peakedness - 1.0) / pool.engines) * stretch * stretch  # see stall_cdf
    strict = relaxed = 0.0
    t_strict, t_relaxed = slo.tpot, slo.tpot * slo.relaxed_tpot
    for tokens, iters, weight in lw.decodes:
        if tokens <= 0:
            strict += weight
            relaxed += weight
            continue
        life = iters * spi_centre * stretch
        x = life / pool.relax
        if x < 1e-6:
            w, v = 1.0, 1.0
        else:
            e = math.exp(-x)
            w = (1.0 - e) / x
            v = (2.0 / x) * (1.0 - (1.0 - e) / x)
        mid = centre + (start - centre) * w
        sd = math.sqrt(pool.var * max(0.0, v - w * w))
        points: tuple[tuple[float, float], ...] = ((mid, 1.0),)
        if sd >= 1e-3:  # three-point Gauss-Hermite over the batch's spread
            points = ((mid, 2 / 3), (mid - SQRT3 * sd, 1 / 6), (mid + SQRT3 * sd, 1 / 6))
        for b, q in points:
            b = min(float(cap), max(1.0, b))
            t0 = iters * curve.iteration(b)
            count = pool.rate * t0 * stretch * company
            strict += weight * q * stall_cdf(t_strict * tokens - t0, count, lw.stall_mean,
                                             lw.stall_var, pool.engines, spread)  # fmt: skip
            relaxed += weight * q * stall_cdf(t_relaxed * tokens - t0, count, lw.stall_mean,
                                              lw.stall_var, pool.engines, spread)  # fmt: skip
    return strict, relaxed


def _ttft_ok(pool: _Pool, others: int, wait: float) -> tuple[float, float]:
    curve, lw, slo = pool.curve, pool.lw, pool.slo
    cap = curve.limit
    running = min(others, cap)
    spi_join = curve.iteration(min(others + 1, cap))
    if running == 0 and wait == 0:
        widths: tuple[tuple[float, float], ...] = ((1.0, 0.0),)
        residual = 0.0
    else:
        spi_now = curve.iteration(running)
        through = max(lw.departures[running], pool.rate)
        stalled = min(0.95, through * lw.stall_mean * pool.discount)
        # mid-stall: the iteration under way holds a prefill, length-biased (a long one is
        # more likely under way), the request waits out a uniform share of it
        total = sum(lw.prefills)
        widths = ((1.0 - stalled, spi_now),) + tuple(
            (stalled * x / total, x + spi_now) for x in lw.prefills
        )
        stall = (lw.stall_var + lw.stall_mean**2) / (2.0 * lw.stall_mean) + spi_now / 2.0
        residual = (1.0 - stalled) * spi_now / 2.0 + stalled * stall
    joiners = joined_within(residual, pool.rate, pool.engines) * lw.stall_mean
    strict = relaxed = 0.0
    t_strict, t_relaxed = slo.ttft, slo.ttft * slo.relaxed_ttft
    for s in lw.prefills:
        fixed = wait + spi_join + s + joiners
        for p, width in widths:
            strict += p * _uniform_cdf(t_strict - fixed, width)
            relaxed += p * _uniform_cdf(t_relaxed - fixed, width)
    n = len(lw.prefills)
    return strict / n, relaxed / n


def _stalled(lw: Law, rate: float, engines: int) -> float:
    """The chance that the least loaded of ``engines`` is mid-prefill when a request comes:
    that it took an arrival within the last prefill's duration, which under join-the-least-
    loaded means the pool has had ``engines`` arrivals in that time."""
    pool = rate * engines
    total = 0.0
    for s in lw.prefills:
        total += 1.0 - _poisson_below(pool * s, engines)
    return total / len(lw.prefills)


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
    pi = _birth_death(rate, mu, k, top, peakedness)
    blocked = pi[top] if len(pi) > top else 0.0
    per_engine = rate * (1.0 - blocked) / k
    mean = sum(p * min(n / k, cap) for n, p in enumerate(pi))
    var = sum(p * (min(n / k, cap) - mean) ** 2 for n, p in enumerate(pi))
    b = min(cap - 1, max(1, round(mean)))
    slope = max(mu[b + 1] - mu[b], 1e-6) if cap > 1 else mu[1]
    one = _stalled(lw, per_engine, 1)
    pool = _Pool(
        curve,
        lw,
        slo,
        k,
        min(cap, limit) if limit is not None else cap,
        per_engine,
        min(mp.max_stall, per_engine * lw.stall_mean),
        _stalled(lw, per_engine, k) / one if one > 0 else 1.0,
        mean,
        var,
        1.0 / slope,
        peakedness,
    )
    strict = relaxed = 0.0
    cache: dict[int, tuple[float, float]] = {}
    for n, p in enumerate(pi):
        if n >= top or p < 1e-7:
            continue
        c = n // k
        got = cache.get(c)
        if got is None:
            t_strict, t_relaxed = _tpot_ok(pool, c)
            wait = (c - cap + 1) / mu[cap] if c >= cap else 0.0
            f_strict, f_relaxed = _ttft_ok(pool, c, wait)
            got = (t_strict * f_strict, t_relaxed * f_relaxed)
            cache[c] = got
        strict += p * got[0]
        relaxed += p * got[1]
    return PoolResult(strict, relaxed, blocked, mean)


def _birth_death(rate: float, mu: tuple[float, ...], k: int, top: int,
                 peakedness: float = 1.0) -> list[float]:  # fmt: skip
    """The stationary distribution of the in-flight count on [0, top] (cut where negligible).

    Arrivals of peakedness ``z`` (Hayward's approximation: the pool behaves as ``k / z``
    engines offered ``rate / z``, its count scaled by ``z``) leave each step's log-ratio
    divided by ``z``: the same mean load, a wider spread."""
    cap = len(mu) - 1
    log_rate = math.log(rate)
    logs = [0.0]
    best = 0.0
    for n in range(1, top + 1):
        q, r = divmod(n, k)
        a, b = min(q, cap), min(q + 1, cap)
        departures = (k - r) * mu[a] + r * mu[b]
        x = logs[-1] + (log_rate - math.log(departures)) / peakedness
        logs.append(x)
        best = max(best, x)
        if x < best - 30.0 and x < logs[-2]:
            break  # past the mode and negligible: the rest is smaller still
    weights = [math.exp(x - best) for x in logs]
    total = sum(weights)
    return [x / total for x in weights]


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
