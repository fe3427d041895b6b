"""Busy polling in a served router: it spins after traffic, parks when traffic stops, and is
off with SPEC_ROUTER_BUSY_POLL_US=0 (router/fastpath/busypoll.py)."""

from __future__ import annotations

import openai
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import RouterFactory
from tests.support.http import router_status, wait_for

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def _complete(url: str, n: int) -> None:
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
        for _ in range(n):
            reply = client.chat.completions.create(
                model="sim",
                messages=MESSAGES,
                max_tokens=4,
            )
            assert reply.usage is not None and reply.usage.completion_tokens == 4


def test_the_router_polls_after_traffic_and_parks_when_it_stops(
    start_router: RouterFactory,
) -> None:
    router = start_router(busy_poll_us="100000")  # 100 ms: long enough to be seen spinning
    _complete(router.url, 5)
    status = router_status(router.url)
    assert status["busy_poll"]["window_us"] == 100_000
    assert status["busy_poll"]["turns"] > 0
    # no more requests (health probes and status requests do not count): it parks
    wait_for(lambda: not router_status(router.url)["busy_poll"]["spinning"])
    parked = router_status(router.url)["busy_poll"]["turns"]
    assert router_status(router.url)["busy_poll"]["turns"] == parked
    assert router_status(router.url)["in_flight"]["total"] == 0


def test_busy_polling_can_be_turned_off(start_router: RouterFactory) -> None:
    router = start_router(busy_poll_us="0")
    _complete(router.url, 3)
    status = router_status(router.url)
    assert status["busy_poll"] == {"window_us": 0, "spinning": False, "turns": 0}
