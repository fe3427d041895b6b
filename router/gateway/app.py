"""The EPP process: the router's components, the gRPC services and the router's HTTP endpoints.

``EppApp`` builds a ``RouterApp`` (the settings, health registry and poller, tracker, keeper,
Decider, metrics, queue: the same objects ``spec-router serve`` routes with) and puts a
``Picker`` over them where the proxy would be. Its HTTP side is the router's control app
(``/health``, ``/ready``, ``/metrics``, ``/router/status``, ``/router/ui``...), with the EPP's
own part in ``/router/status`` under ``gateway``; ``/v1/*`` is not served here (the gateway
relays it). ``running`` starts the poller, the keeper's timer, the lease sweep and the gRPC
server, and stops them in the reverse order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from router.app import RouterApp
from router.asgi import Receive, Scope, Send
from router.control.app import build_control_app
from router.control.feed import Feed
from router.decide import table as tables
from router.errors import NotFound
from router.gateway.endpoints import EndpointError, Endpoints
from router.gateway.picker import GatewayMetrics, Picker
from router.gateway.service import GrpcServer
from router.lifecycle import ensure_logging, keep_learning
from router.members.member import Member
from router.origin import Origin
from router.pools import POOLS, Pool
from router.settings import Settings, SettingsError
from router.upstream.client import OriginPool

log = logging.getLogger("spec_router.gateway")


@dataclass(frozen=True, slots=True)
class EppConfig:
    """Where the gRPC services listen, and the bound on records that never come."""

    grpc_host: str = "127.0.0.1"
    grpc_port: int = 9002  # llm-d's and the Inference Extension's EPP port
    # A lease whose access-log record has not come after this long is let go (and counted):
    # generous, since a request may legitimately last that long (a long non-streamed answer).
    lease_max_age: float = 3600.0
    # Stopping, the EPP reports NOT_SERVING and goes on serving this long, so that Envoy's
    # health check (deploy/envoy/envoy.yaml: every 1 s, out after 2 failures) stops sending it
    # requests before the port closes: no request is caught mid-way by the stop.
    drain: float = 3.0
    # Then, seconds the ext_proc streams still open get to finish.
    stop_grace: float = 5.0

    @property
    def sweep_interval(self) -> float:
        return min(5.0, self.lease_max_age / 4)


class EppApp:
    """The Endpoint Picker: ``Controlled`` for the router's endpoints, ASGI for their server."""

    def __init__(
        self,
        settings: Settings,
        config: EppConfig | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for pool in POOLS:
            if settings.pool_model_map(pool):
                raise SettingsError(
                    f"SPEC_ROUTER_{pool.upper()}_MODEL_MAP: per-pool model names need the "
                    "proxy, which maps the name back in responses; the EPP never reads them"
                )
        self.config = config if config is not None else EppConfig()
        self.router = router = RouterApp(settings, registry, clock)
        try:
            self.endpoints = Endpoints(router.pools)
        except EndpointError as exc:
            raise SettingsError(str(exc)) from None
        self.metrics = GatewayMetrics(router.registry)
        self.picker = Picker(
            settings,
            router.decider,
            router.tracker,
            router.health,
            router.admission,
            router.observers,
            self.endpoints,
            self.metrics,
            clock,
            abort_lag=router.abort_lag,
            default_model=router.default_model,
        )
        self.settings = settings
        self.feed: Feed = router.feed
        self.grpc: GrpcServer | None = None
        self.control = build_control_app(self)

    # -- Controlled (router.control.controlled) ------------------------------------------------
    def status(self) -> dict[str, Any]:
        document = self.router.status()
        document["gateway"] = {
            "grpc": None if self.grpc is None else self.grpc.status(),
            "endpoints": self.endpoints.all(),
            "lease_max_age_s": self.config.lease_max_age,
            **self.picker.status(),
        }
        return document

    def usable_pools(self) -> dict[Pool, bool]:
        return self.router.usable_pools()

    def metrics_text(self) -> bytes:
        return self.router.metrics_text()

    def table(self) -> tables.Table:
        return self.router.table()

    def replace_table(self, raw: Any) -> tables.Table:
        return self.router.replace_table(raw)

    def pin_crossover(self, value: int) -> None:
        self.router.pin_crossover(value)

    async def list_models(self) -> dict[str, Any]:
        return await self.router.list_models()

    def add_backend(self, pool: Pool, url: str) -> Member:
        return self.router.add_backend(pool, url)

    def remove_backend(self, pool: Pool, url: str) -> Member:
        return self.router.remove_backend(pool, url)

    def members(self, pool: Pool) -> list[Member]:
        return self.router.members(pool)

    def in_flight(self) -> Mapping[str, int]:
        return self.router.in_flight()

    def plan(self) -> dict[str, Any]:
        return self.router.plan()

    @property
    def clock(self) -> Callable[[], float]:
        return self.router.clock

    def closing(self) -> None:
        self.router.closing()

    # -- lifecycle -----------------------------------------------------------------------------
    @asynccontextmanager
    async def running(self) -> AsyncIterator[EppApp]:
        router, config = self.router, self.config
        settings = router.settings
        ensure_logging(settings.log_level)
        loop = asyncio.get_running_loop()
        for pool in POOLS:  # (for /v1/models only: the gateway carries the traffic)
            for url in router.pools[pool]:
                router.clients[url] = OriginPool(
                    Origin.parse(url), max_connections=4, max_idle=1, keepalive_expiry=4.0
                )
        grpc = GrpcServer(self.picker, config.grpc_host, config.grpc_port)
        router.poller.start()
        tasks = [loop.create_task(keep_learning(router.keeper)), loop.create_task(self._sweep())]
        try:
            await grpc.start()
            self.grpc = grpc
            log.info(
                "spec-router epp: gRPC on %s, policy=%s crossover=%d (%s), endpoints %s",
                grpc.address,
                router.decider.policy,
                router.keeper.crossover,
                router.keeper.source,
                ", ".join(f"{u}={e}" for u, e in self.endpoints.all().items()),
            )
            yield self
        finally:
            await grpc.stop(config.drain, config.stop_grace)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            router.keeper.persist()
            await router.poller.stop()
            for client in router.clients.values():
                client.close()
            router.clients.clear()

    async def _sweep(self) -> None:
        config = self.config
        while True:
            await asyncio.sleep(config.sweep_interval)
            self.picker.expire(config.lease_max_age)

    # -- ASGI ----------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            if path.startswith("/v1/") and path != "/v1/models":
                error = NotFound(f"{path}: the EPP routes; send requests to the gateway")
                await _refuse(send, error)
                return
            await self.control(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1003})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        message = await receive()
        assert message["type"] == "lifespan.startup"
        started = False
        try:
            async with self.running():
                await send({"type": "lifespan.startup.complete"})
                started = True
                message = await receive()
                assert message["type"] == "lifespan.shutdown"
        except BaseException as exc:
            failed = "lifespan.shutdown.failed" if started else "lifespan.startup.failed"
            await send({"type": failed, "message": f"{type(exc).__name__}: {exc}"})
            raise
        await send({"type": "lifespan.shutdown.complete"})


async def _refuse(send: Send, error: NotFound) -> None:
    body = error.body()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
