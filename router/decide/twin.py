"""A backend's near future, simulated: what one more request does to it, and it to them.

The ``slo`` policy asks, for each backend: if this request went there, how many of the requests
there now, this one, and the ones that keep arriving while it runs would meet their SLO, against
how many would if it went elsewhere? This module answers with a small deterministic simulation
of the engine's continuous-batching loop (the loop ``router.sim.model`` describes, and SGLang and
vLLM servers run), over what the router knows:

- the requests in flight there (``Flight``): how long ago each was sent, whether and when its
  first token came, its prompt and expected output length, its class and SLO;
- the engine's model (``router.decide.predict.PoolModel``): seconds per iteration at each batch
  size, tokens per iteration by class, the prefill line, the running cap;
- the traffic that keeps arriving there (``Stream``): its rate, mean lengths and SLO, as evenly
  spaced requests of the mean size.

Time advances in whole iterations. A joining request stalls its iteration for its prefill and
gets its first token at the iteration's end; after that every running request gains its class's
tokens per iteration, so between events (a join, a finish, an arrival) every iteration of a batch
costs the same and the simulation jumps to the next event: O(n log n) for n requests.

Pure arithmetic over plain values, in the engines' *model* seconds (``PoolModel.scale`` turns
wall seconds into them and back).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

from router.decide.predict import PoolModel

# The relaxed tier: a request that misses its SLO but stays within these multiples of it still
# counts (the traffic benchmark's relaxed goodput: TTFT 1 s -> 3 s, TPOT 25 ms -> 50 ms).
RELAXED_TTFT, RELAXED_TPOT = 3.0, 2.0
# How soft ``meets`` is: the spread of real latency around the prediction, as a share of the
# target (what the simulation cannot know: the arrivals' real times and sizes, acceptance draws).
MEETS_WIDTH = 0.1
# When the stream's first request arrives, as a share of the gap between its requests.
STREAM_PHASE = 0.5
# How the stream's prefills stall the others: "poisson" (the chance a request's headroom
# absorbs the stalls of a Poisson stream of mean-size prefills over its remaining life) or
# "lumps" (each evenly spaced arrival stalls its join iteration).
STALLS = "poisson"
# Past this many requests decoding on a backend, alike ones are simulated as groups (each
# standing for its members: same class and SLO, neighbours in the iterations they have left),
# which keeps a decision's cost flat however many are in flight.
COHORTS = 24
# Past about this many of the stream's arrivals during a request's life, they are simulated as
# arriving in groups (the same rate), which bounds a decision's cost at high request rates.
STREAM_EVENTS = 16
# Past this share of the time spent on the stream's prefills, a predicted TPOT stops growing
# with them (the engine is then past what it can serve; the request's chances say so anyway).
MAX_STALL_SHARE = 0.9
# A backstop on the work one simulation does (a runaway queue): past it, the rest is not scored.
MAX_EVENTS = 20_000


class Flight(NamedTuple):
    """A request in flight on the backend, as the router knows it (model seconds)."""

    prompt: float  # prompt tokens
    output: float  # output tokens it is expected to generate
    sampling: bool  # temperature > 0
    age: float  # since it was sent
    decoding: float | None  # since its first token; None: no token yet
    slo_ttft: float
    slo_tpot: float


class Stream(NamedTuple):
    """The requests expected to keep arriving at the backend (model seconds)."""

    rate: float  # per second
    prompt: float  # mean prompt tokens
    output: float  # mean output tokens
    sampling: float  # share at temperature > 0
    slo_ttft: float
    slo_tpot: float


class Predicted(NamedTuple):
    """What ``simulate`` predicts for the requests at a backend (and one added there)."""

    strict: float  # requests expected to meet their SLO, of all simulated
    relaxed: float  # ... to meet the relaxed tier
    ttft: float  # the added request's (model seconds; 0 without one)
    tpot: float  # (under "poisson" stalls, with their expected share of its decode)
    end: float  # when the added request finishes (model seconds from now; NaN without one)
    batch: int  # the largest batch the simulation ran
    own: tuple[float, float] = (0.0, 0.0)  # the added request's chance to meet each tier
    # the time per output token over its SLO's of every request there now (not the stream's
    # forecast ones: which backend those go to is not yet decided), summed: how slow they are
    slowness: float = 0.0


def meets(value: float, target: float) -> float:
    """A soft ``value <= target``: 1 well below, 0 well above, linear within ``MEETS_WIDTH``."""
    lo, hi = target * (1 - MEETS_WIDTH), target * (1 + MEETS_WIDTH)
    if value <= lo:
        return 1.0
    if value >= hi:
        return 0.0
    return (hi - value) / (hi - lo)


def attainment(ttft: float, tpot: float, slo_ttft: float, slo_tpot: float) -> tuple[float, float]:
    """(strict, relaxed): how surely a request with this TTFT and TPOT meets each tier."""
    strict = meets(ttft, slo_ttft) * meets(tpot, slo_tpot)
    relaxed = meets(ttft, slo_ttft * RELAXED_TTFT) * meets(tpot, slo_tpot * RELAXED_TPOT)
    return strict, relaxed


def poisson_cdf(k: float, mean: float) -> float:
    """P(N <= k) for N ~ Poisson(mean), linear between whole k (smooth in the headroom)."""
    if k < 0:
        return 0.0
    if k > mean + 8.0 * math.sqrt(mean) + 8.0:
        return 1.0  # (the rest of the tail is below 1e-9)
    whole = int(k)
    term = total = math.exp(-mean)
    for i in range(1, whole + 2):
        if i == whole + 1:
            return total + (k - whole) * term * mean / i
        term *= mean / i
        total += term
    return total  # (not reached)


def within(spent: float, tokens: float, target: float, exposure: float, stall: float) -> float:
    """The chance that a request whose decode took ``spent`` seconds for ``tokens`` tokens (and
    ``exposure`` more seconds of it are still to come, open to a stream of ``stall``-second
    prefills arriving ``exposure`` times on average) stays within ``target`` per token."""
    headroom = target * max(1.0, tokens - 1) - spent
    if headroom < 0:
        return meets(spent / max(1.0, tokens - 1), target)
    if exposure <= 0 or stall <= 0:
        return 1.0
    return poisson_cdf(headroom / stall, exposure)


class _Req:
    __slots__ = ("prompt", "output", "tau", "arrived", "first", "slo_ttft", "slo_tpot", "done",
                 "future", "weight")  # fmt: skip

    def __init__(self, prompt: float, output: float, tau: float, slo_ttft: float,
                 slo_tpot: float, arrived: float, done: float = 0.0) -> None:  # fmt: skip
        self.prompt = prompt
        self.output = max(1.0, output)
        self.tau = tau
        self.arrived = arrived  # simulation time (negative: before it began)
        self.first = math.nan  # time of its first token
        self.slo_ttft = slo_ttft
        self.slo_tpot = slo_tpot
        self.done = done  # prefill already under way when the simulation began (seconds)
        self.future = False  # one of the stream's
        self.weight = 1  # how many alike requests it stands for (see ``COHORTS``)


def _decoding(
    model: PoolModel, flights: Sequence[Flight], stretch: float
) -> list[tuple[float, _Req]]:
    """The requests decoding now, with the iterations each has left; past ``COHORTS`` of them,
    merged into that many groups of requests alike (same class and SLO, neighbours in what is
    left), each standing for its members. (Shared by the simulations of one placement: none of
    them changes these.)"""
    cap = model.cap if model.cap is not None else math.inf
    spi_now = model.iteration(int(min(max(1, len(flights)), cap))) * stretch
    rows = []
    for f in flights:
        since = f.decoding or 0.0
        tau = model.tau(f.sampling)
        left = max(0.5, (max(1.0, f.output) - 1) / tau - since / spi_now)
        rows.append((tau, f.slo_ttft, f.slo_tpot, left, f.prompt, f.output, -f.age, -since))
    if len(rows) > COHORTS:
        rows.sort()
        size = math.ceil(len(rows) / COHORTS)
    else:
        size = 1
    out: list[tuple[float, _Req]] = []
    i = 0
    while i < len(rows):
        j = i + 1
        while j < len(rows) and j - i < size and rows[j][:3] == rows[i][:3]:
            j += 1
        group = rows[i:j]
        n = len(group)
        tau, slo_ttft, slo_tpot = group[0][:3]
        r = _Req(sum(g[4] for g in group) / n, sum(g[5] for g in group) / n, tau, slo_ttft,
                 slo_tpot, sum(g[6] for g in group) / n)  # fmt: skip
        r.first = sum(g[7] for g in group) / n
        r.weight = n
        out.append((sum(g[3] for g in group) / n, r))
        i = j
    return out


def simulate(
    model: PoolModel,
    flights: Sequence[Flight],
    stream: Stream | None = None,
    extra: Flight | None = None,
    horizon: float | None = None,
    stretch: float = 1.0,
    decoding: list[tuple[float, _Req]] | None = None,
    group: int = 1,
) -> Predicted:
    """Run the backend forward from now until every request has finished: those in flight,
    ``extra`` (sent now), and the ``stream``'s arrivals until ``horizon`` (by default, until
    ``extra`` finishes; none without either).

    ``stretch``: how much longer than the model's decode iterations the recent ones took
    (prefill stalls), used only to guess how far the running requests have got.
    ``decoding``: those of ``flights`` decoding, as ``_decoding`` prepares them (if done).
    ``group``: the stream's requests arrive this many at a time (at the same mean rate)."""
    cap = model.cap if model.cap is not None else math.inf
    iteration, prefill_of = model.iteration, model.prefill
    if decoding is None:
        decoding = _decoding(model, [f for f in flights if f.decoding is not None], stretch)
    running: list[tuple[float, int, _Req]] = [(left, i, r) for i, (left, r) in enumerate(decoding)]
    heapq.heapify(running)
    batch = sum(r.weight for _, _, r in running)  # requests running (cohorts count theirs)
    order = len(running)  # tie-break in the heap
    waiting: deque[_Req] = deque()
    # Those with no first token yet, oldest first. The engine prefills one after another (a
    # join iteration costs its joiners' prefills summed), so since the oldest came it has done
    # at most that long of their prefill work, in order: a burst of requests that just came has
    # nearly all of its prefills still ahead, not each one's age of it.
    queued = sorted((f for f in flights if f.decoding is None), key=lambda f: -f.age)
    budget = queued[0].age if queued else 0.0
    for f in queued:
        done = min(prefill_of(f.prompt), budget)
        budget -= done
        waiting.append(_Req(f.prompt, f.output, model.tau(f.sampling), f.slo_ttft, f.slo_tpot,
                            -f.age, done))  # fmt: skip
    added: _Req | None = None
    if extra is not None:
        added = _Req(extra.prompt, extra.output, model.tau(extra.sampling), extra.slo_ttft,
                     extra.slo_tpot, 0.0)  # fmt: skip
        waiting.append(added)
    # the stream's arrivals: evenly spaced, the first STREAM_PHASE of a gap from now
    gap = math.inf
    stream_tau = 1.0
    if stream is not None and stream.rate > 0:
        gap = group / stream.rate
        sh = stream.sampling
        stream_tau = 1.0 / (sh / model.tau(True) + (1 - sh) / model.tau(False))
    next_arrival = gap * STREAM_PHASE
    limit = horizon if horizon is not None else (math.inf if added is not None else 0.0)
    poisson = STALLS == "poisson" and gap < math.inf
    stall = prefill_of(stream.prompt) if poisson and stream is not None else 0.0
    rate = group / gap if poisson else 0.0

    def score(r: _Req, at: float) -> tuple[float, float]:
        ttft = r.first - r.arrived
        if not poisson:
            tpot = (at - r.first) / (r.output - 1) if r.output > 1 else 0.0
            return attainment(ttft, tpot, r.slo_ttft, r.slo_tpot)
        if r.future:
            ttft += prefill_of(r.prompt)
        spent, exposure = at - r.first, rate * (at - max(0.0, r.first))
        strict = meets(ttft, r.slo_ttft)
        if strict:
            strict *= within(spent, r.output, r.slo_tpot, exposure, stall)
        relaxed = meets(ttft, r.slo_ttft * RELAXED_TTFT)
        if relaxed:
            relaxed *= within(spent, r.output, r.slo_tpot * RELAXED_TPOT, exposure, stall)
        return strict, relaxed

    strict = relaxed = slowness = 0.0
    t = it = 0.0
    end = math.nan
    tpot = 0.0
    own = (0.0, 0.0)
    biggest = batch
    events = 0
    while events < MAX_EVENTS:
        events += 1
        if waiting and batch < cap:
            joiners: list[_Req] = []
            while waiting and batch < cap:
                r = waiting.popleft()
                joiners.append(r)
                batch += r.weight
            biggest = max(biggest, batch)
            dt = iteration(batch)
            for r in joiners:
                if not r.future or not poisson:
                    dt += max(0.0, prefill_of(r.prompt) - r.done) * r.weight
            t += dt
            it += 1
            for r in joiners:
                r.first = t
                if r.output > 1:
                    order += 1
                    heapq.heappush(running, (it + (r.output - 1) / r.tau, order, r))
                    continue
                batch -= r.weight
                a, b = score(r, t)
                strict, relaxed = strict + a * r.weight, relaxed + b * r.weight
                if r is added:
                    end = limit = min(limit, t)
                    own = (a, b)
        elif running:
            spi = iteration(batch)
            k = max(1.0, math.ceil(running[0][0] - it - 1e-9))
            if next_arrival < limit:
                k = min(k, max(1.0, math.ceil((next_arrival - t) / spi)))
            t += k * spi
            it += k
            while running and running[0][0] <= it + 1e-9:
                r = heapq.heappop(running)[2]
                batch -= r.weight
                a, b = score(r, t)
                strict, relaxed = strict + a * r.weight, relaxed + b * r.weight
                if not r.future:
                    slowness += (t - r.first) / (r.output - 1) / r.slo_tpot * r.weight
                if r is added:
                    end = limit = min(limit, t)
                    tpot = (t - r.first) / (r.output - 1)
                    if poisson:  # what it should expect: with the stream's stalls (on average)
                        tpot /= 1.0 - min(MAX_STALL_SHARE, rate * stall)
                    own = (a, b)
        elif next_arrival < limit:
            t = max(t, next_arrival)
        else:
            break
        while next_arrival <= t and next_arrival < limit:
            assert stream is not None
            r = _Req(
                stream.prompt,
                stream.output,
                stream_tau,
                stream.slo_ttft,
                stream.slo_tpot,
                next_arrival,
            )
            r.future = True
            r.weight = group  # (so many: as if they came together, one standing for the rest)
            waiting.append(r)
            next_arrival += gap
    ttft = added.first if added is not None and not math.isnan(added.first) else 0.0
    return Predicted(strict, relaxed, ttft, tpot, end, biggest, own, slowness)


