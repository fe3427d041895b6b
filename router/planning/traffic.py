"""The traffic over a planning interval, from the engines' own counters. Pure.

Every router replica in front of the same engines reads the same ``/metrics``, so a rate taken
from them is one every replica agrees on (each replica's own count is its share of the
traffic). Engines count a request when it *ends* (SGLang's ``num_requests_total``, vLLM's
``request_success_total``), so the arrivals over an interval are what ended plus what the
engines' backlog (running + queued) grew by: a load that outruns the engines shows as arrivals,
not as the rate they manage to finish. Prompt and output tokens per request over the interval
come from their token counters.

A counter that went back means its engine restarted: it counts from zero. An engine first seen
by the watch counts from its first reading, unless it was seen loading first (it started
since: from zero). An engine with no request counter (llama.cpp) makes the interval's count
the router's own (``Traffic.source``): the requests this replica sent (its share only, when
several replicas front the engines).

What the planner is given is not one interval's count but a ``Window``'s: the rate over the
latest intervals that hold enough arrivals for it to mean something (at a production load, the
interval itself), with a Poisson band for how few they were, and the token means over enough
requests that ended. One interval of a compressed day holds a handful of requests: its rate
swung by half from one plan to the next, and the means of its few lengths re-sized the mix,
so the planner saw a flat load move and switched on it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import NamedTuple


class Reading(NamedTuple):
    """One engine's counters at one scrape."""

    requests: float | None  # requests ended
    prompt: float | None  # prompt tokens taken in
    generated: float | None  # output tokens
    backlog: float  # running + queued


ZERO = Reading(0.0, 0.0, 0.0, 0.0)


@dataclass
class Tally:
    """What the counters moved by since the interval began."""

    arrivals: float = 0.0  # ended + backlog growth
    ended: float = 0.0
    prompt: float = 0.0
    generated: float = 0.0
    counted: bool = True  # every engine had a request counter throughout


class Traffic(NamedTuple):
    """One interval's traffic as the planner takes it."""

    seconds: float
    arrivals: int
    source: str  # "engines" or "router"
    prompt_mean: float | None  # tokens per request that ended, from the engines' counters
    output_mean: float | None


def moved(now: float | None, before: float | None) -> float | None:
    """A counter's increase (from zero if it went back: the engine restarted)."""
    if now is None or before is None:
        return None
    return now - before if now >= before else now


class CounterWatch:
    """Each engine's last reading, and the interval's tally of what the counters moved by."""

    def __init__(self) -> None:
        self.last: dict[str, Reading] = {}
        self.tally = Tally()

    def update(self, readings: Mapping[str, Reading], fresh: Container[str] = ()) -> None:
        """Fold in the engines' latest readings (an unchanged reading moves nothing).
        ``fresh``: engines seen loading before their first reading (they count from zero)."""
        t = self.tally
        for url, r in readings.items():
            prev = self.last.get(url)
            if prev is None:
                prev = ZERO if url in fresh else r
            ended = moved(r.requests, prev.requests)
            if ended is None:
                t.counted = False
            else:
                t.ended += ended
                t.arrivals += ended + r.backlog - prev.backlog
            t.prompt += moved(r.prompt, prev.prompt) or 0.0
            t.generated += moved(r.generated, prev.generated) or 0.0
        self.last = dict(readings)

    def take(self) -> Tally:
        """The interval's tally; the next interval starts from here."""
        t, self.tally = self.tally, Tally()
        return t


def traffic(tally: Tally, seconds: float, own_arrivals: float) -> Traffic:
    """The interval's traffic: the engines' count when every engine kept one, else the
    router's own (``own_arrivals``: the requests this replica sent to the engines)."""
    if tally.counted and (tally.ended > 0 or tally.arrivals > 0 or own_arrivals == 0):
        arrivals, source = tally.arrivals, "engines"
    else:
        arrivals, source = own_arrivals, "router"
    ended = tally.ended
    prompt = tally.prompt / ended if ended > 0 and tally.prompt > 0 else None
    output = tally.generated / ended if ended > 0 and tally.generated > 0 else None
    return Traffic(seconds, max(0, round(arrivals)), source, prompt, output)


