"""Small helpers for tests that talk HTTP to real servers: polling, metrics, raw streams."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx

from router.health import engines as engine_metrics

T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float = 10.0, interval: float = 0.02) -> T:
    """Poll ``check`` until it returns something truthy; fail with its last value."""
    deadline = time.monotonic() + timeout
    value = check()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value: {value!r})")
        time.sleep(interval)
        value = check()
    return value


async def await_for(
    check: Callable[[], Awaitable[T]], timeout: float = 10.0, interval: float = 0.02
) -> T:
    deadline = time.monotonic() + timeout
    value = await check()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value: {value!r})")
        await asyncio.sleep(interval)
        value = await check()
    return value


def sim_running(url: str) -> float:
    """The sim's ``sglang:num_running_reqs`` + ``sglang:num_queue_reqs``."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    sample = engine_metrics.parse(text)
    return sample.running + sample.queued


def sim_idle(url: str) -> Callable[[], bool]:
    """A ``wait_for`` check: the sim at ``url`` has nothing running or queued."""

    def check() -> bool:
        return sim_running(url) == 0

    return check


# a sim's stream that holds after a few tokens until the test lets it go (``sim_release``):
# still running when the test looks, however slow the host (router/sim/faults.py hold_after)
HOLD = {"x-sim-fault": "hold_after=10"}


def sim_held(url: str) -> int:
    """Requests held on the sim at ``url`` now, at their hold_after (its /sim/config)."""
    n: int = httpx.get(f"{url}/sim/config", timeout=5).json()["held"]
    return n


def sim_release(url: str) -> None:
    """Every request held on the sim at ``url`` generates on."""
    httpx.post(f"{url}/sim/config", json={"release": True}, timeout=5).raise_for_status()


def router_status(url: str) -> dict[str, Any]:
    status: dict[str, Any] = httpx.get(f"{url}/router/status", timeout=5).json()
    return status


def router_ready(url: str, every_pool: bool = False) -> bool:
    """``/ready`` says 200 (a pool is usable), and with ``every_pool`` both pools are."""
    try:
        r = httpx.get(f"{url}/ready", timeout=5)
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and (not every_pool or all(r.json()["pools"].values()))


def every_worker_ready(url: str, every_pool: bool = True) -> Callable[[], bool]:
    """A ``wait_for`` check for ``serve --workers N``: each worker runs its own health poller,
    so ``/ready`` from one says nothing of the others. Asks on new connections (the kernel
    hands each to some worker) until every worker has said its pools are usable."""
    seen: set[int] = set()

    def check() -> bool:
        try:
            status = httpx.get(f"{url}/router/status", timeout=5).json()
        except httpx.HTTPError:
            return False
        pools = [bool(p["usable"]) for p in status["pools"].values()]
        if all(pools) if every_pool else any(pools):
            seen.add(int(status["workers"]["this"]))
        count = int(status["workers"]["count"])
        return len(seen) == count

    return check


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total
