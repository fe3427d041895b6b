"""A fast simulated engine for the fleet lab: the sims' continuous-batching loop, by events.

The loop is ``router.sim.model``'s (and ``bench/lab_sim.py``'s): an iteration with ``B``
running requests holding ``K`` context tokens costs ``a + b*B + c_kv*K``; requests that join at
an iteration's start add their prefill to it and get their first token at its end; after that
each iteration gives a baseline request one token and a speculative one ``1 + j`` (``j`` leading
accepted drafts of ``k``). Requests past ``max_running`` wait in a queue.

What makes it fast: between events (a join, a finish) the batch is constant, so every iteration
costs the same and the engine jumps to the next event instead of stepping. Each request draws,
when it joins, how many decode iterations its ``output - 1`` remaining tokens take: exactly (one
draw per iteration) for short outputs, and from the renewal theorem's normal law (mean
``expected_steps``, variance ``m * var(gain) / mean(gain)**3``) for long ones. The context ``K``
grows by each request's mean tokens per iteration (not its draws); its cost is a few per cent of
an iteration at most. ``bench/lab/fleet_fidelity.py`` compares it with ``lab_sim``'s engine.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache

from router.sim.model import (
    Preset,
    expected_steps,
    gain_pmf,
    prefill_time,
    sample_gain,
    solve_alpha,
)

# Outputs up to this many tokens draw their decode iterations one by one; longer ones from the
# renewal theorem's normal approximation (exact within a few per cent of a standard deviation
# there, and O(1)).
EXACT_TOKENS = 32


@dataclass(slots=True)
class Req:
    """One request: what it asks, and what happened to it (model seconds)."""

    at: float
    prompt: int
    output: int
    hot: bool  # temperature > 0
    index: int = 0
    engine: int = -1  # which engine served it
    spec: bool = False  # served by a speculative engine
    first: float = math.nan
    last: float = math.nan
    iters: int = 0  # decode iterations after the first token (drawn at join)
    tau: float = 1.0
    joined: int = 0  # the engine's iteration it joined in
    dropped: bool = False

    @property
    def ttft(self) -> float:
        return self.first - self.at

    @property
    def tpot(self) -> float:
        return (self.last - self.first) / (self.output - 1) if self.output > 1 else 0.0


@lru_cache(maxsize=64)
def _gain_law(tau: float, k: int) -> tuple[float, float, float]:
    """(alpha, mean gain, variance of the gain) of one speculative iteration."""
    alpha = solve_alpha(tau, k)
    pmf = gain_pmf(alpha, k)
    mu = sum(g * p for g, p in enumerate(pmf, start=1))
    var = sum(g * g * p for g, p in enumerate(pmf, start=1)) - mu * mu
    return alpha, mu, var


def decode_iterations(p: Preset, tokens: int, tau: float, rng: random.Random) -> int:
    """Iterations a running request takes to gain ``tokens`` more tokens (a random draw)."""
    if tokens <= 0:
        return 0
    if p.spec_k == 0:
        return tokens
    alpha, mu, var = _gain_law(tau, p.spec_k)
    if tokens <= EXACT_TOKENS:
        n = got = 0
        while got < tokens:
            got += sample_gain(alpha, p.spec_k, rng.random())
            n += 1
        return n
    mean = expected_steps(tokens, tau, p.spec_k)
    sd = math.sqrt(tokens * var / mu**3)
    n = round(mean + sd * rng.gauss(0.0, 1.0))
    return min(tokens, max(math.ceil(tokens / (p.spec_k + 1)), n))


@dataclass
class Engine:
    """One engine; ``advance(t)`` runs it up to time ``t``, ``submit`` hands it a request."""

    p: Preset
    seed: int
    index: int = 0
    rng: random.Random = field(init=False)
    running: list[tuple[int, int, Req]] = field(default_factory=list)  # (last iteration, seq, r)
    joiners: list[Req] = field(default_factory=list)  # joining in the iteration under way
    waiting: deque[Req] = field(default_factory=deque)
    it: int = 0  # index of the iteration under way
    t0: float = 0.0  # its start
    dur: float = 0.0  # its duration
    busy: bool = False
    seq: int = 0
    # context held, as sum(prompt) + it * sum(tau) - sum(tau * joined): see the module docstring
    _prompt: float = 0.0
    _tau: float = 0.0
    _tau_joined: float = 0.0
    # work done, for reports
    tokens: int = 0
    busy_time: float = 0.0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    @property
    def load(self) -> int:
        """Requests in flight here (what a router counts)."""
        return len(self.running) + len(self.joiners) + len(self.waiting)

    @property
    def batch(self) -> int:
        return len(self.running) + len(self.joiners)

    def submit(self, r: Req, now: float) -> None:
        r.spec = self.p.spec_k > 0
        r.engine = self.index
        r.tau = self.p.tau_for(1.0 if r.hot else 0.0)
        r.iters = decode_iterations(self.p, r.output - 1, r.tau, self.rng)
        self.waiting.append(r)
        if not self.busy:
            self._start(now, now)

    def advance(self, until: float, done: list[Req]) -> None:
        """Run every iteration that ends by ``until``; finished requests go to ``done``."""
        while self.busy and self.t0 + self.dur <= until:
            end = self.t0 + self.dur
            self.busy_time += self.dur
            for r in self.joiners:
                r.first = end
                self.tokens += 1
                self.seq += 1
                heapq.heappush(self.running, (self.it + r.iters, self.seq, r))
            self.joiners = []
            while self.running and self.running[0][0] <= self.it:
                r = heapq.heappop(self.running)[2]
                r.last = end
                self.tokens += r.output - 1
                self._prompt -= r.prompt
                self._tau -= r.tau
                self._tau_joined -= r.tau * r.joined
                done.append(r)
            self.it += 1
            self._start(end, until)

    def next_event(self) -> float:
        """When the iteration under way ends (inf when idle)."""
        return self.t0 + self.dur if self.busy else math.inf

    def _start(self, now: float, until: float) -> None:
        p = self.p
        while self.waiting and self.batch < p.max_running:
            r = self.waiting.popleft()
            self.joiners.append(r)
            r.joined = self.it
            self._prompt += r.prompt
            self._tau += r.tau
            self._tau_joined += r.tau * self.it
        batch = self.batch
        if batch == 0:
            self.busy = False
            return
        context = self._prompt + self.it * self._tau - self._tau_joined
        d = p.a + p.b * batch + p.c_kv * context
        if self.joiners:
            d += sum(prefill_time(p, r.prompt) for r in self.joiners)
        else:
            # nothing changes before the next finish: skip the iterations that end by `until`
            skip = self.running[0][0] - self.it
            if until - now < skip * d:
                skip = math.floor((until - now) / d)
            if skip > 0:
                now += skip * d
                self.busy_time += skip * d
                self.it += skip
        self.t0, self.dur, self.busy = now, d, True

    def drop_all(self, now: float) -> list[Req]:
        """Everything in flight, taken away (an engine stopped without draining)."""
        out = [r for _, _, r in self.running] + self.joiners + list(self.waiting)
        for r in out:
            r.dropped = True
        self.running, self.joiners, self.waiting = [], [], deque()
        self._prompt = self._tau = self._tau_joined = 0.0
        self.busy = False
        return out
