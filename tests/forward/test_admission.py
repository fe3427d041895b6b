"""What the router's queue holds a request on (``router.forward.admission``): the engine's
measured latency against the relaxed SLO (``Strain``) and the engines' capacity being steady.
Plain objects on a hand-moved clock: no socket."""

from __future__ import annotations

import pytest

from router.account.outcome import Outcome
from router.forward.admission import Admission, Strain
from router.upstream.stream import Usage

URL = "http://e1"
# the router's SLO: 1 s TTFT, 25 ms TPOT; relaxed 3 s and 50 ms
SLO = (1.0, 0.025)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ended(
    clock: Clock, ttft: float, tpot: float, tokens: int = 11, url: str = URL, **fields: object
) -> Outcome:
    """A stream that began ``ttft + (tokens - 1) * tpot`` ago and ended now on ``url``."""
    out = Outcome("/v1/chat/completions", clock.now - ttft - (tokens - 1) * tpot, stream=True)
    out.attempt("speculative", url, "overflow")
    out.answered(200)
    out.first_bytes(out.started + ttft, 0.0)
    out.counted(Usage(10, tokens))
    out.finish(clock.now)
    for name, value in fields.items():
        setattr(out, name, value)
    return out


def strain_of(*outcomes: Outcome, clock: Clock) -> Strain:
    strain = Strain(*SLO, clock)
    for out in outcomes:
        strain.observe(out)
    return strain


def test_an_engine_is_strained_once_half_its_recent_requests_missed_the_relaxed_slo() -> None:
    clock = Clock()
    fine = [ended(clock, 0.5, 0.02) for _ in range(3)]
    late = [ended(clock, 3.5, 0.02) for _ in range(3)]  # TTFT past 3 s
    slow = [ended(clock, 0.5, 0.06) for _ in range(3)]  # TPOT past 50 ms
    assert not strain_of(*fine, clock=clock).strained(URL)
    assert strain_of(*late, clock=clock).strained(URL)
    assert strain_of(*slow, clock=clock).strained(URL)
    assert strain_of(*fine, *late, clock=clock).strained(URL)  # half
    assert not strain_of(*fine, *late[:2], clock=clock).strained(URL)  # 2 of 5
    assert not strain_of(*fine, *late[:1], clock=clock).strained(URL)
    # past the strict SLO but within the relaxed one: fine
    assert not strain_of(*[ended(clock, 2.0, 0.04) for _ in range(4)], clock=clock).strained(URL)


def test_too_few_requests_or_old_ones_say_nothing() -> None:
    clock = Clock()
    strain = strain_of(ended(clock, 9.0, 0.1), clock=clock)
    assert not strain.strained(URL)  # one judged: not enough
    strain.observe(ended(clock, 9.0, 0.1))
    assert strain.strained(URL)
    assert not strain.strained("http://other")  # nothing measured there
    clock.now += 2 * 3.0  # one half-life (2 relaxed TTFTs): 1 judged left
    assert not strain.strained(URL)
    assert strain.status()[URL] == {"judged": 1.0, "missed_share": 1.0, "strained": False}
    strain.forget(URL)
    assert strain.status() == {}


def test_what_says_nothing_of_the_engines_latency_is_not_judged() -> None:
    clock = Clock()
    # a queued request's TTFT counts its wait in the router's queue: only its TPOT is judged
    queued = [ended(clock, 9.0, 0.02, was_queued=True) for _ in range(4)]
    assert not strain_of(*queued, clock=clock).strained(URL)
    assert strain_of(*[ended(clock, 9.0, 0.09, was_queued=True) for _ in range(4)],
                     clock=clock).strained(URL)  # fmt: skip
    ignored = [
        ended(clock, 9.0, 0.1, status=503),
        ended(clock, 9.0, 0.1, error="reset"),
        ended(clock, 9.0, 0.1, client_gone=True),
        ended(clock, 9.0, 0.1, stream=False),
    ]
    strain = strain_of(*ignored, clock=clock)
    assert strain.status() == {} and not strain.strained(URL)


def test_the_queue_holds_only_under_measured_overload_with_capacity_steady() -> None:
    clock = Clock()
    strain = strain_of(*[ended(clock, 9.0, 0.1) for _ in range(3)], clock=clock)
    steady = [True]
    meter: list[tuple[str, int]] = []
    admission = Admission(4, lambda kind, n: meter.append((kind, n)), strain, lambda: steady[0])
    assert admission.holds(URL)
    assert not admission.holds("http://fine")  # its latency is fine (unmeasured)
    steady[0] = False  # an engine loading, draining or switching
    assert not admission.holds(URL)
    assert not admission.still_holds(URL)
    assert (admission.sent_fine, admission.sent_changing) == (1, 1)  # still_holds counts none
    assert meter == [("sent_fine", 1), ("sent_changing", 1)]
    doc = admission.status()
    assert doc["sent_fine"] == 1 and doc["sent_changing"] == 1 and doc["steady"] is False
    assert doc["engines"][URL]["strained"] is True and doc["timeout_s"] is None
    # off: nothing is held, nothing counted
    off = Admission(0, None, strain, lambda: True)
    assert not off.holds(URL) and off.sent_fine == off.sent_changing == 0


def test_requests_in_flight_past_the_relaxed_ttft_count_before_they_end() -> None:
    clock = Clock()

    def waiting(age: float, **fields: object) -> Outcome:
        out = Outcome("/v1/chat/completions", clock.now - age, stream=True)
        for name, value in fields.items():
            setattr(out, name, value)
        return out

    flights: dict[str, dict[object, object]] = {URL: {}}
    strain = Strain(*SLO, clock, flights)
    lot = flights[URL]
    for i in range(3):
        lot[i] = waiting(2.0)  # within the relaxed TTFT (3 s) so far: not judged
    lot["queued"] = waiting(9.0, was_queued=True)  # its age counts its wait in the queue
    lot["whole"] = waiting(9.0, stream=False)  # its first byte is its whole answer
    lot["lease"] = object()  # a request of another policy (no Outcome)
    assert not strain.strained(URL) and strain.status() == {}
    clock.now += 1.5  # the three are now 3.5 s without a first byte: three known misses
    assert strain.strained(URL)
    assert strain.status()[URL] == {"judged": 3.0, "missed_share": 1.0, "strained": True}
    # one of them gets its first byte: two late, beside three that ended fine: not strained
    first = lot[0]
    assert isinstance(first, Outcome)
    first.first_bytes(clock.now, 0.0)
    for _ in range(3):
        strain.observe(ended(clock, 0.5, 0.02))
    clock.now += 1.0  # (past the moment a verdict is kept)
    assert strain.counts(URL) == pytest.approx((3 * 0.5 ** (1 / 6) + 2, 2))
    assert not strain.strained(URL)
