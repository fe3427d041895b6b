"""Injected faults: a small spec language shared by the ``x-sim-fault`` header and
``POST /sim/config``.

A spec is ``none`` or a comma-separated list of ``key[=value]``:

==========================  =============================================================
``status=CODE``             answer CODE (400-599, e.g. 429, 500, 503) in the OpenAI error
                            shape at once, without running the request
``hang_before_headers[=S]`` send nothing for S seconds (wall clock), then serve normally;
                            without S, never answer (until the client goes away)
``hang_after=N``            stream N tokens, then keep the connection open and silent
``reset_after=N``           stream N tokens, then reset the TCP connection (RST)
``hold_after=N``            generate N tokens, then none (the request staying in the
                            batch, running; the connection open and silent) until
                            ``POST /sim/config {"release": true}``; then the rest, to the
                            end. A client that leaves meanwhile is aborted as usual. A test
                            holds a request running for as long as it needs, whatever the
                            host's speed.
``close``                   reset the connection before answering (refuse the request)
``p=P``                     apply the fault to each request with probability P (default 1)
==========================  =============================================================

For a non-streamed request ``hang_after`` and ``reset_after`` act before the headers, once
N tokens are generated. A request whose ``hang_after`` or ``reset_after`` fires stops counting
as running at once; one at its ``hold_after`` counts as running until released.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


class FaultSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    status: int | None = None
    hang_before_headers: float | None = None  # seconds; inf = forever
    hang_after: int | None = None
    reset_after: int | None = None
    hold_after: int | None = None
    close: bool = False
    probability: float = 1.0
    spec: str = "none"

    @property
    def is_none(self) -> bool:
        return self.spec == "none"

    def fires(self, rng: random.Random) -> bool:
        return not self.is_none and (self.probability >= 1 or rng.random() < self.probability)


NO_FAULT = Fault()


def _count(key: str, value: str | None) -> int:
    try:
        n = int(value or "")
    except ValueError:
        raise FaultSpecError(f"{key} needs a token count, e.g. {key}=10") from None
    if n < 0:
        raise FaultSpecError(f"{key} must be >= 0")
    return n


def parse_fault(spec: str | None) -> Fault:
    """Parse a fault spec (see the module docstring); ``None`` or ``""`` means no fault."""
    text = (spec or "").strip()
    if text.lower() in ("", "none"):
        return NO_FAULT
    fields: dict[str, object] = {}
    for item in text.split(","):
        key, _, value = item.strip().partition("=")
        key, val = key.strip().lower(), value.strip() or None
        if key == "status":
            try:
                code = int(val or "")
            except ValueError:
                raise FaultSpecError("status needs a code, e.g. status=503") from None
            if not 400 <= code <= 599:
                raise FaultSpecError("status must be a 4xx or 5xx code")
            fields["status"] = code
        elif key == "hang_before_headers":
            try:
                seconds = math.inf if val is None else float(val)
            except ValueError:
                raise FaultSpecError("hang_before_headers takes seconds") from None
            if seconds < 0:
                raise FaultSpecError("hang_before_headers must be >= 0")
            fields["hang_before_headers"] = seconds
        elif key in ("hang_after", "reset_after", "hold_after"):
            fields[key] = _count(key, val)
        elif key == "close":
            if val is not None:
                raise FaultSpecError("close takes no value")
            fields["close"] = True
        elif key == "p":
            try:
                p = float(val or "")
            except ValueError:
                raise FaultSpecError("p needs a probability, e.g. p=0.5") from None
            if not 0 <= p <= 1:
                raise FaultSpecError("p must be between 0 and 1")
            fields["probability"] = p
        else:
            raise FaultSpecError(f"unknown fault {key!r}")
    kinds = ("status", "hang_before_headers", "close", "hang_after", "reset_after", "hold_after")
    actions = [k for k in kinds if k in fields]
    if len(actions) != 1:
        raise FaultSpecError(f"a fault spec needs exactly one action, got {actions or 'none'}")
    return Fault(spec=text, **fields)  # type: ignore[arg-type]