class Held(NamedTuple):
    """What an engine serves within the relaxed SLO at most (see ``slo_capacity``)."""

    rate: float  # requests per second
    running: int  # the batch it runs them in


def slo_capacity(model: PoolModel, stream: Stream) -> Held:
    """The most requests per second of ``stream``'s mean size one engine serves in its steady
    state with their time per output token within the relaxed target: at each batch size
    ``n``, the rate that keeps ``n`` running (Little: ``n`` over a request's life) with the
    decode stretched by the prefills that rate brings; the best ``n`` that meets it."""
    target = stream.slo_tpot * RELAXED_TPOT
    sh = stream.sampling
    tau = 1.0 / (sh / model.tau(True) + (1 - sh) / model.tau(False))
    prefill = model.prefill(stream.prompt)
    output = max(1.0, stream.output)
    top = model.cap if model.cap is not None else max(1, model.measured)
    best = Held(0.0, 0)
    for n in range(1, top + 1):
        decode = model.iteration(n) / tau  # per token, without stalls
        rate = n / (prefill + output * decode)
        for _ in range(4):  # the stalls stretch the life, which lowers the rate: a fixed point
            stretched = decode / (1.0 - min(MAX_STALL_SHARE, rate * prefill))
            rate = n / (prefill + output * stretched)
        if decode / (1.0 - min(MAX_STALL_SHARE, rate * prefill)) > target:
            break
        if rate > best.rate:
            best = Held(rate, n)
    return best


