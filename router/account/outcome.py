"""What happened to one request: the record the proxy fills in and every observer reads.

Observers (metrics, the learner) run once per finished request, never per chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from router.forward.stream import Usage
from router.pools import Pool


@dataclass(slots=True)
class Outcome:
    """What happened to one request: the record every observer (metrics, learning) reads."""

    path: str
    started: float
    stream: bool = False
    pool: Pool | None = None
    backend: str | None = None
    reason: str = "none"
    status: int = 0
    attempts: int = 0
    first_byte: float | None = None
    area_first: float | None = None  # the backend's in-flight integral at the first byte
    ended: float = 0.0
    error: str | None = None  # the upstream error that ended the request, if any
    client_gone: bool = False
    slow_client: bool = False  # the client could not take the body as fast as it came
    usage: Usage | None = None
    # every failed upstream attempt (pool, backend, kind) and every retry (pool left, kind)
    failures: list[tuple[str, str, str]] = field(default_factory=list)
    retries: list[tuple[str, str]] = field(default_factory=list)
