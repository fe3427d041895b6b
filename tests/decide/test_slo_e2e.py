"""The slo policy through a real router: a lone request speculates, and load the router did
not send (long streams sent to the engines directly, read from their metrics:
``LOAD_SIGNAL=engine``) moves the requests past the pools' capacities, the way the capacities
the router reports in ``/router/status`` say.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.decide import table as tables
from router.pools import BASELINE, POOLS, SPECULATIVE, Pool
from router.sim.model import EAGLE3
from tests.conftest import TIME_SCALE, RouterFactory
from tests.support.http import await_for
from tests.support.processes import Proc
from tests.support.tables import model_table

pytestmark = pytest.mark.anyio

SLO_TTFT, SLO_TPOT = 0.1, 0.0025  # wall seconds: 1 s and 25 ms of model time at scale 0.1
OUTPUT = 64


def body(words: int, temperature: float, max_tokens: int = OUTPUT, stream: bool = False) -> Any:
    return {
        "model": "sim",
        "messages": [{"role": "user", "content": "abc " * words}],  # 4 chars a token
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": stream,
    }


async def status(client: httpx.AsyncClient) -> dict[str, Any]:
    data: dict[str, Any] = (await client.get("/router/status")).json()
    return data


def loads(doc: dict[str, Any]) -> dict[Pool, int]:
    return {p: doc["pools"][p]["backends"][0]["load"] for p in POOLS}


async def test_a_lone_request_speculates_and_load_moves_requests_past_the_capacities(
    own_sims: dict[str, Proc], start_router: RouterFactory, tmp_path: Path
) -> None:
    table = model_table(400, 200, time_scale=float(TIME_SCALE), tau_sampling=EAGLE3.tau_sampling)
    tables.save(table, tmp_path / "t.json")
    router = start_router(
        own_sims["speculative"].url,
        own_sims["baseline"].url,
        policy="slo",
        load_signal="engine",
        health_interval="0.1",
        table_path=str(tmp_path / "t.json"),
        learn="false",
        explore_share="0",
        ramp_seconds="0",
        slo_ttft_ms=str(SLO_TTFT * 1000),
        slo_tpot_ms=str(SLO_TPOT * 1000),
    )
    async with AsyncExitStack() as stack:
        direct = await stack.enter_async_context(httpx.AsyncClient(timeout=30))
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=router.url, timeout=30))
        # quiet: speculation, within the SLO
        for temperature in (0.0, 1.0):
            r = await client.post("/v1/chat/completions", json=body(50, temperature))
            assert r.status_code == 200, r.text
            assert r.headers["x-spec-router-pool"] == SPECULATIVE
            assert r.headers["x-spec-router-reason"] == "within_slo"
        doc = await status(client)
        slo = doc["slo"]
        assert slo["deciding_as"] == "slo" and slo["rule"]
        relaxed = {p: slo["pools"][p]["relaxed_capacity"]["greedy"] for p in POOLS}
        assert all(n >= 1 for n in relaxed.values())
        # long streams straight to each engine, past its relaxed capacity
        load = {p: relaxed[p] + 2 for p in POOLS}
        held = []
        for pool in POOLS:
            for _ in range(load[pool]):
                response = await stack.enter_async_context(
                    direct.stream(
                        "POST",
                        own_sims[pool].url + "/v1/chat/completions",
                        json=body(20, 0.0, max_tokens=100_000, stream=True),
                    )
                )
                chunks = response.aiter_raw()
                held.append(chunks)  # (a dropped iterator would close its stream)
                await anext(chunks)  # started

        async def settled() -> dict[str, Any] | None:
            doc = await status(client)
            return doc if loads(doc) == load else None

        assert await await_for(settled) is not None
        r = await client.post("/v1/chat/completions", json=body(50, 0.0))
        assert r.status_code == 200, r.text
        # every engine past its relaxed capacity: neither within the SLO nor the relaxed one
        assert r.headers["x-spec-router-reason"] == "overflow"
        assert r.headers["x-spec-router-pool"] in (SPECULATIVE, BASELINE)
    # the held streams were closed with the clients: the engines drain
    await await_for(lambda: _idle(own_sims))


async def _idle(sims: dict[str, Proc]) -> bool:
    async with httpx.AsyncClient() as c:
        for proc in sims.values():
            engine = (await c.get(proc.url + "/sim/config")).json()["engine"]
            if engine["running"] or engine["queued"]:
                return False
    return True