class Placement(NamedTuple):
    """What sending one request to a backend is expected to do (see ``place``)."""

    strict: float  # requests meeting their SLO there, with it less without it (itself included)
    relaxed: float  # ... the relaxed tier
    own: tuple[float, float]  # its own chance to meet (strict, relaxed)
    ttft: float  # its predicted TTFT and TPOT (model seconds)
    tpot: float
    batch: int  # the largest batch the simulation with it ran
    # what it adds to the time per output token (over their SLOs') of the requests there now,
    # its own included (``Predicted.slowness``)
    slowness: float = 0.0


def place(
    model: PoolModel,
    flights: Sequence[Flight],
    stream: Stream | None,
    request: Flight,
    stretch: float = 1.0,
) -> Placement:
    """The backend's future with ``request`` sent now against without it, over the same
    arrivals (until ``request`` would finish)."""
    decoding = _decoding(model, [f for f in flights if f.decoding is not None], stretch)
    group = 1
    if stream is not None and stream.rate > 0:
        # about how long the request will live: past STREAM_EVENTS arrivals in that time,
        # they come in groups
        life = model.prefill(request.prompt) + max(1.0, request.output) / model.tau(
            request.sampling) * model.iteration(len(flights) + 1)  # fmt: skip
        group = max(1, math.floor(stream.rate * life / STREAM_EVENTS))
    with_it = simulate(model, flights, stream, request, decoding=decoding, group=group)
    horizon = with_it.end if not math.isnan(with_it.end) else None
    without = simulate(model, flights, stream, None, horizon=horizon or 0.0, decoding=decoding,
                       group=group)  # fmt: skip
    own = with_it.own
    return Placement(
        with_it.strict - without.strict,
        with_it.relaxed - without.relaxed,
        own,
        with_it.ttft,
        with_it.tpot,
        with_it.batch,
        with_it.slowness - without.slowness,
    )
