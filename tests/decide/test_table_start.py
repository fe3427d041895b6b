"""The table file a router starts from (TABLE_PATH, TABLE_FRESH): missing, fresh, or something
else than a table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.decide import table as tables
from router.tools.replay_report import FORMAT
from tests.support.tables import model_table


def test_no_path_no_table() -> None:
    assert tables.starting_table(None, fresh=False) is None


def test_a_missing_file_is_refused_saying_how_to_get_one(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    with pytest.raises(tables.TableError) as err:
        tables.starting_table(path, fresh=False)
    message = str(err.value)
    assert f"{path} does not exist" in message
    assert f"spec-router calibrate --out {path}" in message
    assert "SPEC_ROUTER_TABLE_FRESH=true" in message


def test_a_missing_file_with_fresh_starts_without_one(tmp_path: Path) -> None:
    assert tables.starting_table(tmp_path / "t.json", fresh=True) is None


def test_an_existing_file_is_read_fresh_or_not(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    tables.save(model_table(32, 64, crossover=5), path)
    for fresh in (False, True):
        table = tables.starting_table(path, fresh)
        assert table is not None and table.crossover == 5


@pytest.mark.parametrize(
    ("document", "looks"),
    [
        (
            {"format": FORMAT, "meta": {}, "summary": {}, "results": []},
            "a replay's results file (spec-router replay --out run.json)",
        ),
        ({"window": {}, "summary": {}}, "a load generator's summary (python -m"),
        ({"policy": "slo", "pools": {}, "crossover": 7}, "the router's status document"),
    ],
)
def test_another_of_the_projects_files_is_named(
    tmp_path: Path, document: dict[str, object], looks: str
) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(document))
    with pytest.raises(tables.TableError) as err:
        tables.starting_table(path, fresh=False)
    message = str(err.value)
    assert f"this looks like {looks}" in message and "not a crossover table" in message
    assert "spec-router calibrate --out FILE" in message and "unsupported" not in message


def test_a_json_object_without_a_version_says_what_a_table_is(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"crossover": 4}')
    with pytest.raises(tables.TableError, match='not a crossover table: it has no "version"'):
        tables.load(path)
