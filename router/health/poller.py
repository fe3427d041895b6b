"""The health poller: one loop per backend, started and stopped by the app's lifespan.

Each round probes the backend, folds the answer into its health state, and, when healthy,
scrapes ``/metrics`` for the engine-reported load. Rounds are jittered so that many router
replicas do not probe in lock-step.

Which probe (docs/engines.md, section 1): SGLang's ``/health`` is not cheap. It runs a
one-token generation (unless the engine is busy) and polls for output every second, so it
takes at least 1 s, and up to ``SGLANG_HEALTH_CHECK_TIMEOUT`` (20 s) before it answers 503;
on an idle engine every probe is a generation. SGLang 0.5.23 has ``/ready``, a flag check that
is also 503 while paused or unhealthy. So a backend is probed with ``GET /ready`` while it has
one, and with ``GET /health`` once ``/ready`` answered 404 (vLLM, SGLang 0.5.3). A ``/ready``
probe and vLLM's ``/health`` (a flag check) get ``HEALTH_TIMEOUT``; a ``/health`` probe of an
engine not known to be vLLM gets ``HEALTH_GENERATE_TIMEOUT``, longer than SGLang's own 20 s,
so that a busy engine whose forward takes seconds is not taken for a dead one. Which probe a
backend gets is found again after it refused a connection (it may come back as another
version).

At a backend's first healthy round, and again at the first after it refused a connection (it
restarted, maybe as another engine), the poller asks it what it is (``router.health.introspect``:
its model, whether it speculates, its identity), keeps its mode (``router.health.mode``) and
hands the description to ``on_info`` (``router.health.pool_check``); not before, so start-up
never waits on an engine still loading.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from router.health import engines as engine_metrics
from router.health.engines import EngineSample
from router.health.info import EngineInfo, Reply
from router.health.introspect import read_engine
from router.health.mode import ModeReading, engine_mode
from router.health.state import HealthRegistry
from router.origin import Origin
from router.pools import Pool
from router.upstream.client import OriginPool, Timeouts, UpstreamError

log = logging.getLogger("spec_router.health")

READY, HEALTH = b"/ready", b"/health"


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What a backend's /metrics said at one scrape."""

    running: int
    queued: int
    accept_length: float | None
    scraped_at: float
    # this replica's ``started`` count for the backend that the engine's numbers are taken to
    # include: the count at the scrape (vLLM refreshes its gauges every step), or at least
    # ``gauge_lag`` seconds before it (SGLang: every 40 decode steps, and a request admitted
    # in a prefill batch shows only later), so that its own recent requests are counted
    started_at_scrape: int
    flavor: str  # "sglang" or "vllm"
    # the most requests it runs at once, once seen: at two scrapes in a row it ran the same
    # number with others queued (a request waiting for the next iteration is queued for a
    # moment at any load; a queue that stays while the batch does not grow is the cap)
    cap: int | None = None


