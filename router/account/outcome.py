"""What happened to one request: the record the proxy fills in and every observer reads.

The proxy records through the methods below, one per event of a request's life; observers
(metrics, the learner) read the fields once the request is over, never per chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from router.decide.predict import Request
from router.pools import Pool
from router.upstream.stream import Usage


@dataclass(slots=True)
class Outcome:
    """What happened to one request: the record every observer (metrics, learning) reads."""

    path: str
    started: float
    stream: bool = False
    pool: Pool | None = None
    backend: str | None = None
    reason: str = "none"  # a policy Reason once routed
    status: int = 0
    attempts: int = 0
    first_byte: float | None = None
    area_first: float | None = None  # the backend's in-flight integral at the first byte
    ended: float = 0.0
    area_end: float | None = None  # the same integral as its lease went (``lease_ends``)
    area_at: float | None = None  # when ``area_end`` was taken
    error: str | None = None  # the upstream error that ended the request, if any
    client_gone: bool = False
    slow_client: bool = False  # the client could not take the body as fast as it came
    usage: Usage | None = None
    # every failed upstream attempt (pool, backend, kind) and every retry (pool left, kind)
    sampling: bool = True
    was_queued: bool = False
    prompt_chars: int = 0
    load_at_start: int = 0  # requests in flight on its backend when it was routed there
    sent_mark: int = 0  # requests ever sent to that backend by then, itself included
    joined: int = 0  # requests sent to that backend after it, before its first byte
    prefill_share: float = 0.0  # that backend's recent prefill share then (slo policy)
    prefill: float = 0.0  # its prefill there, as the slo policy estimated it (model seconds)
    request: Request | None = None  # what the slo policy knew of it (None under the others)
    failures: list[tuple[Pool, str, str]] = field(default_factory=list)
    retries: list[tuple[Pool, str]] = field(default_factory=list)

    def read(self, stream: bool, sampling: bool = True, prompt_chars: int = 0) -> None:
        """The request was read: whether it asked for a stream, sampled (temperature > 0) and
        how many characters of prompt text it sent."""
        self.stream = stream
        self.sampling = sampling
        self.prompt_chars = prompt_chars

    def queued(self) -> None:
        """It waited in the router's queue before it was routed (or refused)."""
        self.was_queued = True

    def attempt(
        self,
        pool: Pool,
        backend: str,
        reason: str,
        load: int = 0,
        prefill_share: float = 0.0,
        sent: int = 0,
        prefill: float = 0.0,
    ) -> None:
        """The request is (re)sent to ``backend``, which had ``load`` requests in flight and
        has been sent ``sent`` requests ever, this one included; ``prefill``: its estimated
        prefill there."""
        self.attempts += 1
        self.pool, self.backend, self.reason = pool, backend, reason
        self.load_at_start, self.prefill_share, self.sent_mark = load, prefill_share, sent
        self.prefill = prefill

    def attempt_failed(self, kind: str) -> None:
        """The current attempt's backend failed (counted against it, whatever happens next)."""
        assert self.pool is not None and self.backend is not None
        self.failures.append((self.pool, self.backend, kind))

    def retried(self, kind: str) -> None:
        """The current attempt is abandoned for another backend; ``attempt`` follows."""
        assert self.pool is not None
        self.retries.append((self.pool, kind))

    def answered(self, status: int) -> None:
        """The status the client was (or is being) sent."""
        self.status = status

    def first_bytes(self, now: float, area: float, sent: int = 0) -> None:
        """The first response body bytes arrived; ``area``: the backend's in-flight integral,
        ``sent``: requests ever sent to it."""
        if self.first_byte is None:
            self.first_byte, self.area_first = now, area
            self.joined = max(0, sent - self.sent_mark)

    def lease_ends(self, now: float, area: float) -> None:
        """Its lease is about to go: ``area``, its backend's in-flight integral at ``now``
        while it still counts there, kept (with ``now``) once it had a first byte: the
        keeper's concurrency over its decode is the integral's mean from ``area_first``.
        Taken after the release, the moments between would count it out of its own decode."""
        if self.area_first is not None:
            self.area_end, self.area_at = area, now

    def broke(self, kind: str) -> None:
        """An upstream error ended the request."""
        self.error = kind

    def client_left(self) -> None:
        self.client_gone = True

    def fell_behind(self) -> None:
        """The client could not take the body as fast as the engine sent it."""
        self.slow_client = True

    def counted(self, usage: Usage | None) -> None:
        """The token usage the engine reported, once the whole body passed."""
        self.usage = usage

    def finish(self, now: float) -> None:
        self.ended = now
