"""The planner in a real router in front of real sims, over real sockets: GET /router/plan
and the gauges after traffic, the arrivals counted from the engines' own counters."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from router.decide import table as tables
from router.pools import BASELINE, SPECULATIVE
from tests.conftest import TIME_SCALE, RouterFactory
from tests.support.processes import Proc
from tests.support.tables import model_table

SCALE = float(TIME_SCALE)  # the sims' time scale
PLAN_SCALE = 0.02  # a planner minute is 1.2 s here
REQUESTS = 24


def plan_of(url: str) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(f"{url}/router/plan", timeout=5).json()
    return doc


async def send(url: str, n: int) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def one(i: int) -> None:
            body = {
                "model": "sim",
                "messages": [{"role": "user", "content": "word " * (20 + 30 * (i % 4))}],
                "max_tokens": 16 + 8 * (i % 3),
                "temperature": 1.0 if i % 2 else 0.0,
            }
            r = await client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text

        await asyncio.gather(*(one(i) for i in range(n)))


def test_the_plan_after_traffic_counts_it_from_the_engines(
    start_router: RouterFactory, own_sims: dict[str, Proc], tmp_path: Path
) -> None:
    table = tmp_path / "table.json"
    tables.save(model_table(256, 32, time_scale=SCALE), table)
    router = start_router(
        own_sims["speculative"].url,
        own_sims["baseline"].url,
        table_path=str(table),
        planner="autoscale",
        plan_time_scale=str(PLAN_SCALE),
        plan_min_requests=str(REQUESTS),  # (planned on the lengths of all of them)
        restart_s="550",
        slo_ttft_ms=str(1000 * SCALE),
        slo_tpot_ms=str(25 * SCALE),
    )
    first = plan_of(router.url)
    assert first["planner"] == "autoscale" and first["interval_s"] == 60 * PLAN_SCALE
    assert first["running"] == {SPECULATIVE: 1, BASELINE: 1}
    # every plan's traffic, from before the requests until they are all counted
    seen: dict[float, int] = {}

    def look() -> dict[str, Any]:
        doc = plan_of(router.url)
        if doc.get("at") is not None and "traffic" in doc:
            seen[doc["at"]] = doc["traffic"]["arrivals"]
        return doc

    deadline = time.monotonic() + 10
    while look().get("at") is None:  # (the first plan: the count starts)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    asyncio.run(send(router.url, REQUESTS))
    deadline = time.monotonic() + 30
    while sum(seen.values()) < REQUESTS and time.monotonic() < deadline:
        doc = look()
        time.sleep(0.05)
    assert sum(seen.values()) == REQUESTS, seen
    # The engines count a request when it arrives, the router its lengths when it ends: a round
    # gathered while the last requests ran has every arrival and no lengths yet (no mix, no
    # plan). The next round has both.
    doc = look()
    while doc["status"] != "planning" and time.monotonic() < deadline:
        time.sleep(0.05)
        doc = look()
    assert doc["status"] == "planning", doc["status"]
    assert doc["traffic"]["source"] == "engines"
    assert doc["traffic"]["mix_requests"] == REQUESTS
    assert doc["current"] == {SPECULATIVE: 1, BASELINE: 1}
    assert sum(doc["desired"].values()) == 2
    assert doc["history"] and doc["history"][0]["reason"] == doc["reason"]
    assert len(doc["forecast"]["point"]) == len(doc["forecast"]["upper"]) > 0
    assert doc["restart_s"][SPECULATIVE] == {
        "seconds": 550 * PLAN_SCALE, "source": "configured", "samples": []
    }  # fmt: skip
    assert {e["engine"] for e in doc["fleet"]} == {p.url for p in own_sims.values()}
    # the gauges say the same
    text = httpx.get(f"{router.url}/metrics", timeout=5).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("spec_router_plan_")
    }
    plan = plan_of(router.url)
    for pool in (SPECULATIVE, BASELINE):
        key = ("spec_router_plan_desired_engines", (("pool", pool),))
        assert samples[key] == plan["desired_engines"][pool] == plan["targets"][pool]
        assert (
            samples[("spec_router_plan_goal_engines", (("pool", pool),))] == (plan["desired"][pool])
        )
    restart = ("spec_router_plan_restart_seconds", (("pool", BASELINE), ("source", "configured")))
    assert samples[restart] == 550 * PLAN_SCALE


def test_the_plan_is_off_unless_asked_for(start_router: RouterFactory) -> None:
    router = start_router()
    assert plan_of(router.url) == {
        "planner": "off", "status": "off: set SPEC_ROUTER_PLANNER=advisory"
    }  # fmt: skip
    assert "spec_router_plan_" not in httpx.get(f"{router.url}/metrics", timeout=5).text
