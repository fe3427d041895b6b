"""The live page's document: laid out from /router/status, the keeper's curves (the table
learning started from and what it learned) and each engine's operating point on them."""

from __future__ import annotations

import json

import pytest

from router.account.outcome import Outcome
from router.app import RouterApp
from router.control.live import interpolate
from router.decide import table as tables
from router.pools import BASELINE, POOLS, SPECULATIVE
from router.settings import Settings
from router.upstream.stream import Usage
from tests.support.tables import model_table

S1, S2, B1 = "http://127.0.0.1:9", "http://127.0.0.1:10", "http://127.0.0.1:11"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_interpolate_is_linear_between_points_and_flat_past_them() -> None:
    pts = [(1, 80.0), (4, 50.0), (8, 30.0, 12)]
    assert interpolate(pts, 2) == pytest.approx(70.0)
    assert interpolate(pts, 6) == pytest.approx(40.0)
    assert interpolate(pts, 0.5) == 80.0 and interpolate(pts, 64) == 30.0
    assert interpolate([], 3) is None


def router(table: tables.Table | None = None, **settings: object) -> tuple[RouterApp, Clock]:
    clock = Clock()
    config = Settings(speculative_urls=[S1, S2], baseline_urls=[B1], **settings)  # type: ignore[arg-type]
    app = RouterApp(config, clock=clock)
    if table is not None:
        app.keeper.replace(tables.to_json(table))
    return app, clock


def test_the_snapshot_follows_the_status_document() -> None:
    app, clock = router(model_table(32, 96, crossover=5))
    leases = [app.tracker.acquire(S1) for _ in range(3)]
    leases += [app.tracker.acquire(B1) for _ in range(2)]
    status = app.status()
    doc = app.ui_snapshot()
    json.dumps(doc, allow_nan=False)  # what the feed sends must be plain JSON
    assert (doc["policy"], doc["load_signal"]) == (status["policy"], status["load_signal"])
    assert doc["crossover"] == status["crossover"] == 5
    assert doc["crossover_source"] == status["crossover_source"] == "calibrated"
    for pool in POOLS:
        assert doc["pools"][pool]["in_flight"] == status["pools"][pool]["in_flight"]
        assert [b["url"] for b in doc["pools"][pool]["backends"]] == app.pools[pool]
    assert doc["pools"][SPECULATIVE]["in_flight"] == 3
    assert doc["pools"][BASELINE]["in_flight"] == 2
    assert [b["in_flight"] for b in doc["pools"][SPECULATIVE]["backends"]] == [3, 0]
    # nothing is usable yet (no probe answered): the speculative pool has no room
    assert doc["speculative_capacity"] == 0
    assert doc["recent"]["share_speculative"] == status["recent"]["share_speculative"] is None
    assert doc["ui"] == status["ui"] == {"feed_connections": 0, "snapshots": 0, "interval_s": 1.0}
    for lease in leases:
        lease.release()


def test_the_snapshot_carries_the_objective_the_pools_status_and_the_warnings() -> None:
    app, clock = router(policy="slo", slo_ttft_ms=500.0, slo_tpot_ms=20.0)
    app.health.probe(B1, True, clock())
    app.notices.raise_("backend:x", S1, "backend x cannot be reached", clock(), log_it=False)
    doc = app.ui_snapshot()
    assert doc["slo"] == {
        "ttft_ms": 500.0,
        "tpot_ms": 20.0,
        "relaxed_ttft_ms": 1500.0,
        "relaxed_tpot_ms": 40.0,
    }
    assert (doc["policy"], doc["deciding_as"]) == ("slo", "spillover")
    assert "no curves yet" in doc["deciding_as_why"]
    assert doc["status"] == "degraded"
    assert (doc["pools"][SPECULATIVE]["status"], doc["pools"][BASELINE]["status"]) == (
        "down",
        "ok",
    )
    assert doc["warnings"] == [
        f"speculative pool: no usable backend (never healthy: {S1}, {S2})",
        "backend x cannot be reached",
    ]
    assert doc["recent"]["within_slo"]["all"] == {"judged": 0, "strict": None, "relaxed": None}
    assert set(doc["recent"]["series"]) >= {"within_slo", "ttft_p90_ms", "tpot_p90_ms"}


