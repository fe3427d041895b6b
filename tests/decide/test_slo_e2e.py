"""The slo policy through a real router: long prompts and sampled requests change its decision
the way its model says.

Both sims are loaded directly (bypassing the router) with 4 long streams each; the router reads
those loads from the engines' metrics (``LOAD_SIGNAL=engine``). For each probe the test takes
the state the router reports, asks the pure policy (``router.decide.policy.slo``) with the
models of the same table, and checks the router's answer against it.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.decide import table as tables
from router.decide.policy import BackendView, PoolView, Snapshot, choose
from router.decide.predict import Request
from router.decide.twin import Stream
from router.learn.models import EngineModels
from router.pools import BASELINE, POOLS, SPECULATIVE, Pool
from router.sim.model import EAGLE3
from tests.conftest import TIME_SCALE, RouterFactory
from tests.support.http import await_for
from tests.support.processes import Proc
from tests.support.tables import model_table

pytestmark = pytest.mark.anyio

LOAD = 4  # streams held on each engine
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


def expected(
    doc: dict[str, Any],
    models: Any,
    words: int,
    sampling: bool,
    slo: tuple[float, float] = (SLO_TTFT, SLO_TPOT),
) -> str:
    views = {}
    for pool in POOLS:
        b = doc["pools"][pool]["backends"][0]
        recent = doc["slo"]["backends"][b["url"]]
        s = recent["stream"]  # what the router expects to keep coming there (model time)
        scale = float(TIME_SCALE)
        stream = Stream(s["rate_per_s"], s["prompt_tokens"], s["output_tokens"],
                        s["sampling_share"], SLO_TTFT / scale, SLO_TPOT / scale)  # fmt: skip
        views[pool] = PoolView(
            pool,
            (
                BackendView(
                    b["url"],
                    b["load"],
                    b["usable"],
                    b["weight"],
                    recent["prefill_share"],
                    None
                    if recent["expected_load"] is None
                    else recent["expected_load"] + b["load"] - b["in_flight"],
                    stream=stream,
                ),
            ),
        )
    req = Request(float(words), float(OUTPUT), sampling, *slo)
    snap = Snapshot(
        views[SPECULATIVE],
        views[BASELINE],
        7,
        request=req,
        models=models,
        mean_output=doc["slo"]["mean_output_tokens"],
        sampling_share=doc["slo"]["sampling_share"],
    )
    decision = choose("slo", snap)[0]
    assert decision is not None
    return decision.pool


async def test_prompt_length_and_temperature_move_requests_as_the_model_says(
    own_sims: dict[str, Proc], start_router: RouterFactory, tmp_path: Path
) -> None:
    table = model_table(400, 200, time_scale=float(TIME_SCALE), tau_sampling=EAGLE3.tau_sampling)
    tables.save(table, tmp_path / "t.json")
    models = EngineModels(table).models()
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
        held = []
        for pool in POOLS:  # long streams straight to each engine: load the router cannot see
            for _ in range(LOAD):
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
            return doc if loads(doc) == {SPECULATIVE: LOAD, BASELINE: LOAD} else None

        decisions = []
        for words, temperature in ((50, 0.0), (50, 1.0), (6000, 0.0)):
            doc = await await_for(settled)
            assert doc is not None
            want = expected(doc, models, words, temperature > 0)
            print(
                "DOC",
                words,
                temperature,
                doc["slo"],
                [doc["pools"][p]["backends"][0] for p in POOLS],
            )
            r = await client.post("/v1/chat/completions", json=body(words, temperature))
            assert r.status_code == 200, r.text
            assert r.headers["x-spec-router-reason"] == "predicted_slo"
            assert r.headers["x-spec-router-pool"] == want, (words, temperature, doc["slo"])
            decisions.append(want)
        # what the model says here: a short greedy request is worth speculating, a sampled one
        # (fewer drafts accepted) or a long prompt (its prefill stalls the speculative batch)
        # is not
        assert decisions == [SPECULATIVE, BASELINE, BASELINE]
        # a request's own SLO: one that needs its first token within 5 ms (50 ms of model
        # time) meets it nowhere, and the baseline's shorter prefill and iteration come closest
        doc = await await_for(settled)
        assert doc is not None
        want = expected(doc, models, 50, False, (0.005, SLO_TPOT))
        tight = await client.post(
            "/v1/chat/completions", json=body(50, 0.0), headers={"x-slo-ttft-ms": "5"}
        )
        assert tight.headers["x-spec-router-pool"] == want == BASELINE
    # the held streams were closed with the clients: the engines drain
    await await_for(lambda: _idle(own_sims))


async def _idle(sims: dict[str, Proc]) -> bool:
    async with httpx.AsyncClient() as c:
        for proc in sims.values():
            engine = (await c.get(proc.url + "/sim/config")).json()["engine"]
            if engine["running"] or engine["queued"]:
                return False
    return True
