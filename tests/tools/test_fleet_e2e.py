"""``spec-router fleet`` end to end: real sims, a real router finding them by DNS, its planner,
the actuator and the replay, on a day compressed to seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.tools.fleet.cli import main


@pytest.mark.slow
def test_the_planner_switches_an_engine_and_every_request_is_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two baseline engines of a regime with no crossover (eagle3-chain: speculation is faster
    # at every load): the planner moves one to speculative once it has a few intervals of
    # traffic. The engine drains, restarts in the other mode, comes back through DNS. The day
    # ends once that switch has landed (--until-switches): its two hours (72 s of wall time)
    # are only the bound on how long the planner may take on a loaded machine.
    # (a compressed flat day sends a few requests a planner interval: plan on the first five's
    # lengths, not PLAN_MIN_REQUESTS' 50, which would take most of the day)
    # The load is 0.3 of the pair's capacity: at 0.5 the engine left up while the other restarts
    # is at its own capacity, and the floor (those up must serve the upper forecast) rightly
    # holds the switch; since the plan state keeps yesterday's mix (the first plan comes at
    # once, on it) that load was held all day.
    monkeypatch.setenv("SPEC_ROUTER_PLAN_MIN_REQUESTS", "5")
    out = tmp_path / "fleet.json"
    code = main([
        "--engines", "2", "--split", "planner", "--start", "0", "--regime", "eagle3-chain",
        "--synthetic", "flat", "--hi", "0.3", "--hours", "2", "--compress", "20",
        "--time-scale", "0.2", "--restart-s", "100", "--seed", "2", "--until-switches", "1",
        "--out", str(out), "--keep", str(tmp_path / "run"),
    ])  # fmt: skip
    assert code == 0
    doc = json.loads(out.read_text())
    summary, outages = doc["summary"], doc["outages"]
    log = (tmp_path / "run" / "router.log").read_text()
    assert summary["switches"] >= 1, log[-3000:]
    first = outages[0]
    assert first["into"] == "speculative" and first["back"] is not None, log[-3000:]
    assert first["back"] > first["left"]
    # the split went 0+2 -> 0+1 with one out -> 1+1
    assert doc["split"][0][1:] == [0, 2, 0]
    assert [0, 1, 1] in [row[1:] for row in doc["split"]]
    assert [1, 1, 0] in [row[1:] for row in doc["split"]]
    # every request ended well: none cut by the drain, none left unfinished
    results = doc["results"]
    assert results and all(r["status"] == 200 and r["error"] is None for r in results)
    assert summary["ok"] == summary["requests"] == len(results)
    # ... and the router holds nothing in flight once the replay is over
    assert doc["meta"]["in_flight_after"] == 0
    # the report and the picture are written beside the JSON
    assert "| all |" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_a_bad_split_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--engines", "2", "--split", "static:3", "--synthetic", "flat"])
    assert exc.value.code == 2
    assert "static:K" in capsys.readouterr().err
