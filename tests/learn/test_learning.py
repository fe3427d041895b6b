"""The online learner against the simulated engines' analytic curves (no sockets)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from router.decide import table as tables
from router.decide.table import Point, PoolCurve, Prefill, Table, Workload, fit_points
from router.learn.learner import Held, LearnConfig, Learner, marginal_gain
from router.pools import Pool
from router.sim.model import BASELINE, EAGLE3, PRESETS, Preset, closed_loop, crossover
from tests.support.tables import model_table

PROMPT, OUTPUT = 1024, 2048


def spt(preset: Preset, n: int, tau: float | None = None) -> float:
    point = closed_loop(preset, n, PROMPT, OUTPUT, tau=tau)
    return 1.0 / point.per_request_tps


def feed(
    learner: Learner, pool: Pool, levels: range, tau: float | None = None, rounds: int = 5
) -> None:
    preset = EAGLE3 if pool == "speculative" else BASELINE
    for _ in range(rounds):
        for n in levels:
            learner.record(pool, float(n), spt(preset, n, tau), 0.1, 10.0)


def analytic(tau: float | None = None) -> float:
    fast = EAGLE3 if tau is None else EAGLE3.replace(tau=tau)
    value = crossover(fast, BASELINE, PROMPT, OUTPUT)
    assert value is not None
    return value


def test_learns_the_crossover_from_served_requests() -> None:
    learner = Learner(LearnConfig(min_samples=10), None)
    learner.observe_accept(2.8)
    feed(learner, "speculative", range(1, 9))
    feed(learner, "baseline", range(4, 33))
    target = learner.target()
    assert target is not None and not target.no_crossover
    assert abs(target.value - analytic()) <= 1


def test_acceptance_collapse_moves_the_target_before_any_slow_request() -> None:
    learner = Learner(LearnConfig(min_samples=10), None)
    learner.observe_accept(2.8)
    feed(learner, "speculative", range(1, 9))
    feed(learner, "baseline", range(4, 33))
    before = learner.target()
    learner.observe_accept(2.2)
    after = learner.target()
    assert before is not None and after is not None
    assert abs(after.value - analytic(2.2)) <= 1 and after.value < before.value
    learner.observe_accept(2.8)
    assert learner.target() == before


def test_moves_are_bounded_and_need_samples() -> None:
    learner = Learner(LearnConfig(min_samples=50, max_step=1), None)
    learner.observe_accept(2.8)
    feed(learner, "speculative", range(1, 9), rounds=1)
    feed(learner, "baseline", range(4, 33), rounds=1)
    assert learner.step(Held(20), tau_changed=False) is None  # too few speculative samples
    assert learner.step(Held(20), tau_changed=True) == Held(19)  # acceptance news: one step
    feed(learner, "speculative", range(1, 9), rounds=10)
    assert learner.step(Held(20), tau_changed=False) is None  # baseline: 29 of 50 samples
    feed(learner, "baseline", range(4, 33), rounds=1)
    assert learner.step(Held(20), tau_changed=False) == Held(19)


def test_calibrated_prior_gives_a_slope_to_a_pool_seen_at_one_concurrency() -> None:
    def points(preset: Preset, levels: list[int]) -> tuple[Point, ...]:
        return tuple(
            Point(n, 1 / spt(preset, n), 0.1, 0.2, 10.0, n / spt(preset, n), 20) for n in levels
        )

    levels = [1, 2, 4, 8, 16, 32]
    spec_points, base_points = points(EAGLE3, levels), points(BASELINE, levels)
    table = Table(
        crossover=7,
        source="calibrated",
        speculative=PoolCurve(spec_points, fit_points(spec_points, tau=2.8)),
        baseline=PoolCurve(base_points, fit_points(base_points)),
    )
    learner = Learner(LearnConfig(), table)
    assert learner.ref_tau == 2.8
    target = learner.target()
    assert target is not None and abs(target.value - analytic()) <= 1
    # a quiet period: every speculative sample at concurrency 1 keeps the slope from the prior
    for _ in range(300):
        learner.record("speculative", 1.0, spt(EAGLE3, 1), 0.1, 10.0)
    assert learner.target() == target


def test_gain_prefers_the_split_that_maximises_total_speed() -> None:
    # decode-only presets: 4 users are best split 2 + 2 (issue numbers: 56.8 tok/s mean)
    learner = Learner(LearnConfig(), None)
    learner.observe_accept(2.8)
    for n in range(1, 40):
        learner.record("speculative", float(n), (27.27e-3 + 7.341e-3 * n) / 2.8, 0.0, 1.0)
        learner.record("baseline", float(n), 18.71e-3 + 1.294e-3 * n, 0.0, 1.0)
    gain = marginal_gain(learner.curves())
    assert gain is not None
    loads: dict[Pool, int] = {"speculative": 0, "baseline": 0}
    for _ in range(4):
        pool = max(loads, key=lambda p: gain(p, loads[p]))
        loads[pool] += 1
    assert loads == {"speculative": 2, "baseline": 2}


@pytest.mark.parametrize("bad", [float("nan"), -1.0, 0.0])
def test_bad_samples_are_ignored(bad: float) -> None:
    learner = Learner(LearnConfig(), None)
    learner.record("speculative", 2.0, bad, 0.0, 1.0)
    assert learner.pools["speculative"].samples == 0


def test_curve_interpolates_and_never_extrapolates_downhill() -> None:
    from router.learn.learner import Curve

    c = Curve((1.0, 3.0), (0.030, 0.050), tau=2.0)
    assert c.spi(0.5) == 0.030 and abs(c.spi(2.0) - 0.040) < 1e-12
    assert abs(c.spi(5.0) - 0.070) < 1e-12  # the last slope carries on
    assert abs(c.spt(1.0) - 0.015) < 1e-12
    noisy = Curve((1.0, 2.0), (0.050, 0.040))
    assert noisy.spi(10.0) == 0.040  # flat, not cheaper and cheaper


def test_a_table_without_an_acceptance_length_is_rescaled_by_the_first_reading() -> None:
    levels = [1, 2, 4, 8, 16, 32]
    spec = tuple(
        Point(n, 1 / spt(EAGLE3, n), 0.1, 0.2, 10.0, n / spt(EAGLE3, n), 20) for n in levels
    )
    base = tuple(
        Point(n, 1 / spt(BASELINE, n), 0.1, 0.2, 10.0, n / spt(BASELINE, n), 20) for n in levels
    )

    def learner(tau: float, first: float | None = None) -> Learner:
        table = Table(
            crossover=8, source="calibrated", measured_at="2026-12-04T00:00:00Z",
            workload=Workload(PROMPT, OUTPUT),
            speculative=PoolCurve(spec, fit_points(spec, tau=tau)),
            baseline=PoolCurve(base, fit_points(base)),
        )  # fmt: skip
        out = Learner(LearnConfig(), table)
        if first is not None:
            out.observe_accept(first)
        out.observe_accept(EAGLE3.tau)
        return out

    # a table that says 1.0 (the engine reported no acceptance to calibrate) against one that
    # says 2.8, then the engine reports 2.8: the same speeds, not 2.8x faster; a reading of
    # 1.0 before it (no speculation seen yet) is not taken for the reference
    early = learner(1.0, first=1.0)
    known, unknown, late = learner(EAGLE3.tau).curves(), learner(1.0).curves(), early.curves()
    assert known is not None and unknown is not None and late is not None
    for n in levels:
        assert unknown["speculative"].spt(n) == pytest.approx(known["speculative"].spt(n))
        assert unknown["speculative"].spt(n) == pytest.approx(spt(EAGLE3, n))
        assert late["speculative"].spt(n) == pytest.approx(spt(EAGLE3, n))
    # the table it writes back carries the reference: read again, nothing is rescaled twice
    saved = early.table(Held(8), "learned", "2026-12-04T00:00:00Z")
    again = Learner(LearnConfig(), saved)
    again.observe_accept(EAGLE3.tau)
    curves = again.curves()
    assert curves is not None
    for n in levels:
        assert curves["speculative"].spt(n) == pytest.approx(spt(EAGLE3, n), rel=0.01)


def test_the_learned_table_keeps_what_serving_does_not_measure() -> None:
    """The table the router serves and persists (``GET /router/table``, ``TABLE_PATH``) is the
    learned one: it keeps the calibrated prefill line, caps and acceptance at temperature 1,
    which no served request measures, so a restart from it still has them."""
    base = model_table(32, 64)
    fit = base.speculative.fit
    assert fit is not None
    table = replace(
        base,
        speculative=replace(
            base.speculative,
            fit=replace(fit, tau_sampling=2.0),
            cap=48,
            prefill=Prefill(0.03, 0.0004),
        ),  # fmt: skip
        baseline=replace(base.baseline, cap=256, prefill=Prefill(0.02, 0.0003)),
    )
    learner = Learner(LearnConfig(), table)
    for _ in range(30):
        learner.record("speculative", 3.0, 0.03, 0.2, 3.0)
    learned = learner.table(Held(4), "learned", "now")
    assert (learned.speculative.cap, learned.baseline.cap) == (48, 256)
    assert learned.speculative.prefill == Prefill(0.03, 0.0004)
    assert learned.baseline.prefill == Prefill(0.02, 0.0003)
    assert learned.speculative.fit is not None and learned.speculative.fit.tau_sampling == 2.0


def test_the_target_is_never_a_crossing_of_curves_extended_past_what_was_measured() -> None:
    # the seed pair crosses near 7; with the speculative pool seen only up to 5 nothing
    # measured says where: "none up to 5", not the extended curves' crossing
    learner = Learner(LearnConfig(min_samples=10), None)
    learner.observe_accept(2.8)
    feed(learner, "speculative", range(1, 6))
    feed(learner, "baseline", range(1, 33))
    assert learner.measured_up_to() == 5
    assert learner.target() == Held(5, no_crossover=True)
    found = learner.crossing()
    assert found is not None and found.crossover is None and found.margin is not None
    assert found.margin > 1.0 and "no crossover measured up to 5" in found.reason
    # once it is seen at 8 too, the crossing is inside what was measured
    feed(learner, "speculative", range(6, 9))
    target = learner.target()
    assert target is not None and not target.no_crossover
    assert abs(target.value - analytic()) <= 1


def test_a_chain_table_stays_without_a_crossover_and_is_written_back_so() -> None:
    table = model_table(1024, 256, levels=[1, 2, 4, 8, 16, 32], spec_preset=PRESETS["eagle3-chain"])
    assert table.crossover is None and table.measured_up_to == 32
    learner = Learner(LearnConfig(min_samples=10), table)
    learner.observe_accept(PRESETS["eagle3-chain"].tau)
    assert learner.target() == Held(32, no_crossover=True)
    # a step from a crossover of 7 turns it into "none" at once, moving one request a step
    assert learner.step(Held(7), tau_changed=True) == Held(8, no_crossover=True)
    saved = learner.table(Held(32, no_crossover=True), "learned", "now")
    assert saved.crossover is None and saved.measured_up_to == 32 and saved.limit == 32
    # (the learned curve's margin: the calibrated one, as nothing was served since)
    assert saved.margin == pytest.approx(table.margin, rel=1e-3) and "learned" in saved.reason
    assert saved.margin is not None and saved.margin > 1.1
    assert tables.from_json(tables.to_json(saved)) == saved
