"""What the default policy optimizes, judged per finished request: was it within the SLO?

The ``slo`` policy routes for the share of requests within their SLO (``SLO_TTFT_MS``,
``SLO_TPOT_MS``, or the request's own ``x-slo-*`` headers), at a strict tier and a relaxed one
(3x TTFT, 2x TPOT: ``router.decide.capacity``). The metrics and the live page count the same share
over what the router served, judged as ``spec-router replay`` judges its requests
(``router.tools.goodput``), from the instants the proxy records:

* judged: a stream the router routed, or refused for want of a backend or room (503, 429);
  a failure (an upstream error, a 5xx, the router's own refusal) counts as a miss;
* not judged: a non-streamed request (its first byte is the whole answer: there is no TTFT to
  compare), a request whose client left (its end is the client's doing), a client error (a 4xx
  other than 429, 408 included: the request was wrong or slow to come, not the service slow);
* TTFT: the first response byte after arrival; TPOT: the time after it over the output tokens
  after the first (the engine's usage); one output token, or no usage, judges on TTFT alone.

Pure: a function of the ``Outcome``, called by each observer that counts it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from router.decide.capacity import RELAXED_TPOT, RELAXED_TTFT

if TYPE_CHECKING:
    from router.account.outcome import Outcome

TIERS = ("strict", "relaxed")
# a 4xx that judges the service, not the request: a miss
_SERVICE_REFUSALS = (429,)


class Attained(NamedTuple):
    strict: bool
    relaxed: bool


MISSED = Attained(False, False)


def within_slo(out: Outcome, slo_ttft: float, slo_tpot: float) -> Attained | None:
    """Whether ``out`` was within its SLO (the request's own, else ``slo_ttft``/``slo_tpot``,
    seconds), strict and relaxed; None when it is not judged (see the module docstring)."""
    if not out.stream or out.client_gone:
        return None
    status = out.status
    if 400 <= status < 500 and status not in _SERVICE_REFUSALS:
        return None
    if out.pool is None or status >= 400 or out.error is not None or status == 0:
        return MISSED
    first = out.first_byte
    if first is None:
        return MISSED
    request = out.request
    if request is not None:
        slo_ttft, slo_tpot = request.slo_ttft, request.slo_tpot
    ttft = first - out.started
    usage = out.usage
    tpot = None
    if usage is not None and usage.completion_tokens > 1:
        tpot = (out.ended - first) / (usage.completion_tokens - 1)
    strict = ttft <= slo_ttft and (tpot is None or tpot <= slo_tpot)
    relaxed = ttft <= slo_ttft * RELAXED_TTFT and (tpot is None or tpot <= slo_tpot * RELAXED_TPOT)
    return Attained(strict, relaxed)
