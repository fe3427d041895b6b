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
"""

from __future__ import annotations

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
