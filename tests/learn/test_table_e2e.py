"""The crossover table in the running router: load, pin, replace, persist, learn."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest

from router.calibrate.loadgen import run_closed_loop
from router.decide import table as tables
from router.sim.model import BASELINE, EAGLE3, PRESETS, crossover
from tests.conftest import TIME_SCALE, RouterFactory, router_env
from tests.support.http import router_status, wait_for
from tests.support.processes import Proc
from tests.support.tables import model_table

pytestmark = pytest.mark.anyio


def write(path: Path, table: tables.Table) -> Path:
    tables.save(table, path)
    return path


def test_table_sets_the_crossover_and_explicit_crossover_wins(
    start_router: RouterFactory, tmp_path: Path
) -> None:
    path = write(tmp_path / "t.json", model_table(32, 64, crossover=5))
    router = start_router(table_path=str(path))
    status = router_status(router.url)
    assert (status["crossover"], status["crossover_source"]) == (5, "calibrated")
    pinned = start_router(table_path=str(path), crossover="3")
    status = router_status(pinned.url)
    assert (status["crossover"], status["crossover_source"]) == (3, "configured")
    text = httpx.get(f"{pinned.url}/metrics").text
    assert "spec_router_crossover 3.0" in text
    assert 'spec_router_crossover_source_info{source="configured"} 1.0' in text


async def test_a_table_without_a_crossover_routes_by_load_past_the_level_measured(
    start_router: RouterFactory, tmp_path: Path
) -> None:
    """Issue 33: a table that measured no crossover (up to 2) holds the speculative engine to
    2, then places by load (``beyond_measured``) instead of sending the rest to the baseline;
    the status says so. Streams are held open so each decision sees the ones before it."""
    chain = model_table(32, 64, levels=[1, 2], spec_preset=PRESETS["eagle3-chain"])
    assert chain.crossover is None and chain.measured_up_to == 2
    path = write(tmp_path / "chain.json", chain)
    router = start_router(
        table_path=str(path), policy="spillover", learn="false", explore_share="0"
    )
    status = router_status(router.url)
    assert (status["crossover"], status["speculative_limit"]) == (None, 2)
    assert status["no_crossover"]["message"] == "no crossover measured up to 2"
    assert "More engines should speculate" in status["no_crossover"]["advice"]
    body = {"model": "sim", "messages": [{"role": "user", "content": "abc"}],
            "max_tokens": 400, "stream": True}  # fmt: skip
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=30))
        streams = []
        for _ in range(5):
            response = await stack.enter_async_context(
                client.stream("POST", f"{router.url}/v1/chat/completions", json=body)
            )
            assert response.status_code == 200
            streams.append(response)
        routed = [(r.headers["x-spec-router-pool"], r.headers["x-spec-router-reason"])
                  for r in streams]  # fmt: skip
        # 2 on the speculative engine (the level measured); then the less loaded pool: the
        # idle baseline twice, then 2 against 2, a tie, kept speculative
        assert routed == [("speculative", "below_crossover")] * 2 + [
            ("baseline", "beyond_measured"),
            ("baseline", "beyond_measured"),
            ("speculative", "beyond_measured"),
        ]
        assert router_status(router.url)["in_flight"] == {
            "speculative": 3, "baseline": 2, "total": 5}  # fmt: skip
        bodies = await asyncio.gather(*(r.aread() for r in streams))
        assert all(b.rstrip().endswith(b"data: [DONE]") for b in bodies)
    wait_for(lambda: router_status(router.url)["in_flight"]["total"] == 0)


def test_corrupt_table_is_refused_at_start(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text('{"version": 1, "crossover": "seven"}')
    env = router_env("http://127.0.0.1:9", "http://127.0.0.1:10", table_path=str(path))
    done = subprocess.run(
        [sys.executable, "-m", "router", "serve", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "SPEC_ROUTER_TABLE_PATH" in lines[0] and "crossover" in lines[0]


async def test_learned_table_survives_a_restart(
    start_router: RouterFactory, tmp_path: Path
) -> None:
    # a table whose crossover is far too high: learning pulls it down step by step
    path = write(
        tmp_path / "t.json", model_table(32, 64, crossover=14, time_scale=float(TIME_SCALE))
    )
    settings = {
        "table_path": str(path),
        "learn_interval": "0.1",
        "persist_interval": "0.2",
        "learn_min_samples": "5",
        "policy": "round_robin",
    }
    router = start_router(**settings)
    await run_closed_loop(
        f"{router.url}/v1", concurrency=8, prompt_tokens=32, output_tokens=64, duration=2.0
    )
    moved = wait_for(
        lambda: (s := router_status(router.url))["crossover_source"] == "learned" and s
    )
    assert moved["crossover"] < 14
    samples = moved["learning"]["samples"]
    assert samples["speculative"] >= 5 and samples["baseline"] >= 5
    router.stop()
    saved = tables.load(path)
    # (it may still have moved a step between our look and the shutdown)
    assert saved.source == "learned" and saved.crossover is not None and saved.crossover < 14
    again = start_router(**settings)
    status = router_status(again.url)
    assert (status["crossover"], status["crossover_source"]) == (saved.crossover, "learned")
    shown = httpx.get(f"{again.url}/router/table").json()
    assert sum(p["samples"] for p in shown["speculative"]["points"]) >= sum(
        p.samples for p in saved.speculative.points
    )


async def test_acceptance_collapse_moves_the_crossover_and_back(
    start_router: RouterFactory, own_sims: dict[str, Proc], tmp_path: Path
) -> None:
    prompt, output = 1024, 2048
    table = model_table(prompt, output, time_scale=float(TIME_SCALE))
    expected: dict[float, float] = {}
    for tau in (2.8, 2.2):
        value = crossover(EAGLE3.replace(tau=tau), BASELINE, prompt, output)
        assert value is not None, f"no crossover at acceptance {tau}"
        expected[tau] = value
    assert table.crossover == math.ceil(expected[2.8])
    spec, base = own_sims["speculative"], own_sims["baseline"]
    path = write(tmp_path / "t.json", table)
    router = start_router(
        spec.url, base.url, table_path=str(path), learn_interval="0.2", health_interval="0.1"
    )
    load = asyncio.create_task(
        run_closed_loop(
            f"{router.url}/v1",
            concurrency=3,
            prompt_tokens=prompt,
            output_tokens=output,
            duration=30.0,
        )
    )
    try:
        await asyncio.to_thread(
            wait_for,
            lambda: (
                abs((router_status(router.url)["learning"]["acceptance_length"] or 0) - 2.8) < 0.2
            ),
        )
        for tau in (2.2, 2.8):
            httpx.post(f"{spec.url}/sim/config", json={"tau": tau}).raise_for_status()
            began = time.monotonic()
            status = await asyncio.to_thread(
                wait_for,
                lambda t=tau: (
                    (s := router_status(router.url))
                    and abs(s["crossover"] - expected[t]) <= 1
                    and s
                ),
                15.0,
            )
            took = time.monotonic() - began
            print(f"acceptance {tau}: crossover {status['crossover']} after {took:.1f} s")
            assert status["crossover_source"] == "learned"
    finally:
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)


async def test_learning_keeps_the_tables_units_against_time_scaled_engines(
    start_router: RouterFactory, tmp_path: Path
) -> None:
    """Sims at time scale 0.1 run 10x faster than the model-time table says: what the router
    learns must be divided back, or its curves would be 10x off and predictive would drift."""
    table = model_table(16, 256, levels=[1, 2, 4, 8, 16, 32], time_scale=float(TIME_SCALE))
    path = write(tmp_path / "t.json", table)
    router = start_router(table_path=str(path), learn_interval="0.2", learn_min_samples="5")
    await run_closed_loop(
        f"{router.url}/v1", concurrency=10, prompt_tokens=16, output_tokens=256, duration=4.0
    )
    learned = httpx.get(f"{router.url}/router/table").json()
    assert learned["time_scale"] == float(TIME_SCALE)
    model = {p.concurrency: p.decode_tps_p50 for p in table.baseline.points}
    for pool in ("speculative", "baseline"):
        new = [
            p for p in learned[pool]["points"] if p["samples"] > 50 or p["concurrency"] not in model
        ]
        assert new, pool
        for p in new:
            # within 35% of the model curve interpolated at that concurrency: same units
            ref = [q for q in table.pool(pool).points]
            lo = max(
                (q for q in ref if q.concurrency <= p["concurrency"]), key=lambda q: q.concurrency
            )
            hi = min(
                (q for q in ref if q.concurrency >= p["concurrency"]),
                key=lambda q: q.concurrency,
                default=lo,
            )
            assert (
                min(hi.decode_tps_p50, lo.decode_tps_p50) * 0.65
                <= p["decode_tps_p50"]
                <= max(hi.decode_tps_p50, lo.decode_tps_p50) * 1.35
            ), (pool, p)
