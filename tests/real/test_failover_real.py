"""A llama-server killed under the router: the stream on it breaks visibly, the rest fail over,
and it comes back once it has loaded (it answers 503 "Loading model" until then)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from tests.real.conftest import Engines, RouterFactory
from tests.real.drive import CHAT, chat_body, post
from tests.support.http import router_status, wait_for

TIMEOUT = httpx.Timeout(connect=10.0, read=120.0, write=30.0, pool=None)


def spec_backend(router_url: str) -> dict[str, Any]:
    backend: dict[str, Any] = router_status(router_url)["pools"]["speculative"]["backends"][0]
    return backend


def test_killed_engine_fails_over_and_comes_back(
    engines: Engines, start_router: RouterFactory
) -> None:
    router = start_router(EXPLORE_SHARE="0")
    spec = engines.speculative

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            first = await post(client, router.url + CHAT, chat_body(0, max_tokens=16))
            assert first.ok and first.pool == "speculative"

            # a long stream on the speculative engine, which dies under it
            got_tokens = asyncio.Event()
            body = chat_body(1, max_tokens=400)
            lines: list[bytes] = []

            async def long_stream() -> None:
                async with client.stream("POST", router.url + CHAT, json=body) as resp:
                    assert resp.headers["x-spec-router-pool"] == "speculative"
                    async for line in resp.aiter_lines():
                        lines.append(line.encode())
                        if len(lines) > 20:
                            got_tokens.set()

            streaming = asyncio.create_task(long_stream())
            await asyncio.wait_for(got_tokens.wait(), 30)
            spec.kill()
            await asyncio.wait_for(streaming, 30)
            tail = [line for line in lines if line.startswith(b"data:")][-1]
            assert b'"error"' in tail and b"[DONE]" not in b"".join(lines)

            # the rest go to the baseline engine, and every one of them succeeds
            after = [
                await post(client, router.url + CHAT, chat_body(i, max_tokens=16)) for i in range(3)
            ]
            assert all(r.ok and r.pool == "baseline" for r in after), [
                (r.pool, r.error) for r in after
            ]
            assert {r.headers["x-spec-router-reason"] for r in after} <= {"failover", "retry"}

    asyncio.run(scenario())
    wait_for(lambda: spec_backend(router.url)["state"] == "unhealthy", timeout=15)
    assert router_status(router.url)["in_flight"]["speculative"] == 0

    # back on the same port: it answers 503 while loading, and the router sends it nothing then
    spec.start(wait=False)
    loading: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            resp = httpx.get(spec.url + "/health", timeout=2)
        except httpx.HTTPError:
            time.sleep(0.01)
            continue
        if resp.status_code == 200:
            break
        loading.append(f"{resp.status_code} {resp.text}")
        time.sleep(0.01)
    assert loading and all(s.startswith("503 ") and "Loading model" in s for s in loading), loading

    async def recover() -> list[str | None]:
        pools: list[str | None] = []
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            give_up = time.monotonic() + 60
            while time.monotonic() < give_up:
                r = await post(client, router.url + CHAT, chat_body(2, max_tokens=8))
                assert r.ok, r.error
                # no request found the engine loading and had to be sent again
                assert r.headers["x-spec-router-reason"] != "retry"
                pools.append(r.pool)
                if r.pool == "speculative":
                    break
        return pools

    pools = asyncio.run(recover())
    assert pools[-1] == "speculative", pools
    assert spec_backend(router.url)["state"] == "healthy"
