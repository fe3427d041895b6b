"""The crossover table's verdict: a crossover where the points show one, else none up to the
highest level measured (never one extrapolated), and version 1 tables read as version 2."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from router.decide.table import (
    TABLE_VERSION,
    Point,
    PoolCurve,
    Table,
    TableError,
    Workload,
    crossing,
    fit_points,
    from_json,
    no_crossover_advice,
    to_json,
)
from router.sim.model import BASELINE, PRESETS, Preset, closed_loop
from tests.support.tables import model_points

LEVELS = [1, 2, 4, 6, 8, 12, 16, 24, 32]


def points(speeds: list[float], levels: list[int]) -> list[Point]:
    return [Point(n, s, 0.1, 0.2, 5.0, n * s, 16) for n, s in zip(levels, speeds, strict=True)]


def pair(spec: Preset, levels: list[int]) -> tuple[tuple[Point, ...], tuple[Point, ...]]:
    return model_points(spec, levels, 32, 256), model_points(BASELINE, levels, 32, 256)


def test_a_chain_pair_has_no_crossover_up_to_the_highest_level_measured() -> None:
    spec, base = pair(PRESETS["eagle3-chain"], LEVELS)
    found = crossing(spec, base)
    assert found.crossover is None and found.measured_up_to == 32 and found.limit == 32
    # the speculative pool is still ahead there: its speed over the baseline's at 32
    ratio = spec[-1].decode_tps_p50 / base[-1].decode_tps_p50
    assert found.margin is not None and found.margin > 1.2
    assert found.margin == pytest.approx(ratio, rel=1e-3)
    assert "no crossover measured up to 32" in found.reason


def test_the_seed_pair_crosses_inside_the_levels_and_the_margin_is_at_the_top() -> None:
    spec, base = pair(PRESETS["eagle3"], LEVELS)
    found = crossing(spec, base)
    assert found.crossover == 7 and found.limit == 7 and found.measured_up_to == 32
    assert found.margin is not None and found.margin < 1.0  # the baseline is ahead at 32


def test_a_crossover_one_past_the_levels_is_never_written() -> None:
    # the baseline catches up just past 8: nothing measured says so
    spec, base = points([80.0, 60.0, 40.0], [2, 4, 8]), points([50.0, 45.0, 39.0], [2, 4, 8])
    found = crossing(spec, base)
    assert (found.crossover, found.measured_up_to) == (None, 8)
    assert found.margin == pytest.approx(40.0 / 39.0, rel=1e-3)


def test_e2e_margin_is_the_baseline_time_over_the_speculative_time() -> None:
    spec = [Point(n, 80.0, 0.1, 0.2, 1.0, 0.0, 16) for n in (1, 4)]
    base = [Point(n, 50.0, 0.1, 0.2, 1.5, 0.0, 16) for n in (1, 4)]
    found = crossing(spec, base, "e2e")
    assert found.crossover is None and found.margin == pytest.approx(1.5)


def no_crossover_table() -> Table:
    spec, base = pair(PRESETS["eagle3-chain"], LEVELS)
    found = crossing(spec, base)
    return Table(
        crossover=None,
        source="calibrated",
        workload=Workload(32, 256),
        speculative=PoolCurve(spec, fit_points(spec, tau=2.79)),
        baseline=PoolCurve(base, fit_points(base)),
        measured_up_to=found.measured_up_to,
        margin=found.margin,
        reason=found.reason,
    )


def test_a_table_without_a_crossover_round_trips_as_null() -> None:
    table = no_crossover_table()
    doc = to_json(table)
    assert doc["crossover"] is None and doc["version"] == TABLE_VERSION == 2
    assert doc["measured_up_to"] == 32 and doc["margin"] > 1.2 and "up to 32" in doc["reason"]
    assert from_json(doc) == table
    assert table.limit == 32


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"measured_up_to": None}, "needs measured_up_to"),
        ({"measured_up_to": 0}, "measured_up_to must be a positive integer"),
        ({"margin": -1.0}, "margin must be positive"),
        ({"margin": "x"}, "margin must be a number"),
        ({"crossover": "7"}, "or null"),
    ],
)
def test_a_bad_verdict_is_refused_with_the_reason(change: dict[str, Any], message: str) -> None:
    doc = {**to_json(no_crossover_table()), **change}
    with pytest.raises(TableError, match=message):
        from_json(doc)


def version_one(table: Table, crossover: int) -> dict[str, Any]:
    """What version 1 wrote: an integer crossover and no verdict fields."""
    doc = to_json(replace(table, crossover=crossover))
    for key in ("measured_up_to", "margin", "reason"):
        del doc[key]
    doc["version"] = 1
    return doc


def test_a_version_one_crossover_one_past_the_levels_reads_as_none_measured() -> None:
    # version 1 wrote 33 for "the baseline never caught up up to 32" (issue 33)
    table = from_json(version_one(no_crossover_table(), 33))
    assert table.crossover is None and table.measured_up_to == 32 and table.limit == 32
    assert table.version == TABLE_VERSION and "version 1" in table.reason
    with pytest.raises(TableError, match="non-negative integer$"):  # version 1 had no null
        from_json({**version_one(no_crossover_table(), 33), "crossover": None})


def test_a_version_one_crossover_inside_the_levels_is_kept() -> None:
    spec, base = pair(PRESETS["eagle3"], LEVELS)
    table = Table(
        crossover=7,
        source="calibrated",
        speculative=PoolCurve(spec, fit_points(spec, tau=2.8)),
        baseline=PoolCurve(base, fit_points(base)),
        measured_up_to=32,
    )
    read = from_json(version_one(table, 7))
    assert (read.crossover, read.measured_up_to) == (7, 32)
    # a version 1 table without points (configured by hand) keeps its crossover too
    bare = from_json({"version": 1, "crossover": 40, "source": "configured"})
    assert bare.crossover == 40 and bare.measured_up_to is None


def test_unknown_versions_say_which_are_read() -> None:
    with pytest.raises(TableError, match=r"version 3 \(this router reads 1, 2\)"):
        from_json({**to_json(no_crossover_table()), "version": 3})


def test_the_advice_says_more_engines_should_speculate() -> None:
    text = no_crossover_advice(32, 1.32, speculative_engines=1, baseline_engines=1)
    assert "No crossover measured up to 32" in text and "x1.32 at 32" in text
    assert "2 speculative engines rather than 1 + 1" in text
    assert "by load" in text
    assert "two speculative engines" in no_crossover_advice(32)


def test_model_points_agree_with_the_model() -> None:
    # (the helper the tests above lean on)
    (p,) = model_points(PRESETS["eagle3-chain"], [16], 32, 256)
    assert p.decode_tps_p50 == closed_loop(PRESETS["eagle3-chain"], 16, 32, 256).per_request_tps
