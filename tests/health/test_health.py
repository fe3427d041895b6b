"""The backend health state machine, driven with explicit times."""

from __future__ import annotations

from router.health.state import (
    BackendHealth,
    HealthConfig,
    State,
    eject,
    probe,
    served,
    usable,
    weight,
)

CFG = HealthConfig(
    startup_grace=100.0, fall=3, rise=2, eject_base=1.0, eject_max=8.0, ramp_seconds=10.0
)


def test_starting_until_first_success_within_grace() -> None:
    h = BackendHealth(since=0.0)
    for t in range(1, 50):
        h = probe(h, False, float(t), CFG, "connection refused")
        assert h.state is State.STARTING and not usable(h, float(t))
    h = probe(h, True, 50.0, CFG)
    assert h.state is State.HEALTHY and usable(h, 50.0)


def test_starting_becomes_unhealthy_after_grace() -> None:
    h = probe(BackendHealth(since=0.0), False, 100.0, CFG, "HTTP 503")
    assert h.state is State.UNHEALTHY
    assert h.last_error == "HTTP 503"


def test_fall_and_rise_need_consecutive_probes() -> None:
    h = probe(BackendHealth(since=0.0), True, 1.0, CFG)
    h = probe(h, False, 2.0, CFG)
    h = probe(h, False, 3.0, CFG)
    assert h.state is State.HEALTHY
    h = probe(h, False, 4.0, CFG)
    assert h.state is State.UNHEALTHY and not usable(h, 4.0)
    h = probe(h, True, 5.0, CFG)
    assert h.state is State.UNHEALTHY
    h = probe(h, True, 6.0, CFG)
    assert h.state is State.HEALTHY and h.ramp_from == 6.0


def test_flapping_backend_does_not_flip_on_every_probe() -> None:
    h = probe(BackendHealth(since=0.0), True, 0.0, CFG)
    states = []
    for t in range(1, 41):
        h = probe(h, t % 2 == 0, float(t), CFG, "flap")
        states.append(h.state)
    assert set(states) == {State.HEALTHY}


def test_unhealthy_backend_is_kept_and_polled_forever() -> None:
    h = BackendHealth(since=0.0, state=State.UNHEALTHY)
    for t in range(1, 1000):
        h = probe(h, False, float(t), CFG)
    assert h.state is State.UNHEALTHY and h.checks == 999
    h = probe(probe(h, True, 1000.0, CFG), True, 1001.0, CFG)
    assert h.state is State.HEALTHY


def test_ejection_backoff_doubles_caps_and_resets_after_serving() -> None:
    """Checklist case 16: ejection time grows with repeated ejections, capped."""
    h = probe(BackendHealth(since=0.0), True, 0.0, CFG)
    h = eject(h, 10.0, CFG, "reset")
    assert h.ejected_until == 11.0 and not usable(h, 10.5) and usable(h, 11.0)
    # a second failure during the same ejection counts once
    assert eject(h, 10.5, CFG, "reset") == h
    h = eject(h, 11.0, CFG, "reset")
    assert h.ejected_until == 13.0
    h = eject(h, 13.0, CFG, "reset")
    h = eject(h, 17.0, CFG, "reset")
    h = eject(h, 25.0, CFG, "reset")
    assert h.ejected_until == 33.0  # capped at eject_max = 8
    h = served(h, 33.0)
    assert h.ejections == 0
    assert eject(h, 40.0, CFG, "reset").ejected_until == 41.0


def test_recovered_backend_is_ramped_in() -> None:
    """Checklist case 18: a recovered backend is ramped in from 10% (slow start)."""
    h = probe(BackendHealth(since=0.0), True, 0.0, CFG)
    assert weight(h, 0.0, CFG) == 0.1
    assert abs(weight(h, 5.0, CFG) - 0.5) < 1e-9
    assert weight(h, 10.0, CFG) == 1.0
    h = eject(h, 20.0, CFG, "reset")
    assert weight(h, 21.0, CFG) == 0.1  # ejection ended at 21: ramp starts there
    assert weight(h, 26.0, CFG) == 0.5


def test_probes_are_jittered_within_20_percent() -> None:
    """Checklist case 16 (Envoy's interval_jitter): replicas must not probe in lock-step."""
    import random

    from router.health.poller import probe_delay

    rng = random.Random(16)
    delays = [probe_delay(2.0, rng) for _ in range(1000)]
    assert all(1.6 <= d <= 2.4 for d in delays)
    assert max(delays) - min(delays) > 0.6  # spread over the band, not one value
