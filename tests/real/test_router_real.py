"""The router in front of two llama-servers: routing by load, what it reads from them, and
streams that are what the engine sends."""

from __future__ import annotations

import asyncio
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from router.calibrate.loadgen import RequestResult
from router.tools.llamacpp import DRAFT_MAX
from tests.real.conftest import Calibration, Engines, RouterFactory
from tests.real.drive import (
    CHAT,
    COMPLETIONS,
    PROMPTS,
    chat_body,
    closed_loop,
    completion_body,
    masked,
    post,
    text_of,
)
from tests.support.http import metric_value

TIMEOUT = httpx.Timeout(connect=10.0, read=120.0, write=30.0, pool=None)


async def direct_references(engines: Engines) -> dict[tuple[str, int], bytes]:
    """Each engine's own answer to each prompt, one request at a time."""
    refs = {}
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        for pool in ("speculative", "baseline"):
            for i in range(len(PROMPTS)):
                r = await post(client, engines.by_pool(pool).url + CHAT, chat_body(i))
                assert r.ok and r.body is not None, r.error
                refs[pool, i] = r.body
    return refs


def test_ramp_routes_by_load_reads_the_engines_and_relays_them_unchanged(
    engines: Engines, calibration: Calibration, start_router: RouterFactory, tmp_path: Path
) -> None:
    table = tmp_path / "table.json"
    shutil.copy(calibration.path, table)
    # the default policy on the calibrated curves; no exploration, so that a lone
    # request has exactly one right answer
    router = start_router(TABLE_PATH=str(table), EXPLORE_SHARE="0")
    refs = asyncio.run(direct_references(engines))
    # temperature 0: both engines give the same text (speculation changes speed, not output)
    for i in range(len(PROMPTS)):
        assert text_of(refs["speculative", i]) == text_of(refs["baseline", i])
        assert len(text_of(refs["baseline", i])) > 64  # 64 tokens of text

    watched: list[dict[str, Any]] = []
    scraped: list[str] = []

    async def ramp() -> tuple[list[RequestResult], list[RequestResult]]:
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            # lone requests: each finds nothing in flight and no recent traffic (a client that
            # sends back to back keeps the speculative engine at about one request on average,
            # which the default policy counts as load it will share)
            lone = []
            for i in range(3):
                lone += await closed_loop(client, router.url, 1, 1, first=i)
                await asyncio.sleep(2.0)

            async def watch() -> None:
                while True:
                    watched.append((await client.get(router.url + "/router/status")).json())
                    scraped.append((await client.get(router.url + "/metrics")).text)
                    await asyncio.sleep(0.5)

            watcher = asyncio.create_task(watch())
            try:
                busy = await closed_loop(client, router.url, 16, 48, first=3)
            finally:
                watcher.cancel()
            return lone, busy

    lone, busy = asyncio.run(ramp())
    assert all(r.ok for r in lone + busy), [r.error for r in lone + busy if not r.ok]
    # a lone request goes where it is fastest; at 16 in flight the excess spills to baseline
    assert [r.pool for r in lone] == ["speculative"] * 3
    assert not {r.headers["x-spec-router-reason"] for r in lone} & {"failover", "retry"}
    pools = Counter(r.pool for r in busy)
    assert pools["baseline"] >= 8 and pools["speculative"] >= 1, pools

    # what the router read from llama.cpp's /metrics, while 16 were in flight
    spec_url, base_url = engines.speculative.url, engines.baseline.url
    seen = {
        pool: [s["pools"][pool]["backends"][0]["engine"] for s in watched]
        for pool in ("speculative", "baseline")
    }
    assert all(e is not None and e["flavor"] == "llamacpp" for es in seen.values() for e in es)
    assert max(e["running"] for e in seen["speculative"]) >= 1
    assert max(e["running"] for e in seen["baseline"]) >= 4
    accepted = [e["spec_accept_length"] for e in seen["speculative"] if e["spec_accept_length"]]
    assert accepted and all(1.5 < a <= 1 + DRAFT_MAX for a in accepted), accepted
    assert all(e["spec_accept_length"] is None for e in seen["baseline"])  # it does not draft
    learned = watched[-1]["learning"]["acceptance_length"]
    assert learned is not None and 1.5 < learned <= 1 + DRAFT_MAX
    running = [
        metric_value(text, "spec_router_engine_running_requests", backend=base_url)
        for text in scraped
    ]
    assert max(running) >= 4
    accept_metric = [
        metric_value(text, "spec_router_engine_spec_accept_length", backend=spec_url)
        for text in scraped
    ]
    assert max(accept_metric) > 1.5
    assert all(
        metric_value(text, "spec_router_engine_spec_accept_length", backend=base_url) == 0
        for text in scraped
    )

    # every stream is what the engine that served it sends for that prompt, byte for byte
    # (but for its id, creation second and timings)
    for r in lone + busy:
        assert r.body is not None and r.pool is not None
        assert masked(r.body) == masked(refs[r.pool, r.seq % len(PROMPTS)]), (r.pool, r.seq)


def test_streams_and_bodies_through_the_router_are_what_the_engine_sends(
    engines: Engines, start_router: RouterFactory
) -> None:
    """Also the llama.cpp shapes the router rewrites: asked for no usage, the router asks for
    it, removes that event and puts its timings back where llama.cpp puts them unasked."""
    router = start_router(POLICY="spillover", CROSSOVER="4", EXPLORE_SHARE="0")

    async def compare() -> None:
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            cases = [
                (CHAT, chat_body(0, usage=False)),
                (CHAT, chat_body(1, usage=True)),
                (COMPLETIONS, completion_body(2)),
            ]
            for path, body in cases:
                via = await post(client, router.url + path, body)
                assert via.status == 200 and via.pool is not None and via.body is not None
                direct = await post(client, engines.by_pool(via.pool).url + path, body)
                assert direct.status == 200 and direct.body is not None
                assert masked(via.body) == masked(direct.body), path
                assert via.body.endswith(b"data: [DONE]\n\n") and b',"timings":{' in via.body
                if path == CHAT and "stream_options" not in body:
                    # no usage event, the timings on the finish event: as the engine sends it
                    assert b'"usage"' not in via.body
                    finish = via.body.split(b"\n\n")[-3]
                    assert b'"finish_reason":"length"' in finish and b'"timings":{' in finish
            plain = chat_body(3, stream=False)
            via_resp = await client.post(router.url + CHAT, json=plain)
            pool = via_resp.headers["x-spec-router-pool"]
            direct_resp = await client.post(engines.by_pool(pool).url + CHAT, json=plain)
            assert via_resp.status_code == direct_resp.status_code == 200
            assert masked(via_resp.content) == masked(direct_resp.content)

    asyncio.run(compare())
