"""What the decision shell keeps of recent traffic, in plain values: each backend's recent
prefill share, arrival rate and stay (``Recent``), the mix of recent requests (``Mix``), a
request in flight as the slo policy's twin sees it (``flight``), and the interface of the
crossover's owner (``Tuning``). ``router.forward.decider.Decider`` holds them per backend and
turns them, with the live counts, into a policy ``Snapshot``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

from router.decide.predict import Gain, PoolModel, Request
from router.decide.twin import Flight
from router.pools import Pool

# The window (model seconds) over which a backend's recent prefill share and arrival rate are
# averaged: about a request's lifetime, so that predictions see the traffic it will live with.
RECENT_WINDOW = 5.0
# The window (model seconds) of the arrival rate the slo policy expects to keep coming to a
# backend (router.decide.twin.Stream): several lifetimes, so one burst does not set it.
STREAM_WINDOW = 30.0
SAMPLING_KEEP = 0.02  # weight of each request in the sampling share and the mean sizes
# The stream's rate: the larger of the recent (RECENT_WINDOW) and the longer-run (STREAM_WINDOW)
# arrival rates, so a burst counts as soon as it starts and one quiet moment does not erase it.
BURST_AWARE = True


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


class Recent:
    """A backend's recent traffic over about ``window`` seconds, all measured: the prefill time
    sent to it (a decayed sum: over the window, the share of the time it spends prefilling),
    its arrival rate, and how long its requests stayed (in-flight time over requests finished).
    Little's law gives the load that arrival rate will keep it at: it rises as soon as a burst
    starts, while the load itself still lags. (Not from predicted stays: an estimate fed by its
    own errors runs away.)"""

    __slots__ = ("prefill", "arrivals", "area", "done", "last_area", "last_done", "at", "stream")

    def __init__(self, now: float) -> None:
        self.prefill = self.arrivals = self.area = self.done = self.stream = 0.0
        self.last_area = 0.0
        self.last_done = 0
        self.at = now

    def update(self, now: float, window: float, area: float, done: int) -> None:
        keep = math.exp(-(now - self.at) / window) if now > self.at else 1.0
        self.prefill *= keep
        self.arrivals *= keep
        # (the same decay over the longer window: keep ** (RECENT_WINDOW / STREAM_WINDOW))
        self.stream *= keep ** (RECENT_WINDOW / STREAM_WINDOW)
        self.area = self.area * keep + (area - self.last_area)
        self.done = self.done * keep + (done - self.last_done)
        self.last_area, self.last_done, self.at = area, done, now

    def expected(self, window: float) -> float | None:
        """None until a request has finished there: no stay measured yet."""
        if self.done <= 0:
            return None
        return self.arrivals / window * self.area / self.done

    def rate(self, now: float, window: float) -> float:
        """Arrivals per second (of ``window``'s clock) the stream there is expected to bring:
        the larger of the recent and the longer-run rate (see ``BURST_AWARE``), as of ``now``."""
        keep = math.exp(-(now - self.at) / window) if now > self.at else 1.0
        longer: float = self.stream * keep ** (RECENT_WINDOW / STREAM_WINDOW)
        longer /= window * STREAM_WINDOW / RECENT_WINDOW
        return max(longer, self.arrivals * keep / window) if BURST_AWARE else longer

    def sent(self, prefill: float) -> None:
        """A request was sent there, whose prefill takes ``prefill`` seconds."""
        self.prefill += prefill
        self.arrivals += 1.0
        self.stream += 1.0


class Mix:
    """Decayed means of the requests routed (model-free sizes, for the slo policy's stream)."""

    __slots__ = ("sampling", "prompt", "output", "seen")

    def __init__(self) -> None:
        self.sampling = 0.5  # share at temperature > 0
        self.prompt = 0.0
        self.output = 0.0
        self.seen = 0

    def add(self, req: Request) -> None:
        k = SAMPLING_KEEP if self.seen >= 1 / SAMPLING_KEEP else 1.0 / (self.seen + 1)
        self.seen += 1
        self.sampling += (float(req.sampling) - self.sampling) * SAMPLING_KEEP
        self.prompt += (req.prompt_tokens - self.prompt) * k
        self.output += (req.output_tokens - self.output) * k


def flight(out: Any, now: float, model: PoolModel) -> Flight:
    """A request in flight (``router.account.outcome.Outcome`` with its ``request``), in the
    model seconds of ``model``. A streamed request's first token is its first byte; a whole
    answer's first byte is its last, so its progress is guessed from the model instead."""
    req: Request = out.request
    scale = model.scale
    age = (now - out.started) / scale
    if out.stream:
        first = out.first_byte
        decoding = None if first is None else (now - first) / scale
    else:
        ttft = model.prefill(req.prompt_tokens) + model.iteration(1)
        decoding = age - ttft if age > ttft else None
    return Flight(req.prompt_tokens, req.output_tokens, req.sampling, age, decoding,
                  req.slo_ttft / scale, req.slo_tpot / scale)  # fmt: skip
