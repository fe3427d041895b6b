"""What the decision shell keeps of recent traffic, in plain values: the mix of the requests it
routed (``RecentMix``), and the interface of the crossover's and the curves' owner
(``Tuning``). ``router.forward.decider.Decider`` turns them, with the live counts, into a
policy ``Snapshot`` and the slo policy's surface (``router.decide.capacity``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple, Protocol

from router.decide.predict import Gain, PoolModel, Request
from router.pools import Pool

# The window (model seconds) of the arrival rate the slo policy holds against the engines'
# capacities: several request lifetimes, so that one burst does not count as overload.
OFFERED_WINDOW = 30.0
# The window (model seconds) of the requests sent to a backend lately, whose prefills stall
# its decode (the slo policy's time per token there): about a request's life (swept +-25% over
# the policy family: under a point of mean goodput either way).
LATELY = 5.0
# Weight of each request in the mix's decayed means (about the last 50 requests), once 50
# have been seen (before, each weighs as much as those before it).
MIX_KEEP = 0.02


class Tuning(Protocol):
    """What routing reads from the crossover's owner (``router.learn.keeper``)."""

    @property
    def crossover(self) -> int:
        """Requests per speculative engine: the crossover, or with ``no_crossover`` the
        highest level measured (``router.decide.policy.Snapshot``)."""
        ...

    @property
    def no_crossover(self) -> bool: ...

    @property
    def gain(self) -> Gain | None: ...

    @property
    def models(self) -> Mapping[Pool, PoolModel] | None: ...

    @property
    def traffic(self) -> Traffic: ...


class Traffic(NamedTuple):
    """What the keeper knows of recent requests, for sizing one that does not say."""

    mean_output: float = 200.0
    tokens_per_char: float = 0.25
    output_spread: float = 1.0  # sigma of log(output tokens)


class RecentRate:
    """Requests per second lately: a count decayed over ``window`` seconds (an exponential
    moving average of the arrival rate), and when the prefills sent lately end (``until``: they
    run one after another, so a request sent now starts its own after them). Reading it changes
    nothing."""

    __slots__ = ("count", "at", "window", "until")

    def __init__(self, window: float, now: float) -> None:
        self.count = 0.0
        self.at = now
        self.window = window
        self.until = now

    def add(self, now: float, prefill: float = 0.0) -> None:
        """One more sent at ``now``, its prefill ``prefill`` seconds (the shell's clock)."""
        # (``max(self.until, now) + prefill`` and ``max(self.at, now)``, without the calls)
        until = self.until
        self.until = (now if now > until else until) + prefill
        at = self.at
        if now > at:
            self.count = self.count * math.exp(-(now - at) / self.window) + 1.0
            self.at = now
        else:
            self.count += 1.0

    def ahead(self, now: float) -> float:
        """Seconds of the prefills sent lately still to run at ``now``."""
        return self.until - now if self.until > now else 0.0

    def rate(self, now: float) -> float:
        keep = math.exp(-(now - self.at) / self.window) if now > self.at else 1.0
        return self.count * keep / self.window


class RecentMix:
    """Decayed means of the requests routed: their prompt tokens and share at temperature > 0."""

    __slots__ = ("sampling", "prompt", "seen")

    def __init__(self) -> None:
        self.sampling = 0.5  # share at temperature > 0
        self.prompt = 0.0
        self.seen = 0

    def add(self, req: Request) -> None:
        k = MIX_KEEP if self.seen >= 1 / MIX_KEEP else 1.0 / (self.seen + 1)
        self.seen += 1
        self.sampling += (float(req.sampling) - self.sampling) * k
        self.prompt += (req.prompt_tokens - self.prompt) * k
