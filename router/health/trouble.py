"""When to tell the operator that a backend cannot be reached, and in what words. Pure.

The health state machine keeps a backend that never answered ``starting`` for up to
``STARTUP_GRACE`` (15 minutes by default: a large model takes that long to load), and one that
went down ``unhealthy`` until it answers again, with one log line at the change. Neither says
why it stays so, and a wrong port, an unknown host or a URL with a path look exactly like an
engine still loading. So every failed probe is folded in here as well: a backend that fails
``WARN_AFTER`` probes in a row gets a warning naming the cause it shows (the host does not
resolve, nothing accepts the connection, the health path answers 404, or it answers but not
healthy) and what to check, and again at most every ``WARN_EVERY`` while it stays so, or at
once when the cause changes. The poller logs the warning and keeps it in the notices
(``router.health.notices``) until a probe succeeds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal
from urllib.parse import urlsplit

# A backend failing this many probes in a row is worth a line: more than the refused
# connections of an engine's restart, few enough (10 s at HEALTH_INTERVAL 2 s) that a typo
# shows at once on a terminal.
WARN_AFTER = 5
# ... and while it stays so, a line this often at most: a backend still loading after ten
# minutes is news every five, not every probe.
WARN_EVERY = 300.0

# What a failed probe showed.
Cause = Literal["unresolved", "refused", "not_found", "failing"]


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed probe: its cause, the probe's own words, and the path it asked for."""

    cause: Cause
    detail: str
    path: str = "/health"


@dataclass(frozen=True, slots=True)
class Trouble:
    """A backend failing since ``since`` (its first failed probe in a row)."""

    cause: Cause
    since: float
    probes: int = 1  # failed probes in a row
    warned: float | None = None  # when it was last warned about


def after_probe(
    trouble: Trouble | None,
    failure: Failure | None,
    now: float,
    warn_after: int = WARN_AFTER,
    warn_every: float = WARN_EVERY,
) -> tuple[Trouble | None, bool]:
    """Fold one probe into the backend's trouble; whether to warn now. A good probe ends it."""
    if failure is None:
        return None, False
    if trouble is None:
        trouble = Trouble(failure.cause, now)
    elif trouble.cause != failure.cause:  # a new cause is news: warned anew
        trouble = Trouble(failure.cause, trouble.since, trouble.probes + 1)
    else:
        trouble = replace(trouble, probes=trouble.probes + 1)
    if trouble.probes < warn_after:
        return trouble, False
    if trouble.warned is not None and now - trouble.warned < warn_every:
        return trouble, False
    return replace(trouble, warned=now), True


def warning(url: str, failure: Failure, for_s: float) -> str:
    """What the log and /router/status say about a backend that keeps failing: the cause it
    shows and what to check."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    prefix = parts.path.rstrip("/")
    head = f"backend {url} has failed every health probe for {for_s:.0f} s"
    if failure.cause == "unresolved":
        return (
            f"{head}: its host {host!r} does not resolve ({failure.detail}); check the name "
            "for a typo, and that this machine's DNS knows it (in Kubernetes: the Service's "
            "name, and its namespace when it is another one)"
        )
    if failure.cause == "refused":
        return (
            f"{head}: {failure.detail}; nothing accepts connections on {host}:{port}: a wrong "
            "host or port, or an engine that is still loading (SGLang opens its port only once "
            "the model is loaded)"
        )
    if failure.cause == "not_found":
        where = (
            f"the URL's path {prefix} is put before every path the router asks for: is the "
            "engine served under it?"
            if prefix
            else "is it an inference engine? SGLang, vLLM and llama.cpp all answer GET /health"
        )
        return f"{head}: GET {prefix}{failure.path} answers 404 (HTTP Not Found); {where}"
    return (
        f"{head}: {failure.detail}; the engine answers but is not healthy (503 while it loads "
        "or warms up; see its own log)"
    )
