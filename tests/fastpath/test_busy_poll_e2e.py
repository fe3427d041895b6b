"""Busy polling in a served router: it spins after traffic, parks when traffic stops, holds while
another busy process shares its core, and is off with SPEC_ROUTER_BUSY_POLL_US=0
(router/fastpath/busypoll.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

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
    # 100 ms: long enough to be seen spinning; never held, as the test's own processes (sims,
    # clients) may share the router's core (holding has its own test below)
    router = start_router(busy_poll_us="100000", busy_poll_yield="false")
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
    assert status["busy_poll"] == {
        "window_us": 0,
        "spinning": False,
        "turns": 0,
        "held": False,
        "involuntary_switches_per_s": None,
        "waiting_for_core": None,
    }


def test_busy_polling_holds_while_a_busy_process_shares_the_routers_core(
    start_router: RouterFactory,
) -> None:
    router = start_router(busy_poll_us="50")
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(router.pid, {core})  # its event loop's thread
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(hog.pid, {core})
        deadline = time.monotonic() + 30
        while not (busy := router_status(router.url)["busy_poll"])["held"]:
            assert time.monotonic() < deadline, busy
            _complete(router.url, 5)  # a router with work to do is what the neighbour preempts
        assert busy["involuntary_switches_per_s"] > 100 or busy["waiting_for_core"] > 0.01
        assert not busy["spinning"]
        turns = busy["turns"]
        _complete(router.url, 5)
        assert router_status(router.url)["busy_poll"]["turns"] == turns  # no spin while held
    finally:
        hog.kill()
        hog.wait()
