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
from collections.abc import Callable

from router.decide.snapshot import EngineLoad, Router
from router.forward.upstream import Origin, OriginPool, Timeouts, UpstreamError
from router.health import engines as engine_metrics
from router.health.engines import EngineSample

log = logging.getLogger("spec_router.health")


class HealthPoller:
    def __init__(
        self,
        router: Router,
        interval: float,
        timeout: float,
        scrape_metrics: bool,
        on_round: Callable[[str], None] | None = None,
    ) -> None:
        self.router = router
        self.interval = interval
        self.timeout = timeout
        self.scrape_metrics = scrape_metrics
        self.on_round = on_round  # called after each backend's round (for observers and tests)
        self._tasks: list[asyncio.Task[None]] = []
        self._clients: dict[str, OriginPool] = {}
        self._samples: dict[str, EngineSample] = {}

    def start(self) -> None:
        urls = [url for urls in self.router.pools.values() for url in urls]
        for url in urls:
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
                parts = []
                while chunk := await conn.read():
                    parts.append(chunk)
                return conn.status, b"".join(parts)
            finally:
                conn.release()

    async def check(self, url: str) -> None:
        """One round for one backend."""
        router = self.router
        try:
            status, _ = await self._get(url, b"/health")
            ok, error = status == 200, None if status == 200 else f"HTTP {status}"
        except (UpstreamError, TimeoutError) as exc:
            ok, error = False, str(exc) or "health probe timed out"
        previous = router.health.states[url].state
        router.health.probe(url, ok, router.clock(), error)
        state = router.health.states[url].state
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
        if self.on_round is not None:
            self.on_round(url)

    async def _scrape(self, url: str) -> None:
        router = self.router
        started = router.tracker.started[url]
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
        if accept is None and sample.accept_length is None and url in router.engine:
            # Counters (vLLM, llama.cpp) give nothing over an interval without speculative
            # steps; an idle engine keeps its last value, as SGLang's gauge does.
            accept = router.engine[url].accept_length
        self._samples[url] = sample
        router.engine[url] = EngineLoad(
            running=round(sample.running),
            queued=round(sample.queued),
            accept_length=accept,
            scraped_at=router.clock(),
            started_at_scrape=started,
            flavor=sample.flavor,
        )

    async def _loop(self, url: str) -> None:
        while True:
            try:
                await self.check(url)
            except Exception:  # keep polling whatever happens
                log.exception("health round for %s failed", url)
            await asyncio.sleep(self.interval * random.uniform(0.8, 1.2))
