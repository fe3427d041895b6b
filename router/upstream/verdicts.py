"""What a failed or refused attempt means: eject the backend? retry elsewhere? what does the
client get? Pure functions over plain values; the proxy applies the answers.

The rules (``../shared/reliability-checklist.md`` cases 1-5, 15):
- Resending a request is safe only if the engine cannot have started on it: the connection was
  refused or timed out, or it closed before a single response byte. Those also take the backend
  out for a while (passive health).
- A 429 or 503 answer is a refusal: the engine did not take the request, so it may go elsewhere
  while nothing has reached the client. (Neither SGLang nor vLLM sends 429; both send 503 for
  a full queue.)
- Any 5xx answer counts as a failure of the backend, but only 502, 503 and 504 eject it: a
  500 is one request's error (vLLM 0.34: "a request-level error that does not mark the engine
  as unhealthy"; SGLang answers 500 for an exception in one request), and the engine goes on
  serving others. A dead engine shows in its health checks and refused connections.
- Once the response has started, nothing is retried; a broken body ejects the backend unless it
  was only silent for too long (``idle_timeout``: a slow engine, not a dead one).
"""

from __future__ import annotations

from typing import Literal, NamedTuple, get_args

from router.upstream.client import ErrorKind

RETRY_STATUSES = frozenset({429, 503})
EJECT_STATUSES = frozenset({502, 503, 504})
SAFE_KINDS: frozenset[ErrorKind] = frozenset({"connect", "connect_timeout"})
ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)
# Every 5xx counts as a failure; these are the ones engines and their proxies send, whose
# counters start at 0 (an unusual 5xx still gets its series when it first happens).
COUNTED_STATUSES = (500, 502, 503, 504)

# What the client is told when an attempt failed and is not retried.
Refusal = Literal["timeout", "bad_gateway", "no_backend"]


class Verdict(NamedTuple):
    kind: str  # the error kind or ``http_<status>``: the label of retries and failures
    failed: bool  # counts as an upstream error of the backend
    eject: bool  # take the backend out now (passive health)
    retry: bool  # safe, and worth sending the request to another backend
    served: bool  # a good answer: an earlier ejection's back-off starts over


def after_error(kind: ErrorKind, response_started: bool) -> Verdict:
    """An attempt that failed before its response headers arrived."""
    safe = kind in SAFE_KINDS or (kind == "reset" and not response_started)
    return Verdict(kind, failed=True, eject=safe, retry=safe, served=False)


def after_status(status: int) -> Verdict:
    """An attempt whose response headers arrived with ``status``."""
    return Verdict(
        f"http_{status}",
        failed=status >= 500,
        eject=status in EJECT_STATUSES,
        retry=status in RETRY_STATUSES,
        served=status < 400,
    )


def stream_refused(status: int | None) -> Verdict:
    """A stream answered 200 and then refused before its first event: SGLang 0.5.23 sends an
    error event with ``status`` (503 for a full queue), SGLang 0.5.3 closes the connection
    without any (``status`` None). Both engines send stream headers before the request is
    admitted (vLLM, SGLang 0.5.3) or with its first event, so a stream's answer begins with
    its first body byte: nothing was generated, and it is as safe to retry as a refusal."""
    if status is None:
        return after_error("reset", response_started=False)
    return after_status(status)


SLOW_KINDS: frozenset[ErrorKind] = frozenset(
    {"first_byte_timeout", "idle_timeout", "total_timeout"}
)
# Failures that say nothing of the engine's health: a timeout (a slow engine, not a dead one),
# or the router's own cut of a backend that left its pool (``drained``).
NOT_EJECTING: frozenset[ErrorKind] = SLOW_KINDS | {"drained"}


def mid_response(kind: ErrorKind) -> Verdict:
    """The body failed after the response started: never retried; a timeout or a drain's cut
    does not eject."""
    return Verdict(kind, failed=True, eject=kind not in NOT_EJECTING, retry=False, served=False)


def retry_kinds() -> tuple[str, ...]:
    """Every ``Verdict.kind`` that can be retried: the labels of the retry counter."""
    safe = tuple(kind for kind in ERROR_KINDS if after_error(kind, False).retry)
    return safe + tuple(f"http_{status}" for status in sorted(RETRY_STATUSES))


def failure_kinds() -> tuple[str, ...]:
    """The ``Verdict.kind`` of every failure known in advance: the upstream error labels."""
    return ERROR_KINDS + tuple(f"http_{status}" for status in COUNTED_STATUSES)


def refusal(kind: ErrorKind, retried_out: bool) -> Refusal:
    """The client's answer to a failed attempt that is not retried.

    ``retried_out``: the failure was safe to retry, but attempts or backends ran out.
    """
    if kind in ("first_byte_timeout", "total_timeout"):
        return "timeout"
    return "no_backend" if retried_out else "bad_gateway"
