"""The crossover's owner: where it starts, what it learns from, how it moves, pins and persists.

A real ``InflightTracker`` on a clock the test moves, a dict of ``EngineLoad`` as the poller
would leave it, tables from the simulated engines' analytic model; files only under tmp_path.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, cast

import pytest

from router.account.inflight import MATES, InflightTracker, PrefillLog
from router.account.outcome import Outcome
from router.decide import table as tables
from router.health.poller import EngineLoad
from router.learn.keeper import CrossoverKeeper
from router.learn.learner import Held
from router.pools import BASELINE, SPECULATIVE
from router.settings import DEFAULT_CROSSOVER, Settings
from router.sim.model import PRESETS
from router.upstream.stream import Usage
from tests.support.tables import model_table

S1, S2, B1 = "http://s1", "http://s2", "http://b1"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(
    table: tables.Table | None = None,
    loads: dict[str, EngineLoad] | None = None,
    clock: Clock | None = None,
    **settings: Any,
) -> CrossoverKeeper:
    clock = clock or Clock()
    tracker = InflightTracker([(SPECULATIVE, S1), (SPECULATIVE, S2), (BASELINE, B1)], clock)
    config = Settings(speculative_urls=[S1, S2], baseline_urls=[B1], **settings)
    return CrossoverKeeper(config, tracker, {} if loads is None else loads, table, clock)


def accepting(length: float | None) -> EngineLoad:
    return EngineLoad(0, 0, length, 0.0, 0, "sglang")


# -- where it starts -------------------------------------------------------------------------------


def test_an_explicit_crossover_wins_over_the_table_and_is_pinned() -> None:
    keeper = make(model_table(1024, 256, crossover=5), crossover=9)
    assert (keeper.crossover, keeper.source, keeper.pinned) == (9, "configured", True)
    assert keeper.status()["pinned"] is True


def test_a_table_gives_its_crossover_and_source_unpinned() -> None:
    keeper = make(model_table(1024, 256, crossover=5))
    assert (keeper.crossover, keeper.source, keeper.pinned) == (5, "calibrated", False)
    # the calibrated curves are there at once: the predictive policy has a gain to use
    assert keeper.gain is not None
    assert keeper.status()["reference_acceptance_length"] == 2.8


def test_without_either_the_default_crossover() -> None:
    keeper = make()
    assert (keeper.crossover, keeper.source, keeper.pinned) == (DEFAULT_CROSSOVER, "default", False)
    assert keeper.gain is None  # no curves yet: predictive decides as spillover does


# -- what it learns from ---------------------------------------------------------------------------


def streamed(keeper: CrossoverKeeper) -> Outcome:
    """A complete 200 stream on S1 with two requests in flight for its whole decode."""
    tracker = cast(InflightTracker, keeper.tracker)  # (the keeper reads it as its Counts)
    tracker.acquire(S1)
    tracker.acquire(S1)
    out = Outcome(path="/v1/chat/completions", started=0.0)
    out.read(stream=True)
    out.attempt(SPECULATIVE, S1, "below_crossover")
    out.answered(200)
    out.first_bytes(1.0, tracker.area(S1, 1.0))
    out.counted(Usage(prompt_tokens=7, completion_tokens=11))
    out.lease_ends(3.0, tracker.area(S1, 3.0))  # (what Proxy.release records)
    out.finish(3.0)
    return out


def test_a_complete_stream_becomes_one_sample() -> None:
    keeper = make()
    keeper.observe(streamed(keeper))
    learner = keeper.learner
    assert (learner.pools[SPECULATIVE].samples, learner.pools[BASELINE].samples) == (1, 0)
    (n, sample) = next(iter(learner.pools[SPECULATIVE].bins.items()))
    # mean concurrency 2 over the decode; 2 s for 10 tokens after the first
    assert n == 2
    assert sample.spi == pytest.approx(0.2)
    assert (sample.ttft, sample.e2e) == pytest.approx((1.0, 3.0))


def test_observed_later_it_uses_the_in_flight_integral_at_the_end() -> None:
    """Observers may run after the request ended (router.forward.ended): the concurrency over
    its decode is the integral ``Proxy.release`` recorded then, not the one at observation."""
    clock = Clock()
    keeper = make(clock=clock)
    out = streamed(keeper)
    tracker = cast(InflightTracker, keeper.tracker)
    clock.now = 3.0
    out.lease_ends(out.ended, tracker.area(S1, out.ended))  # (what Proxy.release records)
    clock.now = 3.1
    for _ in range(6):  # six more requests on S1 since it ended
        tracker.acquire(S1)
    clock.now = 3.25
    assert tracker.area(S1, out.ended) != pytest.approx(out.area_end)  # (the integral moved)
    keeper.observe(out)
    (n, sample) = next(iter(keeper.learner.pools[SPECULATIVE].bins.items()))
    assert n == 2 and sample.spi == pytest.approx(0.2)


@pytest.mark.parametrize(
    "change",
    [
        {"backend": None},
        {"pool": None},
        {"usage": None},
        {"first_byte": None},
        {"area_first": None},
        {"status": 500},
        {"status": 0},
        {"client_gone": True},
        {"error": "reset"},
        {"stream": False},
        {"usage": Usage(prompt_tokens=7, completion_tokens=1)},
        {"ended": 1.0},  # no decode time after the first byte
    ],
    ids=lambda change: ",".join(f"{k}={v}" for k, v in change.items()),
)
def test_only_complete_200_streams_of_two_tokens_or_more_are_learned(
    change: dict[str, Any],
) -> None:
    keeper = make()
    keeper.observe(dataclasses.replace(streamed(keeper), **change))
    assert [p.samples for p in keeper.learner.pools.values()] == [0, 0]


def test_a_samples_stalls_are_the_prefills_that_ran_while_it_decoded() -> None:
    """Prefills count against a request's decode when they ran during it (their first tokens
    came after its own, and not with it) — not when they were sent: a request queued in the
    engine, or sent before its first token and prefilled after its end, stalled nothing."""
    keeper = make()
    samples: list[Any] = []
    keeper.engines.record_curves = samples.append  # type: ignore[method-assign,assignment]
    tracker = cast(InflightTracker, keeper.tracker)  # (the keeper reads it as its Counts)
    out = streamed(keeper)  # first byte at 1.0, end at 3.0, 0.2 s per token
    out.prefill = 0.5
    tracker.prefilled(S1, 1.0, 0.5)  # its own
    tracker.prefilled(S1, 1.0 + MATES / 2, 0.5)  # prefilled with it, in the same iteration
    tracker.prefilled(S1, 2.0, 0.25)  # ran while it decoded
    tracker.prefilled(S1, 2.5, 0.125)  # ... and on another engine: not its stall
    tracker.prefilled(S1, 3.5, 1.0)  # after it ended (sent before, queued in the engine)
    tracker.prefilled(S2, 2.5, 4.0)
    keeper.observe(out)
    (sample,) = samples
    assert sample.stall == pytest.approx(0.375)


def test_a_prefill_log_answers_between_two_times_in_bounded_memory() -> None:
    log = PrefillLog(keep=4)
    assert log.between(0.0, 10.0) == 0.0
    for t in range(1, 21):
        log.add(float(t), 1.0)
    assert len(log.times) <= 8
    assert log.between(15.0, 20.0) == 5.0  # (15, 20]
    assert log.between(16.5, 17.5) == 1.0
    assert log.between(20.0, 30.0) == 0.0
    # from before what is kept: counted from the oldest entry kept, never more than happened
    assert 0.0 < log.between(0.0, 20.0) <= 20.0


def test_nothing_is_learned_with_learning_off() -> None:
    keeper = make(learn=False)
    keeper.observe(streamed(keeper))
    assert [p.samples for p in keeper.learner.pools.values()] == [0, 0]
    assert keeper.status()["enabled"] is False


# -- how it moves ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reported", "expected"),
    [
        ({S1: 2.0, S2: 3.0}, 2.5),
        # baseline engines and idle speculative ones (0: nothing speculated) do not count
        ({S1: 2.0, S2: 0.0, B1: 5.0}, 2.0),
        ({S1: 2.4, S2: None}, 2.4),
        ({S1: None, B1: 3.0}, None),
    ],
)
def test_acceptance_is_the_mean_the_speculative_engines_report(
    reported: dict[str, float | None], expected: float | None
) -> None:
    keeper = make(loads={url: accepting(v) for url, v in reported.items()})
    keeper.update()
    assert keeper.status()["acceptance_length"] == expected


@pytest.mark.parametrize("max_step", [1, 4])
def test_a_collapse_in_acceptance_walks_the_crossover_down_in_bounded_steps(
    max_step: int,
) -> None:
    # calibrated at acceptance 2.8 (target 7); the engine now reports 2.0 (target 2)
    keeper = make(
        model_table(1024, 256, crossover=30), loads={S1: accepting(2.0)}, learn_max_step=max_step
    )
    seen = [keeper.crossover]
    while (moved := keeper.update()) is not None:
        assert moved == keeper.crossover and keeper.source == "learned"
        seen.append(moved)
        assert len(seen) < 100
    assert keeper.learner.target() == Held(2) and seen[-1] == 2
    steps = [a - b for a, b in zip(seen, seen[1:], strict=False)]
    assert steps[0] == max_step and all(0 < s <= max_step for s in steps)


def test_acceptance_as_calibrated_and_too_few_samples_leave_it() -> None:
    keeper = make(model_table(1024, 256, crossover=30), loads={S1: accepting(2.8)})
    assert keeper.update() is None
    assert (keeper.crossover, keeper.source) == (30, "calibrated")


def test_a_pin_holds_against_learning() -> None:
    keeper = make(model_table(1024, 256, crossover=30), loads={S1: accepting(2.0)})
    keeper.pin(12)
    assert (keeper.crossover, keeper.source, keeper.pinned) == (12, "configured", True)
    for _ in range(5):
        assert keeper.update() is None
    assert keeper.crossover == 12
    assert keeper.status()["acceptance_length"] == 2.0  # still observed, just not acted on


def test_learning_off_never_moves_it() -> None:
    keeper = make(model_table(1024, 256, crossover=30), loads={S1: accepting(2.0)}, learn=False)
    assert keeper.update() is None and keeper.crossover == 30


# -- the operator's table, and persistence ---------------------------------------------------------


def test_a_new_table_replaces_the_crossover_lifts_a_pin_and_is_persisted(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    keeper = make(table_path=path)
    keeper.pin(40)
    table = keeper.replace(tables.to_json(model_table(1024, 256, crossover=12)))
    assert table.crossover == 12
    assert (keeper.crossover, keeper.source, keeper.pinned) == (12, "calibrated", False)
    assert keeper.gain is not None
    assert tables.load(path).crossover == 12


def test_a_refused_table_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    keeper = make(table_path=path)
    keeper.pin(40)
    learner = keeper.learner
    bad = tables.to_json(model_table(1024, 256, crossover=12)) | {"version": 99}
    with pytest.raises(tables.TableError, match="version"):
        keeper.replace(bad)
    assert (keeper.crossover, keeper.source, keeper.pinned) == (40, "configured", True)
    assert keeper.learner is learner and not path.exists()


def test_persist_writes_atomically_and_a_new_keeper_starts_from_it(tmp_path: Path) -> None:
    path = tmp_path / "state" / "t.json"
    keeper = make(model_table(1024, 256, crossover=30), loads={S1: accepting(2.0)}, table_path=path)
    keeper.update()
    keeper.observe(streamed(keeper))
    keeper.persist()
    assert [p.name for p in path.parent.iterdir()] == ["t.json"]  # no temporary file left
    saved = tables.load(path)
    assert (saved.crossover, saved.source) == (29, "learned")
    again = make(saved)
    assert (again.crossover, again.source, again.pinned) == (29, "learned", False)
    # the learned points survive: the sample at concurrency 2 is folded into that bin
    before = keeper.learner.pools[SPECULATIVE].bins[2].spi
    assert again.learner.pools[SPECULATIVE].bins[2].spi == pytest.approx(before)


def test_persist_without_a_path_or_to_an_unwritable_one_does_not_fail(tmp_path: Path) -> None:
    make().persist()  # no TABLE_PATH: nothing to do
    blocker = tmp_path / "file"
    blocker.write_text("")
    keeper = make(table_path=blocker / "t.json")  # its directory cannot be created
    keeper.persist()
    assert blocker.read_text() == ""


# -- TABLE_FRESH: a path it did not read a table from ----------------------------------------------


def on(pool: str, keeper: CrossoverKeeper) -> Outcome:
    """``streamed`` on a backend of ``pool``."""
    out = streamed(keeper)
    if pool == BASELINE:
        tracker = cast(InflightTracker, keeper.tracker)
        tracker.acquire(B1)
        out.attempt(BASELINE, B1, "above_crossover")
        out.first_bytes(1.0, tracker.area(B1, 1.0))
        out.area_first = tracker.area(B1, 1.0)
        out.lease_ends(out.ended, tracker.area(B1, out.ended))
    return out


def test_a_fresh_start_never_writes_the_default_table(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    keeper = make(table_path=path, table_fresh=True)
    keeper.update()
    keeper.persist()
    assert not path.exists() and not keeper.has_own_table()
    keeper.pin(9)  # an operator's crossover is not a table: still nothing to write
    keeper.persist()
    assert not path.exists()
    keeper.observe(on(SPECULATIVE, keeper))  # one pool learned: not yet
    keeper.persist()
    assert not path.exists()


def test_a_fresh_start_writes_once_both_pools_are_learned(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    keeper = make(table_path=path, table_fresh=True)
    keeper.observe(on(SPECULATIVE, keeper))
    keeper.observe(on(BASELINE, keeper))
    assert keeper.has_own_table()
    keeper.persist()
    saved = tables.load(path)
    assert saved.speculative.points and saved.baseline.points


def test_a_fresh_start_writes_a_put_table_at_once(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    keeper = make(table_path=path, table_fresh=True)
    keeper.replace(tables.to_json(model_table(1024, 256, crossover=12)))
    assert tables.load(path).crossover == 12


# -- no crossover measured ------------------------------------------------------------------------


def chain_table() -> tables.Table:
    return model_table(1024, 256, spec_preset=PRESETS["eagle3-chain"])


def test_a_table_without_a_crossover_holds_speculation_to_the_level_measured(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.json"
    keeper = make(chain_table(), loads={S1: accepting(2.79)}, table_path=path)
    assert (keeper.crossover, keeper.no_crossover, keeper.source) == (32, True, "calibrated")
    status = keeper.no_crossover_status(speculative_engines=2, baseline_engines=1)
    assert status is not None and status["measured_up_to"] == 32
    assert status["message"] == "no crossover measured up to 32"
    assert "3 speculative engines rather than 2 + 1" in status["advice"]
    assert status["margin"] > 1.1 and status["speculative_limit"] == 32
    assert keeper.status()["target"] is None
    assert keeper.status()["target_no_crossover_up_to"] == 32
    # learning from it never invents a crossover, and what it writes back says null
    for _ in range(3):
        assert keeper.update() is None
    keeper.persist()
    saved = tables.load(path)
    assert saved.crossover is None and saved.measured_up_to == 32 and saved.source == "calibrated"
    again = make(saved)
    assert (again.crossover, again.no_crossover) == (32, True)


def test_a_pin_or_a_table_with_a_crossover_ends_no_crossover() -> None:
    keeper = make(chain_table())
    keeper.pin(6)
    assert (keeper.crossover, keeper.no_crossover) == (6, False)
    assert keeper.no_crossover_status() is None
    keeper.replace(tables.to_json(chain_table()))
    assert (keeper.crossover, keeper.no_crossover, keeper.pinned) == (32, True, False)
    keeper.replace(tables.to_json(model_table(1024, 256, crossover=12)))
    assert (keeper.crossover, keeper.no_crossover) == (12, False)


# -- deferred samples (router.forward.ended) settle first ------------------------------------------


def deferring(keeper: CrossoverKeeper) -> list[Outcome]:
    """Outcomes queued for ``keeper`` as ``Ended`` queues them; its ``settle`` runs them."""
    queued: list[Outcome] = []

    def settle() -> None:
        while queued:
            keeper.observe(queued.pop(0))

    keeper.settle = settle
    return queued


def test_a_new_table_comes_after_the_samples_that_ended_before_it() -> None:
    """Review s12 finding 4: what ended before a PUT is learned by the table it ran under."""
    keeper = make()
    queued = deferring(keeper)
    queued.append(streamed(keeper))
    old = keeper.learner
    keeper.replace(tables.to_json(model_table(1024, 256, crossover=12)))
    assert old.pools[SPECULATIVE].samples == 1 and not queued
    assert keeper.learner.pools[SPECULATIVE].samples == 0


def test_persist_settles_before_it_decides_whether_the_table_is_its_own(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    keeper = make(table_path=path, table_fresh=True)
    queued = deferring(keeper)
    queued.append(on(SPECULATIVE, keeper))
    queued.append(on(BASELINE, keeper))
    keeper.persist()  # (at shutdown: the last samples make both pools learned)
    saved = tables.load(path)
    assert saved.speculative.points and saved.baseline.points


def test_without_the_integral_at_its_end_no_concurrency_sample_is_made() -> None:
    """Review s12 finding 6: an outcome observed without ``area_end`` (nothing recorded it when
    it ended) teaches no decode point: the integral now would extrapolate past its end."""
    keeper = make()
    out = streamed(keeper)
    out.area_end = None
    before = keeper.traffic.mean_output
    keeper.observe(out)
    assert keeper.learner.pools[SPECULATIVE].samples == 0
    assert keeper.traffic.mean_output != before  # (its lengths still count)