def test_the_curves_keep_the_starting_table_and_mark_each_engine() -> None:
    table = model_table(32, 96, crossover=5, time_scale=0.1)
    app, clock = router(table)
    lease = app.tracker.acquire(S1)
    curves = app.ui_snapshot()["curves"]
    assert curves["start_source"] == "calibrated" and curves["time_scale"] == 0.1
    for pool in POOLS:
        start = [(n, tps) for n, tps in curves["start"][pool]]
        assert start == [
            (p.concurrency, round(p.decode_tps_p50, 3)) for p in table.pool(pool).points
        ]
        # nothing learned yet: the learned curve is the starting one, with its weights
        assert [pt[:2] for pt in curves["learned"][pool]] == [list(p) for p in start]
    spec_now = {o["url"]: o for o in curves["operating"][SPECULATIVE]}
    # one request in flight on S1: the curve's value at 1; S2 idle is drawn at 1 as well
    assert spec_now[S1]["load"] == 1 and spec_now[S2]["load"] == 0
    assert spec_now[S1]["tps"] == pytest.approx(table.speculative.points[0].decode_tps_p50, 1e-3)
    assert curves["crossover"] == 5
    lease.release()


def test_learned_points_move_away_from_the_start_and_the_start_stays() -> None:
    table = model_table(32, 96, crossover=5)
    app, clock = router(table, learn_min_samples=1)
    start = app.keeper.curves()["start"]
    before = dict((n, tps) for n, tps, _ in app.keeper.curves()["learned"][BASELINE])
    # baseline requests at concurrency 1 far slower than calibrated: the learned point falls
    for _ in range(30):
        lease = app.tracker.acquire(B1)
        out = Outcome(path="/v1/chat/completions", started=clock.now)
        out.read(stream=True)
        out.attempt(BASELINE, B1, "predicted_slo", 0)
        out.answered(200)
        clock.now += 0.05
        out.first_bytes(clock.now, app.tracker.area(B1, clock.now))
        clock.now += 2.0  # 21 tokens in 2 s: 10 tok/s
        out.counted(Usage(32, 21))
        out.lease_ends(clock.now, app.tracker.area(B1, clock.now))  # (as Proxy.release does)
        lease.release()
        out.finish(clock.now)
        for observe in app.observers:
            observe(out)
    curves = app.keeper.curves()
    after = dict((n, tps) for n, tps, _ in curves["learned"][BASELINE])
    assert after[1] < before[1] * 0.5
    assert curves["start"] == start  # the start is what learning began from, unchanged
    recent = app.status()["recent"]
    assert recent["requests"] == {BASELINE: 30} and recent["share_speculative"] == 0.0
    assert recent["latency"][BASELINE]["tpot_p50_ms"] == pytest.approx(100.0, rel=0.03)


def test_without_a_table_there_is_no_start_curve() -> None:
    app, _ = router()
    curves = app.ui_snapshot()["curves"]
    assert curves["start"] is None and curves["start_source"] is None
    assert curves["learned"] == {SPECULATIVE: [], BASELINE: []}
    assert all(o["tps"] is None for o in curves["operating"][SPECULATIVE])


def test_no_crossover_shows_as_null_with_the_level_and_what_follows() -> None:
    from router.sim.model import PRESETS

    app, clock = router(model_table(32, 256, spec_preset=PRESETS["eagle3-chain"]))
    for url in (S1, S2, B1):
        app.health.probe(url, True, clock())
    clock.now += 60.0  # past the ramp
    status = app.status()
    assert status["crossover"] is None and status["speculative_limit"] == 32
    none = status["no_crossover"]
    assert none["message"] == "no crossover measured up to 32" and none["margin"] > 1.2
    assert "3 speculative engines rather than 2 + 1" in none["advice"]
    doc = app.ui_snapshot()
    json.dumps(doc, allow_nan=False)
    assert doc["crossover"] is None and doc["no_crossover"] == none
    assert doc["speculative_capacity"] == 64  # 32 per usable speculative engine
    assert doc["curves"]["crossover"] == 32  # the mark on the curves: the level measured
