"""The health poller: one loop per backend, started and stopped by the app's lifespan.

Each round probes ``GET /health`` (never a generating endpoint such as SGLang's
``/health_generate``: a probe must not slow the engine), folds the answer into the backend's
health state, and, when healthy, scrapes ``/metrics`` for the engine-reported load. Rounds are
jittered so that many router replicas do not probe in lock-step.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from router.forward.upstream import Origin, OriginPool, Timeouts, UpstreamError
from router.health import engines as engine_metrics
from router.health.engines import EngineSample
from router.health.state import HealthRegistry

log = logging.getLogger("spec_router.health")


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What a backend's /metrics said at one scrape."""

    running: int
    queued: int
    accept_length: float | None
    scraped_at: float
    started_at_scrape: int  # this replica's `started` count for the backend at that moment
    flavor: str  # "sglang" or "vllm"
    # the most requests it runs at once, once seen: at two scrapes in a row it ran the same
    # number with others queued (a request waiting for the next iteration is queued for a
    # moment at any load; a queue that stays while the batch does not grow is the cap)
    cap: int | None = None


def cap_after(previous: EngineLoad | None, running: int, queued: int) -> int | None:
    """The engine's cap on running requests, once seen (see ``EngineLoad.cap``)."""
    cap = None if previous is None else previous.cap
    if previous is not None and queued >= 2 and previous.queued >= 2:
        if running == previous.running and running > (cap or 0):
            return running
    return cap


class HealthPoller:
    """The one writer of active health results and of the engines' reported loads.

    ``health`` is shared with the proxy, which adds passive ejections; ``loads`` is this
    poller's own, read by routing, the keeper and the status document.
    """

    def __init__(
        self,
        urls: list[str],
        health: HealthRegistry,
        started: Mapping[str, int],
        interval: float,
        timeout: float,
        scrape_metrics: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.urls = urls
        self.health = health
        self._started = started  # requests this router ever sent to each backend
        self.interval = interval
        self.timeout = timeout
        self.scrape_metrics = scrape_metrics
        self.clock = clock
        self._loads: dict[str, EngineLoad] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._clients: dict[str, OriginPool] = {}
        self._samples: dict[str, EngineSample] = {}

    @property
    def loads(self) -> Mapping[str, EngineLoad]:
        """The latest engine-reported load per backend (only those that reported one)."""
        return self._loads

    def start(self) -> None:
        for url in self.urls:
            self._clients[url] = OriginPool(
                Origin.parse(url), max_connections=2, max_idle=1, keepalive_expiry=self.interval * 2
            )
            self._tasks.append(asyncio.get_running_loop().create_task(self._loop(url)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for client in self._clients.values():
            client.close()

    async def _get(self, url: str, path: bytes) -> tuple[int, bytes]:
        timeouts = Timeouts(self.timeout, self.timeout, self.timeout)
        async with asyncio.timeout(self.timeout):
            conn = await self._clients[url].request(b"GET", path, [], b"", timeouts)
            try:
                return conn.status, await conn.read_all()
            finally:
                conn.release()

    async def check(self, url: str) -> None:
        """One round for one backend."""
        health = self.health
        try:
            status, _ = await self._get(url, b"/health")
            ok, error = status == 200, None if status == 200 else f"HTTP {status}"
        except (UpstreamError, TimeoutError) as exc:
            ok, error = False, str(exc) or "health probe timed out"
        previous = health.states[url].state
        health.probe(url, ok, self.clock(), error)
        state = health.states[url].state
        if state is not previous:
            level = logging.INFO if ok else logging.WARNING
            log.log(
                level,
                "backend %s: %s -> %s%s",
                url,
                previous,
                state,
                f" ({error})" if error else "",
            )
        if ok and self.scrape_metrics:
            await self._scrape(url)

    async def _scrape(self, url: str) -> None:
        started = self._started[url]
        try:
            status, body = await self._get(url, b"/metrics")
        except (UpstreamError, TimeoutError):
            return
        if status != 200:
            return
        sample = engine_metrics.parse(body.decode("utf-8", "replace"))
        if sample.flavor == "unknown":
            return
        accept = engine_metrics.interval_accept_length(self._samples.get(url), sample)
        last = self._loads.get(url)
        if accept is None and sample.accept_length is None and last is not None:
            # Counters (vLLM, llama.cpp) give nothing over an interval without speculative
            # steps; an idle engine keeps its last value, as SGLang's gauge does.
            accept = last.accept_length
        self._samples[url] = sample
        running, queued = round(sample.running), round(sample.queued)
        cap = cap_after(self._loads.get(url), running, queued)
        self._loads[url] = EngineLoad(
            running=running,
            queued=queued,
            accept_length=accept,
            scraped_at=self.clock(),
            started_at_scrape=started,
            flavor=sample.flavor,
            cap=cap,
        )

    async def _loop(self, url: str) -> None:
        while True:
            try:
                await self.check(url)
            except Exception:  # keep polling whatever happens
                log.exception("health round for %s failed", url)
            await asyncio.sleep(probe_delay(self.interval))


def probe_delay(interval: float, rng: random.Random | None = None) -> float:
    """The wait before a backend's next probe: ``interval`` +-20%, so replicas drift apart."""
    return interval * (rng or random).uniform(0.8, 1.2)
