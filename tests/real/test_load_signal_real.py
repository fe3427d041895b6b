"""``LOAD_SIGNAL=engine`` on llama.cpp: requests sent to the engine around this router count."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from tests.real.conftest import Engines, RouterFactory
from tests.real.drive import CHAT, chat_body, post
from tests.support.http import await_for

TIMEOUT = httpx.Timeout(connect=10.0, read=120.0, write=30.0, pool=None)


def test_engine_signal_counts_what_llamacpp_runs(
    engines: Engines, start_router: RouterFactory
) -> None:
    common = {"POLICY": "spillover", "CROSSOVER": "2", "EXPLORE_SHARE": "0"}
    by_engine = start_router(LOAD_SIGNAL="engine", **common)
    by_own_count = start_router(LOAD_SIGNAL="local", **common)

    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:

            async def spec_engine() -> dict[str, Any] | None:
                status = (await client.get(by_engine.url + "/router/status")).json()
                engine: dict[str, Any] | None = status["pools"]["speculative"]["backends"][0][
                    "engine"
                ]
                return engine

            # three long streams straight to the speculative engine, not through a router
            around = [
                asyncio.create_task(
                    post(client, engines.speculative.url + CHAT, chat_body(i, max_tokens=480))
                )
                for i in range(3)
            ]
            try:
                seen = await await_for(
                    lambda: _running(spec_engine, at_least=3), timeout=30, interval=0.1
                )
                assert seen is not None and seen["flavor"] == "llamacpp"
                engine_says = await post(client, by_engine.url + CHAT, chat_body(0, max_tokens=8))
                own_count = await post(client, by_own_count.url + CHAT, chat_body(0, max_tokens=8))
            finally:
                for task in around:
                    task.cancel()
                await asyncio.gather(*around, return_exceptions=True)
            assert engine_says.ok and engine_says.pool == "baseline"
            assert engine_says.headers["x-spec-router-reason"] == "above_crossover"
            assert own_count.ok and own_count.pool == "speculative"  # blind to the three
            # the abandoned streams end in the engine too, and the signal follows
            await await_for(lambda: _running(spec_engine, at_most=0), timeout=30, interval=0.1)
            again = await post(client, by_engine.url + CHAT, chat_body(0, max_tokens=8))
            assert again.ok and again.pool == "speculative"

    asyncio.run(scenario())


async def _running(
    probe: Callable[[], Awaitable[dict[str, Any] | None]], at_least: int = 0, at_most: int = 1 << 30
) -> dict[str, Any] | None:
    engine = await probe()
    if engine is None:
        return None
    load = engine["running"] + engine["queued"]
    return engine if at_least <= load <= at_most else None