def included(history: deque[tuple[float, int]], since: float) -> int:
    """The ``started`` count as of the last scrape at or before ``since`` (the oldest one
    known when none is that old). Drops the points no later call can need."""
    while len(history) > 1 and history[1][0] <= since:
        history.popleft()
    return history[0][1]


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
        generate_timeout: float = 25.0,
        gauge_lag: float = 2.0,
        authorization: Mapping[str, bytes | None] | None = None,
        pools: Mapping[str, Pool] | None = None,
        on_info: Callable[[EngineInfo], object] | None = None,
        on_leave: Callable[[str], object] | None = None,
    ) -> None:
        self.urls = list(urls)
        self._pool = dict(pools or {})  # each backend's pool, for the mode check
        self.health = health
        self._started = started  # requests this router ever sent to each backend
        self.interval = interval
        self.timeout = timeout
        self.generate_timeout = generate_timeout
        self.gauge_lag = gauge_lag
        self._authorization = dict(authorization or {})  # each backend's pool key (/v1/models)
        self._served: dict[str, str] = {}  # the first model each backend lists
        self._history: dict[str, deque[tuple[float, int]]] = {}  # (scraped at, started then)
        self._probes: dict[str, bytes] = {}  # backends found without /ready: HEALTH
        self.scrape_metrics = scrape_metrics
        self.clock = clock
        self._loads: dict[str, EngineLoad] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._clients: dict[str, OriginPool] = {}
        self._samples: dict[str, EngineSample] = {}
        # what each engine said about itself, read once per engine start (``_introspect``)
        self._modes: dict[str, ModeReading] = {}
        self._infos: dict[str, EngineInfo] = {}
        self.on_info = on_info  # told each (new) description: the pool checks
        self.on_leave = on_leave  # told each backend that left
        self._started_polling = False

    @property
    def served_models(self) -> Mapping[str, str]:
        """The model each backend serves (the first of its ``/v1/models``), once read."""
        return self._served

    @property
    def loads(self) -> Mapping[str, EngineLoad]:
        """The latest engine-reported load per backend (only those that reported one)."""
        return self._loads

    @property
    def samples(self) -> Mapping[str, EngineSample]:
        """The latest parsed ``/metrics`` per backend (its counters: the fleet planner reads
        the traffic from them), once scraped."""
        return self._samples

    @property
    def infos(self) -> Mapping[str, EngineInfo]:
        """What each backend said about itself at its last start (``router.health.info``)."""
        return self._infos

    @property
    def modes(self) -> Mapping[str, ModeReading]:
        """Each backend's mode as its engine reported it (``router.health.mode``), once read."""
        return self._modes

    def start(self) -> None:
        self._started_polling = True
        for url in self.urls:
            self._poll(url)

    def _poll(self, url: str) -> None:
        self._clients[url] = OriginPool(
            Origin.parse(url), max_connections=2, max_idle=1, keepalive_expiry=self.interval * 2
        )
        self._tasks[url] = asyncio.get_running_loop().create_task(self._loop(url))

    def add(self, url: str, pool: Pool, authorization: bytes | None = None) -> None:
        """A backend that joined: polled from now on (at once, when polling has started)."""
        if url in self.urls:
            return
        self.urls.append(url)
        self._pool[url] = pool
        self._authorization[url] = authorization
        if self._started_polling:
            self._poll(url)

    def remove(self, url: str) -> None:
        """A backend that left: its loop stops and everything read of it is dropped."""
        if url not in self.urls:
            return
        self.urls.remove(url)
        self._pool.pop(url, None)
        self._authorization.pop(url, None)
        self._served.pop(url, None)
        self._history.pop(url, None)
        self._probes.pop(url, None)
        self._loads.pop(url, None)
        self._samples.pop(url, None)
        self._modes.pop(url, None)
        self._infos.pop(url, None)
        if self.on_leave is not None:
            self.on_leave(url)
        task = self._tasks.pop(url, None)
        client = self._clients.pop(url, None)
        if task is not None:
            task.cancel()
        if client is not None:
            if task is None:
                client.close()
            else:  # (once the round in progress has let go of its connection)
                task.add_done_callback(lambda _: client.close())

    async def stop(self) -> None:
        self._started_polling = False
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        for client in self._clients.values():
            client.close()

    async def _get(
        self,
        url: str,
        path: bytes,
        timeout: float | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> tuple[int, bytes]:
        timeout = self.timeout if timeout is None else timeout
        timeouts = Timeouts(self.timeout, timeout, timeout)
        async with asyncio.timeout(timeout):
            conn = await self._clients[url].request(b"GET", path, headers or [], b"", timeouts)
            try:
                return conn.status, await conn.read_all()
            finally:
                conn.release()

    def probe_of(self, url: str) -> tuple[bytes, float]:
        """The path that probes ``url`` and how long it may take (see the module docstring)."""
        path = self._probes.get(url, READY)
        seen = self._loads.get(url)
        cheap = path == READY or (seen is not None and seen.flavor == "vllm")
        return path, self.timeout if cheap else self.generate_timeout

    async def _probe(self, url: str) -> tuple[bool, str | None]:
        path, timeout = self.probe_of(url)
        try:
            status, _ = await self._get(url, path, timeout)
            if status == 404 and path == READY:  # no /ready here: /health is the probe
                self._probes[url] = HEALTH
                return await self._probe(url)
        except UpstreamError as exc:
            if exc.kind in ("connect", "connect_timeout"):
                # down or restarting (maybe as another version, or in the other mode): look
                # for /ready and read its mode again
                self._probes.pop(url, None)
                self._modes.pop(url, None)
            return False, str(exc)
        except TimeoutError:
            return False, f"{path.decode()} probe timed out after {timeout:g}s"
        return status == 200, None if status == 200 else f"{path.decode()}: HTTP {status}"

    async def check(self, url: str) -> None:
        """One round for one backend."""
        health = self.health
        ok, error = await self._probe(url)
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
        if ok and url not in self._served:
            await self._read_models(url)
        if ok and self.scrape_metrics:
            await self._scrape(url)
        if ok and url not in self._modes and url in self._clients:
            # its first answer, or its first since it refused a connection (restarted, maybe
            # as another engine): after the first scrape, so that routing sees its load as
            # soon as it is usable
            await self._introspect(url)

    async def _introspect(self, url: str) -> None:
        """Once per engine start: what it says it is (``router.health.info``), hence its mode
        (``router.health.mode``), handed to ``on_info`` (the pool checks, which log a backend
        in the wrong pool)."""
        info = await read_engine(url, lambda path: self._reply(url, path))
        if any(note.startswith("/v1/models: no answer") for note in info.notes):
            return  # the next healthy round asks again
        self._infos[url] = info
        self._modes[url] = engine_mode(info)
        if info.served_model is not None:
            self._served[url] = info.served_model
        if self.on_info is not None:
            self.on_info(info)

    async def _reply(self, url: str, path: str) -> Reply | None:
        """One GET for ``router.health.introspect``, with the backend's key; None on no answer."""
        auth = self._authorization.get(url)
        headers = [(b"authorization", auth)] if auth else []
        timeouts = Timeouts(self.timeout, self.timeout, self.timeout)
        client = self._clients.get(url)
        if client is None:  # (it left meanwhile)
            return None
        try:
            async with asyncio.timeout(self.timeout):
                conn = await client.request(b"GET", path.encode(), headers, b"", timeouts)
                try:
                    body = await conn.read_all()
                    named = {k.decode("latin-1").lower(): v.decode("latin-1")
                             for k, v in conn.headers}  # fmt: skip
                    return Reply(conn.status, body, named)
                finally:
                    conn.release()
        except (UpstreamError, TimeoutError):
            return None

    async def _read_models(self, url: str) -> None:
        """Once per backend: the model it serves, for requests that name none."""
        auth = self._authorization.get(url)
        try:
            status, body = await self._get(
                url, b"/v1/models", headers=[(b"authorization", auth)] if auth else None
            )
            if status == 200:
                self._served[url] = str(json.loads(body)["data"][0]["id"])
        except (UpstreamError, TimeoutError, ValueError, KeyError, IndexError, TypeError):
            pass  # the next healthy round tries again

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
        now = self.clock()
        history = self._history.setdefault(url, deque())
        history.append((now, started))
        lag = self.gauge_lag if sample.flavor == "sglang" else 0.0
        self._loads[url] = EngineLoad(
            running=running,
            queued=queued,
            accept_length=accept,
            scraped_at=now,
            started_at_scrape=included(history, now - lag),
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
