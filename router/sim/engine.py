"""The continuous-batching loop of a simulated engine: ``router.sim.model`` against a clock.

One asyncio task runs iterations back to back while there is work. At each boundary it admits
queued requests up to ``max_running``, computes the iteration's duration from the model,
sleeps until the iteration's deadline and then hands every running request the tokens it
gained. Deadlines are accumulated (``deadline += duration``) on ``time.monotonic`` rather than
measured from "now", so timer jitter and the time spent in this loop do not add up: an
iteration may end up to about a millisecond off (uvloop timers have millisecond resolution),
but the next one ends on schedule again.

Requests receive tokens through a per-request future, set by the loop and awaited by the HTTP
handler; nothing polls. ``abort()`` takes a request out of the batch or the queue at once.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import deque
from collections.abc import Callable

from router.sim.metrics import EngineStats, Gauges
from router.sim.model import Preset, check_tau, prefill_time, sample_gain, solve_alpha, step_time

# Update the gen_throughput / spec_accept_length gauges every this many iterations, as
# SGLang does with its ``decode_log_interval``.
GAUGE_INTERVAL = 40
# An iteration may end this much before its deadline rather than spin on a sub-millisecond
# timer; the error does not accumulate.
EARLY_OK = 0.0005
# If the loop falls further behind than this (a stalled process), forget the debt instead of
# emitting a burst of back-to-back iterations.
MAX_LAG = 0.1


class SimRequest:
    """One generation request as the engine and its HTTP handler share it."""

    __slots__ = (
        "rid", "prompt_tokens", "max_tokens", "sampling", "rng", "generated", "pending",
        "closed", "waiter", "arrival", "last_emit", "first_token_at", "in_batch",
    )  # fmt: skip

    def __init__(
        self, rid: str, prompt_tokens: int, max_tokens: int, sampling: bool, rng: random.Random
    ) -> None:
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.rng = rng
        self.generated = 0  # tokens produced by the engine
        self.pending = 0  # produced but not yet taken by the handler
        self.closed = False  # finished or aborted: nothing more will come
        self.waiter: asyncio.Future[None] | None = None
        self.arrival = 0.0
        self.last_emit = 0.0
        self.first_token_at = 0.0
        self.in_batch = False

    @property
    def done(self) -> bool:
        return self.generated >= self.max_tokens

    async def next_tokens(self) -> int:
        """Tokens gained since the last call; 0 once the request is closed and drained."""
        while not self.pending and not self.closed:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        n, self.pending = self.pending, 0
        return n

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class Engine:
    def __init__(
        self,
        preset: Preset,
        *,
        time_scale: float = 1.0,
        seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.preset = preset
        self.time_scale = time_scale
        self.seed = random.randrange(2**32) if seed is None else seed
        self.stats = EngineStats()
        self._clock = clock
        self._ids = itertools.count()
        self._running: list[SimRequest] = []
        self._waiting: deque[SimRequest] = deque()
        self._context = 0  # tokens held by the running requests
        self._wake = asyncio.Event()
        self._tau = {False: preset.tau, True: preset.tau_sampling}
        self._alpha = {s: solve_alpha(t, preset.spec_k) for s, t in self._tau.items()}

    # --- runtime knobs ------------------------------------------------------------------------

    @property
    def tau(self) -> float:
        return self._tau[False]

    @property
    def tau_sampling(self) -> float:
        return self._tau[True]

    def set_tau(self, tau: float | None = None, tau_sampling: float | None = None) -> None:
        """Change the mean acceptance length (``None`` keeps the current value); applies from
        the next iteration on, to running requests too."""
        for sampling, value in ((False, tau), (True, tau_sampling)):
            if value is not None:
                check_tau(value, self.preset.spec_k)
                self._tau[sampling] = value
                self._alpha[sampling] = solve_alpha(value, self.preset.spec_k)

    # --- requests -----------------------------------------------------------------------------

    def submit(
        self,
        prompt_tokens: int,
        max_tokens: int,
        *,
        temperature: float = 0.0,
        seed: int | None = None,
    ) -> SimRequest:
        """Queue a request; it joins the batch at the next iteration boundary."""
        n = next(self._ids)
        # One generator per request: its acceptance draws do not depend on what else runs.
        rng = random.Random(f"{self.seed}:{n if seed is None else f's{seed}'}")
        req = SimRequest(f"{n:08x}", prompt_tokens, max_tokens, temperature > 0, rng)
        req.arrival = self._clock()
        self._waiting.append(req)
        self._wake.set()
        return req

    def abort(self, req: SimRequest) -> None:
        """Take a request out at once (client gone, or an injected fault)."""
        if req.closed:
            return
        req.closed = True
        self.stats.aborted += 1
        if req.in_batch:
            self._remove(req)
        else:
            try:
                self._waiting.remove(req)
            except ValueError:
                pass
        req._wake()

    def gauges(self) -> Gauges:
        return Gauges(len(self._running), len(self._waiting), self._context)

    def _remove(self, req: SimRequest) -> None:
        self._running.remove(req)
        req.in_batch = False
        self._context -= req.prompt_tokens + req.generated

    # --- the loop -----------------------------------------------------------------------------

    async def run(self) -> None:
        deadline = self._clock()
        while True:
            if not self._running and not self._waiting:
                self._idle()
                self._wake.clear()
                await self._wake.wait()
                deadline = self.stats.window_start = self._clock()
            joiners = self._admit()
            if not self._running:
                continue
            duration = step_time(self.preset, len(self._running), self._context)
            duration += sum(prefill_time(self.preset, r.prompt_tokens) for r in joiners)
            deadline += duration * self.time_scale
            now = self._clock()
            if deadline - now <= EARLY_OK:
                # Behind schedule: still let the handlers send the last iteration's tokens, so
                # that each iteration stays its own chunk.
                await asyncio.sleep(0)
            while deadline - now > EARLY_OK:
                await asyncio.sleep(deadline - now)
                now = self._clock()
            late = now - deadline
            if late > MAX_LAG:
                self.stats.lag_resets += 1
                deadline = now
            self._end_iteration(now, max(0.0, late))

    def _admit(self) -> list[SimRequest]:
        joiners = []
        while self._waiting and len(self._running) < self.preset.max_running:
            req = self._waiting.popleft()
            req.in_batch = True
            self._running.append(req)
            self._context += req.prompt_tokens
            self.stats.prompt_tokens += req.prompt_tokens
            joiners.append(req)
        return joiners

    def _end_iteration(self, now: float, late: float) -> None:
        stats, k = self.stats, self.preset.spec_k
        stats.iterations += 1
        stats.late_sum += late
        stats.late_max = max(stats.late_max, late)
        gained_total = 0
        finished = []
        for req in self._running:
            if req.generated == 0:
                gain = 1  # the join iteration yields the first token
                req.first_token_at = now
                stats.ttft.observe(now - req.arrival)
            else:
                if k:
                    u = req.rng.random()
                    gain = sample_gain(self._alpha[req.sampling], k, u)
                    stats.spec_tokens += gain
                    stats.spec_steps += 1
                    stats.window_spec_tokens += gain
                    stats.window_spec_steps += 1
                else:
                    gain = 1
                gain = min(gain, req.max_tokens - req.generated)
                interval = now - req.last_emit
                stats.itl.observe(interval / gain, gain, interval)  # as SGLang: per token
            req.last_emit = now
            req.generated += gain
            req.pending += gain
            gained_total += gain
            if req.done:
                finished.append(req)
            req._wake()
        self._context += gained_total
        stats.generation_tokens += gained_total
        stats.window_tokens += gained_total
        for req in finished:
            self._remove(req)
            req.closed = True
            stats.requests += 1
            stats.e2e.observe(now - req.arrival)
        stats.window_iterations += 1
        if stats.window_iterations >= GAUGE_INTERVAL:
            self._update_gauges(now)

    def _update_gauges(self, now: float) -> None:
        s = self.stats
        if s.window_start and now > s.window_start:
            s.gen_throughput = s.window_tokens / (now - s.window_start)
        if s.window_spec_steps:
            s.spec_accept_length = s.window_spec_tokens / s.window_spec_steps
        s.window_start = now
        s.window_tokens = s.window_spec_tokens = s.window_spec_steps = s.window_iterations = 0

    def _idle(self) -> None:
        # Unlike SGLang, which leaves the last value standing, report an idle engine as idle.
        s = self.stats
        s.gen_throughput = 0.0
        s.window_start = 0.0
        s.window_tokens = s.window_spec_tokens = s.window_spec_steps = s.window_iterations = 0