class WindowParams(NamedTuple):
    """How far back the rate and the token means look (planner seconds: the service scales
    them to wall seconds with ``PLAN_TIME_SCALE``)."""

    # The rate is taken over the latest intervals holding at least this many arrivals (a count
    # of 50 is known to +-28% at two standard deviations; one of 4, a compressed day's minute,
    # to +-100%), but never over more than ``rate_span`` seconds: about a restart, so a surge
    # still shows within the time a switch takes. At a production load of a few requests per
    # second the window is the interval itself.
    min_arrivals: float = 50.0
    rate_span: float = 600.0
    # The token means (they scale the mix) over at least this many requests that ended: a
    # mean of conversation outputs over 400 requests is known to about +-5%, inside the
    # planner's mix tolerance (10%); over one interval's few requests it swung by half and
    # re-sized every split's capacity with it.
    min_ended: float = 400.0
    means_span: float = 3600.0
    z: float = 2.0  # the band's width in standard deviations (the forecast's)


class Count(NamedTuple):
    """One interval as the window keeps it."""

    seconds: float
    arrivals: float
    ended: float  # requests the engines counted ending (0 where they keep no count)
    prompt: float  # their prompt tokens
    generated: float  # their output tokens


class Estimate(NamedTuple):
    """The rate over the window, with a band for how few arrivals it holds, and the mix's
    token means over theirs."""

    arrivals: int
    seconds: float
    rate: float
    lower: float
    upper: float
    prompt_mean: float | None
    output_mean: float | None
    ended: float  # requests the means are over


def poisson_band(count: float, seconds: float, z: float = 2.0) -> tuple[float, float]:
    """The rates a Poisson count over ``seconds`` is consistent with, ``z`` standard deviations
    either side (Garwood's exact interval through the Wilson-Hilferty cube root of its
    chi-square quantiles: within a few percent of exact; zero arrivals and one's lower bound
    exactly). A band from ``sqrt(count)`` would be empty at zero arrivals and too narrow at a
    few, where a count says least."""
    if seconds <= 0 or count < 0:
        raise ValueError("need seconds > 0 and count >= 0")
    if count == 0:
        tail = 0.5 * math.erfc(z / math.sqrt(2.0))
        return 0.0, -math.log(tail) / seconds
    n1 = count + 1.0
    upper = n1 * (1.0 - 1.0 / (9.0 * n1) + z / (3.0 * math.sqrt(n1))) ** 3
    if count == 1:  # (exactly: where the cube root is least accurate)
        lower = -math.log1p(-0.5 * math.erfc(z / math.sqrt(2.0)))
    else:
        lower = count * max(0.0, 1.0 - 1.0 / (9.0 * count) - z / (3.0 * math.sqrt(count))) ** 3
    return lower / seconds, upper / seconds


class Window:
    """The last intervals' counts: the rate over the latest ones that hold enough arrivals, and
    the token means over enough requests that ended. Pure (fed one ``Count`` per plan)."""

    def __init__(self, params: WindowParams | None = None) -> None:
        self.p = params if params is not None else WindowParams()
        self.counts: deque[Count] = deque()

    def add(self, count: Count) -> None:
        self.counts.append(count)
        span = max(self.p.rate_span, self.p.means_span)
        kept = sum(c.seconds for c in self.counts)
        while len(self.counts) > 1 and kept - self.counts[0].seconds >= span:
            kept -= self.counts.popleft().seconds

    def estimate(self) -> Estimate:
        if not self.counts:
            raise ValueError("no interval counted yet")
        p = self.p
        arrivals = seconds = 0.0
        for c in reversed(self.counts):
            if seconds > 0 and (arrivals >= p.min_arrivals or seconds + c.seconds > p.rate_span):
                break
            arrivals += c.arrivals
            seconds += c.seconds
        ended = prompt = generated = spent = 0.0
        for c in reversed(self.counts):
            if spent > 0 and (ended >= p.min_ended or spent + c.seconds > p.means_span):
                break
            ended += c.ended
            prompt += c.prompt
            generated += c.generated
            spent += c.seconds
        lower, upper = poisson_band(arrivals, seconds, p.z)
        return Estimate(
            round(arrivals),
            seconds,
            arrivals / seconds,
            lower,
            upper,
            prompt / ended if ended > 0 and prompt > 0 else None,
            generated / ended if ended > 0 and generated > 0 else None,
            ended,
        )


def count_of(tally: Tally, tr: Traffic) -> Count:
    """The window's record of one interval: its arrivals as ``traffic`` took them, the token
    counters only where every engine counted its requests."""
    if not tally.counted:
        return Count(tr.seconds, tr.arrivals, 0.0, 0.0, 0.0)
    return Count(tr.seconds, tr.arrivals, tally.ended, tally.prompt, tally.generated)
