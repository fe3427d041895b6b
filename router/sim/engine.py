"""The continuous-batching loop of a simulated engine: ``router.sim.model`` against a clock.

One asyncio task runs iterations back to back while there is work. At each boundary it admits
queued requests up to ``max_running``, computes the iteration's duration from the model,
sleeps until the iteration's deadline and then hands every running request the tokens it
gained. Deadlines are accumulated (``deadline += duration``) on the engine's clock rather than
measured from "now", so timer jitter and the time spent in this loop do not add up: an
iteration may end up to about a millisecond off (uvloop timers have millisecond resolution),
but the next one ends on schedule again (tests/sim/test_engine.py holds it to that on a
virtual clock).

Requests receive tokens through a per-request future, set by the loop and awaited by the HTTP
handler; nothing polls. ``abort()`` takes a request out of the batch or the queue at once.

What the engine *publishes* as its load (``published``, read by ``/metrics``) follows the real
engine's cadence (``router.sim.behaviour``): vLLM after every step; SGLang on each prefill
batch (without that batch's own requests, which are in neither gauge yet), every
``decode_log_interval`` iterations, and when idle (at once if stale on 0.5.23, every 30 s).
Nothing is published before the first report (SGLang's labelled gauges have no series until
then; the server publishes once its warm-up is over).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections import deque
from collections.abc import Callable

from router.sim.metrics import EngineStats, Gauges, Tally
from router.sim.model import Preset, check_tau, prefill_time, sample_gain, solve_alpha, step_time

# Update the gen_throughput / spec_accept_length gauges every this many iterations, as
# SGLang does with its ``decode_log_interval`` (the default, 40).
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
        "closed", "waiter", "arrival", "last_emit", "first_token_at", "in_batch", "priority",
        "streaming", "steps", "probe", "hold_at",
    )  # fmt: skip

    def __init__(
        self,
        rid: str,
        prompt_tokens: int,
        max_tokens: int,
        sampling: bool,
        rng: random.Random,
        priority: str = "None",
        streaming: bool = False,
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
        self.priority = priority  # SGLang's label value: "None" when the request set none
        self.streaming = streaming
        self.steps = 0  # speculative verify steps (SGLang's spec_verify_ct)
        self.probe = False  # a /health generation, not a client's request
        # (an injected fault, ``hold_after``) no token past this many until ``Engine.release``
        self.hold_at: int | None = None

    @property
    def done(self) -> bool:
        return self.generated >= self.max_tokens

    @property
    def holding(self) -> bool:
        return self.hold_at is not None and self.generated >= self.hold_at

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


class EngineQueueFull(Exception):
    """The waiting queue is at its limit (``--max-queued``): the request is refused."""


class Engine:
    def __init__(
        self,
        preset: Preset,
        *,
        time_scale: float = 1.0,
        seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        every_step: bool = True,
        log_interval: int = GAUGE_INTERVAL,
        idle_refresh: float = 30.0,
        refresh_when_stale: bool = True,
        max_queued: int | None = None,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.preset = preset
        self.time_scale = time_scale
        self.seed = random.randrange(2**32) if seed is None else seed
        self.stats = EngineStats()
        self.stats.accepted_per_pos = [0] * preset.spec_k
        self._clock = clock
        self._ids = itertools.count()
        self._running: list[SimRequest] = []
        self._waiting: deque[SimRequest] = deque()
        self._context = 0  # tokens held by the running requests
        self._wake = asyncio.Event()
        self._tau = {False: preset.tau, True: preset.tau_sampling}
        self._alpha = {s: solve_alpha(t, preset.spec_k) for s, t in self._tau.items()}
        self.every_step = every_step
        self.log_interval = log_interval
        self.idle_refresh = idle_refresh * time_scale
        self.refresh_when_stale = refresh_when_stale
        self.max_queued = max_queued
        self.published: Gauges | None = Gauges(0, 0, 0) if every_step else None
        self.published_at = clock()
        self.last_output_at = 0.0  # when tokens last reached a handler (SGLang's health check)
        self._decode_ct = 0

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
        priority: int | None = None,
        streaming: bool = False,
        hold_after: int | None = None,
    ) -> SimRequest:
        """Queue a request; it joins the batch at the next iteration boundary. Raises
        ``EngineQueueFull`` when ``max_queued`` requests already wait (SGLang and vLLM 0.34 check
        the waiting queue's length as the request arrives). With ``hold_after`` it gains no
        token past that many until ``release()``: it stays in the batch, running."""
        if self.max_queued is not None and len(self._waiting) >= self.max_queued:
            self.stats.refused += 1
            raise EngineQueueFull("The request queue is full.")
        n = next(self._ids)
        # One generator per request: its acceptance draws do not depend on what else runs.
        rng = random.Random(f"{self.seed}:{n if seed is None else f's{seed}'}")
        label = "None" if priority is None else str(priority)
        req = SimRequest(
            f"{n:08x}", prompt_tokens, max_tokens, temperature > 0, rng, label, streaming
        )
        req.arrival = self._clock()
        req.hold_at = hold_after
        self._waiting.append(req)
        self._wake.set()
        if self.every_step:
            self.publish()
        return req

    @property
    def held(self) -> int:
        """Requests in the batch at their ``hold_after`` now."""
        return sum(r.holding for r in self._running)

    def release(self) -> None:
        """Every request with a ``hold_after`` generates on from the next iteration."""
        for req in (*self._running, *self._waiting):
            req.hold_at = None

    @property
    def busy(self) -> bool:
        return bool(self._running or self._waiting)

    def probe(self) -> SimRequest | None:
        """SGLang's /health generation: one token of input ``[0]``; skipped while the engine
        is busy ("ongoing requests already carry health info")."""
        if self.busy:
            return None
        self.stats.health_generations += 1
        req = self.submit(1, 1, temperature=0.0)
        req.probe = True
        return req

    def age(self, req: SimRequest) -> float:
        """Seconds since ``req`` arrived."""
        return self._clock() - req.arrival

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
        self._tally(req)
        req._wake()
        if self.every_step:
            self.publish()

    def gauges(self) -> Gauges:
        """The live load (what a perfect engine would report)."""
        return self._gauges(list(self._running), list(self._waiting))

    def _gauges(self, running: list[SimRequest], waiting: list[SimRequest]) -> Gauges:
        by_priority: dict[str, tuple[int, int]] = {}
        for which, reqs in ((0, running), (1, waiting)):
            for req in reqs:
                counts = by_priority.get(req.priority, (0, 0))
                by_priority[req.priority] = (
                    (counts[0] + 1, counts[1]) if which == 0 else (counts[0], counts[1] + 1)
                )
        context = sum(r.prompt_tokens + r.generated for r in running)
        return Gauges(len(running), len(waiting), context, by_priority)

    def publish(self, running: list[SimRequest] | None = None) -> None:
        self.published = self._gauges(
            list(self._running) if running is None else running, list(self._waiting)
        )
        self.published_at = self._clock()

    def _tally(self, req: SimRequest) -> None:
        """SGLang's tokenizer-side counters move only when a request ends (finished or
        aborted), by its whole count. Health probes are left out (counted on their own)."""
        if req.probe:
            return
        key = (req.priority, req.streaming)
        tally = self.stats.finished.get(key)
        if tally is None:
            tally = self.stats.finished[key] = Tally()
        tally.prompt_tokens += req.prompt_tokens
        tally.generation_tokens += req.generated
        tally.verify_calls += req.steps
        tally.requests += 1

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
                await self._idle_wait()
                if not self.busy:
                    continue
                deadline = self.stats.window_start = self._clock()
            joiners = self._admit()
            if not self._running:
                continue
            if joiners and not self.every_step:
                # SGLang's prefill report: the running batch as scheduled, without the
                # joining requests, and the queue after they left it
                joined = {r.rid for r in joiners}
                self.publish([r for r in self._running if r.rid not in joined])
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

    async def _idle_wait(self) -> None:
        """Sleep until there is work. Meanwhile SGLang publishes an idle report: at once
        when its running gauge is stale (0.5.23), else once ``idle_refresh`` has passed."""
        while not self.busy:
            timeout: float | None = None
            if not self.every_step:
                seen = self.published
                if seen is not None and seen.running and self.refresh_when_stale:
                    self.publish()
                elif self._clock() >= self.published_at + self.idle_refresh:
                    self.publish()
                timeout = max(0.0, self.published_at + self.idle_refresh - self._clock())
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _end_iteration(self, now: float, late: float) -> None:
        stats, k = self.stats, self.preset.spec_k
        stats.iterations += 1
        stats.late_sum += late
        stats.late_max = max(stats.late_max, late)
        gained_total = 0
        finished = []
        holding = False
        for req in self._running:
            if req.holding:
                holding = True  # in the batch, gaining nothing
                continue
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
                    stats.accepted_per_pos[: gain - 1] = [
                        c + 1 for c in stats.accepted_per_pos[: gain - 1]
                    ]
                    req.steps += 1
                else:
                    gain = 1
                gain = min(gain, req.max_tokens - req.generated)
                if req.hold_at is not None:
                    gain = min(gain, req.hold_at - req.generated)
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
        if gained_total or holding:
            # (a held request stands for one still generating: SGLang's health check sees
            # output)
            self.last_output_at = now
        for req in finished:
            self._remove(req)
            req.closed = True
            stats.requests += 1
            stats.e2e.observe(now - req.arrival)
            self._tally(req)
        stats.window_iterations += 1
        if stats.window_iterations >= self.log_interval:
            self._update_gauges(now)
        self._decode_ct += 1
        if self.every_step or self._decode_ct % self.log_interval == 0:
            self.publish()

    def _update_gauges(self, now: float) -> None:
        s = self.stats
        if s.window_start and now > s.window_start:
            s.gen_throughput = s.window_tokens / (now - s.window_start)
        if s.window_spec_steps:
            s.spec_accept_length = s.window_spec_tokens / s.window_spec_steps
            # /server_info's avg_spec_accept_length: the windows reported so far (a lifetime
            # mean that misses the window in progress, as SGLang's does)
            s.reported_spec_tokens += s.window_spec_tokens
            s.reported_spec_steps += s.window_spec_steps
        s.window_start = now
        s.window_tokens = s.window_spec_tokens = s.window_spec_steps = s.window_iterations = 0

    def _idle(self) -> None:
        # Unlike SGLang, which leaves the last value standing, report an idle engine as idle.
        s = self.stats
        s.gen_throughput = 0.0
        s.window_start = 0.0
        s.window_tokens = s.window_spec_tokens = s.window_spec_steps = s.window_iterations = 0
