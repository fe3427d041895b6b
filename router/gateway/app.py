"""The EPP process: the router's components, the gRPC services and the router's HTTP endpoints.

``EppApp`` builds a ``RouterApp`` (the settings, health registry and poller, tracker, keeper,
Decider, metrics, queue: the same objects ``spec-router serve`` routes with) and puts a
``Picker`` over them where the proxy would be. Its HTTP side is the router's control app
(``/health``, ``/ready``, ``/metrics``, ``/router/status``, ``/router/ui``...), with the EPP's
own part in ``/router/status`` under ``gateway``; ``/v1/*`` is not served here (the gateway
relays it). ``running`` starts what the decision needs as the proxy's lifecycle does, with the
same code (``router.lifecycle.deciding``: the poller, the members' timer and DNS discovery, the
keeper's timer, clients for ``/v1/models``), then the gRPC server and the lease sweep, and
stops them in the reverse order.

The pools may change while it runs (``router.membership``: DNS discovery, the admin API): the
endpoints follow the members (``Endpoints`` is a roster listener), a draining member gets no
new pick (the Decider reads the routable lists), and at a drain's deadline the leases still
held there are let go, since the gateway, not the EPP, carries those requests.
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
from router.gateway.endpoints import EndpointError, Endpoints, check_configured
from router.gateway.picker import GatewayMetrics, Picker
from router.gateway.service import GrpcServer
from router.lifecycle import deciding, lifespan
from router.members.member import Member
from router.membership import checked_url
from router.origin import Origin
from router.pools import BASELINE, POOLS, SPECULATIVE, Pool
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
    # A gateway connection whose access-log stream ended and that is not heard from again for
    # this long is gone: the leases it asked for are let go (router.gateway.connections). A
    # live Envoy reopens the stream at its next record.
    gone_grace: float = 5.0

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
        configured: dict[Pool, list[str]] = {
            SPECULATIVE: settings.speculative_urls,
            BASELINE: settings.baseline_urls,
        }
        try:
            check_configured(configured, settings.discovery)
        except EndpointError as exc:
            raise SettingsError(str(exc)) from None
        self.config = config if config is not None else EppConfig()
        self.router = router = RouterApp(settings, registry, clock)
        # the EPP sees no first byte (Envoy's record has the headers' time): no request in flight
        # is judged late, and the queue holds nothing (router.forward.admission.Strain)
        router.strain.flights = None
        roster = router.roster
        self.endpoints = Endpoints(router.pools, roster.members)
        roster.subscribe(self.endpoints.applied)
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
        # at a drain's deadline: the gateway carries the requests, the EPP stops counting them
        router.membership.cut_streams = self.picker.let_go
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

    def readiness(self) -> dict[str, Any]:
        return self.router.readiness()

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
        """As the proxy's, for a backend the gateway can be told to route to: an IP address
        (``EndpointError``, a 400), at an ``ip:port`` no other member has (a 409)."""
        self.endpoints.check(checked_url(url))
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
        """What the decision needs (as under ``serve``), then the gRPC server and the sweep."""
        router, config = self.router, self.config
        async with deciding(router, _models_client):
            grpc = GrpcServer(self.picker, config.grpc_host, config.grpc_port, config.gone_grace)
            sweep = asyncio.get_running_loop().create_task(self._sweep())
            try:
                await grpc.start()
                self.grpc = grpc
                keeper = router.keeper
                log.info(
                    "spec-router epp: gRPC on %s, policy=%s crossover=%s (%s), endpoints %s",
                    grpc.address,
                    router.decider.policy,
                    f"none measured up to {keeper.crossover}"
                    if keeper.no_crossover
                    else keeper.crossover,
                    keeper.source,
                    ", ".join(f"{u}={e}" for u, e in self.endpoints.all().items()) or "none yet",
                )
                yield self
            finally:
                await grpc.stop(config.drain, config.stop_grace)
                sweep.cancel()
                await asyncio.gather(sweep, return_exceptions=True)

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
        await lifespan(self.running, receive, send)


def _models_client(url: str) -> OriginPool:
    """A member's client, for ``/v1/models`` only: the gateway carries the traffic."""
    return OriginPool(Origin.parse(url), max_connections=4, max_idle=1, keepalive_expiry=4.0)


async def _refuse(send: Send, error: NotFound) -> None:
    body = error.body()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
