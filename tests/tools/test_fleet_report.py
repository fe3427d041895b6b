"""``bench/fleet.py report`` writes the whole of fleet.md from the runs' JSON: per-regime rows,
the best static split swept, the planner's repeats, per-hour misses, the flat section."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.modules import load_script

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fleet.py"


@pytest.fixture
def bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    mod = load_script(BENCH, "bench_fleet")
    results = tmp_path / "bench" / "results"
    (results / "fleet").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    monkeypatch.setattr(mod, "RESULTS", results)
    monkeypatch.setattr(mod, "RUNS", results / "fleet")
    monkeypatch.setattr(mod, "LAB", results / "fleet-lab.json")
    lab_rows = {f"static {k}": {"strict": 0.1 * k, "relaxed": 0.5} for k in range(5)}
    lab_rows["planner"] = {"strict": 0.3, "relaxed": 0.6}
    lab_rows["oracle"] = {"strict": 0.31, "relaxed": 0.61, "switches": 3,
                          "restart_engine_s": 1500.0}  # fmt: skip
    main = [{"regime": r, "rows": lab_rows} for r in mod.REGIMES]
    (results / "fleet-lab.json").write_text(json.dumps({"main": main}))
    return mod


def summary(strict: float, relaxed: float, hours: list[tuple[float, float]]) -> dict[str, Any]:
    buckets = [{"start_h": i, "end_h": i + 1, "requests": 50, "ok": 50, "goodput_strict": s,
                "goodput_relaxed": r, "switches": 0} for i, (s, r) in enumerate(hours)]  # fmt: skip
    return {"requests": 100, "ok": 100, "goodput_strict": strict, "goodput_relaxed": relaxed,
            "tok_s": 400.0, "switches": 0, "restart_engine_s": 0.0, "buckets": buckets}  # fmt: skip


def put(mod: ModuleType, name: str, split: str, s: dict[str, Any], **extra: Any) -> None:
    meta = {"split": split, "start_speculative": 4, "in_flight_after": 0, "plans_seen": 10,
            "workload": "the day", "capacity_rps": 3.0, "restart_s": 530, "regime": "eagle3",
            "command": "spec-router fleet ...", "wall_s": 60.0, "time_scale": 0.3}  # fmt: skip
    doc = {"meta": meta, "summary": s, "results": [{}, {}], **extra}
    (mod.RUNS / f"{name}.json").write_text(json.dumps(doc))


def test_the_report_is_written_whole_from_the_runs(bench: ModuleType) -> None:
    put(bench, "eagle3.static0", "static:0", summary(0.2, 0.8, [(0.5, 0.9), (0.1, 0.9)]))
    put(bench, "eagle3.static4", "static:4", summary(0.3, 0.5, [(0.6, 0.9), (0.2, 0.4)]))
    put(bench, "eagle3.static2", "static:2", summary(0.3, 0.85, [(0.6, 0.9), (0.2, 0.8)]))
    # the best static run again: its own noise, beside the first run
    put(bench, "eagle3.static2.r2", "static:2", summary(0.34, 0.87, [(0.6, 0.9), (0.2, 0.8)]))
    # the planner twice: its hour 1-2 misses relaxed by 10 - 3 = 7 points
    put(bench, "eagle3.planner", "planner", summary(0.3, 0.84, [(0.6, 0.9), (0.2, 0.8)]))
    put(bench, "eagle3.planner.r2", "planner", summary(0.32, 0.86, [(0.6, 0.9), (0.2, 0.8)]))
    flat = {"advice": [{"t_day": 360.0, "switch": {"into": "speculative"}, "reason":
            "switch e to speculative (towards 4 speculative): +1.59 pt expected over the "
            "horizon, its restart costing 0.09 pt; 3+0 up meanwhile serve 11.32/s >= upper "
            "forecast 5.82/s; rate now 5.40/s"}]}  # fmt: skip
    put(bench, "eagle3.flat0.5.before", "planner", summary(0.5, 0.99, [(0.5, 0.99)]), **flat)
    given = {"estimate": {"rate": 5.5, "lower": 2.9, "upper": 9.6},
             "forecast": {"point": [6.3], "upper": [6.7]}}  # fmt: skip
    put(bench, "eagle3.flat0.5", "planner", summary(0.5, 0.99, [(0.5, 0.99)]), last_plan=given)
    # a planner run before its model priced the slo router: its own row
    put(bench, "eagle3.planner.spillmodel", "planner",
        summary(0.2, 0.7, [(0.6, 0.9), (0.2, 0.5)]))  # fmt: skip
    assert bench.report() == 0
    md = (bench.RESULTS / "fleet.md").read_text()
    # the best static by the planner's objective (0.2 strict + 0.8 relaxed): static 2
    assert "| static 2 **= best static** | 30.0 | 85.0 | 74.0 |" in md
    # each row says which code ran it (here: none recorded)
    assert "Run on: static 0: commit not recorded, ?; static 2: commit not recorded" in md
    assert "| static 1 | not run |" in md
    # the planner's two runs: mean and range; against the best static within a point
    assert "| **planner** (mean of 2 runs, range) | 31.0 (30.0-32.0) | 85.0 (84.0-86.0) |" in md
    assert "+1.0 strict, +0.0 relaxed" in md and "is met over the splits run (0, 2, 4" in md
    assert "| static 2, the same run repeated (mean of 2 runs, range) | 32.0 (30.0-34.0) |" in md
    assert "(the same run repeated: its own noise): -1.0 strict, -1.0 relaxed." in md
    # hour 1-2: the better pure fleet's relaxed is all-baseline's 90: the planner's 80 misses
    assert "| 1-2 | 50 | 20.0 / 80.0 | 20.0 / 40.0 | 10.0 / 90.0 | 0 | relaxed -7.0 |" in md
    assert "Hours within 3 points of the better pure fleet in both tiers: 1 of 2" in md
    assert "| planner, spillover model | 20.0 | 70.0 | 60.0 |" in md
    # the flat section: before and after, and the switch's own numbers
    assert "Switches advised: before 1 in 1 runs; window, slo model 0 in 1 runs." in md
    # what the planner was given against the level's true rate (0.5 x 3.0 / time scale 0.3)
    assert "| 0 | 10 | 5.00 | 5.50 [2.90-9.60] | 6.30 (6.70) | 0 |" in md
    assert "at 0.10 h into speculative (towards 4): +1.59 pt expected" in md
    # what was not run is said
    assert "- eagle3-chain: static 0" not in md  # (all-baseline is every regime's)
    assert "- eagle3-chain: static 1, 2, 3, 4 not run over sockets." in md
    assert "- `--trace` end to end." in md


def test_a_run_is_committed_without_its_records_and_with_its_commit(bench: ModuleType) -> None:
    put(bench, "eagle3.static3", "static:3", summary(0.2, 0.8, []))
    path = bench.RUNS / "eagle3.static3.json"
    bench.finish(path)
    doc = json.loads(path.read_text())
    assert "results" not in doc and doc["meta"]["per_request_records"].startswith("2,")
    assert doc["meta"]["commit"]
