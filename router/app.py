"""The router's ASGI application: wires the components and dispatches ASGI.

``create_app(settings)`` wires the pieces; the lifespan starts and stops everything with I/O
(upstream clients, the health poller, the timers: ``router.lifecycle``), and
``/router/status`` is laid out by ``router.control.status``. ``/v1/*`` goes straight to the
raw-ASGI proxy; the router's own endpoints (``/health``, ``/ready``, ``/metrics``,
``/router/*``, ``/v1/models``) are a FastAPI app, off the hot path. ``app`` (made on first use,
at the bottom) serves ``uvicorn router.app:app``: one process, whose in-flight counts live in
it. ``uvicorn --workers N`` is refused (each worker would route with its own counts);
``spec-router serve --workers N`` (``router.process.supervisor``) runs N workers over one shared
count, and then each ``RouterApp`` is given its ``WorkerContext`` (``router.workers``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from router import lifecycle
from router.account.inflight import InflightTracker
from router.account.metrics import MembersOnly, RouterMetrics, StateCollector
from router.account.outcome import Outcome
from router.account.recent import RecentWindow
from router.account.shared import CrossoverBoard, SharedStore, SharedTracker
from router.asgi import Receive, Scope, Send
from router.control.app import build_control_app
from router.control.feed import Feed
from router.control.live import live_document
from router.control.models import list_models
from router.control.status import readiness, router_status
from router.decide import table as tables
from router.fastpath import lean
from router.fastpath.busypoll import BusyPoll, ShareWatch
from router.forward.admission import Admission, Strain
from router.forward.callback import CallbackStreams, callback_protocol
from router.forward.decider import Decider
from router.forward.ended import Ended
from router.forward.proxy import Proxy
from router.health.notices import Notices
from router.health.poller import HealthPoller
from router.health.pool_check import PoolCheck
from router.health.state import HealthConfig, HealthRegistry
from router.learn.keeper import CrossoverKeeper
from router.members.discovery import Discovery
from router.members.dns import resolver_for
from router.members.grace import result_of
from router.members.member import Changes, Member
from router.members.roster import Roster
from router.members.store import LocalStore, Store
from router.members.targets import configured
from router.membership import Membership
from router.planning.metrics import PlanCollector
from router.planning.service import FleetPlanner
from router.pools import BASELINE, POOLS, SPECULATIVE, Pool
from router.settings import Settings, SettingsError, load_settings, parse_dns_server
from router.upstream.client import OriginPool
from router.workers import TableExchange, WorkerContext, refuse_uvicorn_workers


class RouterApp:
    """The router: builds each component with what it reads, and serves ASGI.

    Every piece of state has one writer: the tracker (in-flight counts, written by the proxy's
    leases), the health registry (active probes from the poller, passive ejections from the
    proxy), the poller (engine loads), the keeper (the crossover and the curves) and the decider
    (the policy's memory). Everything else reads them through their views.
    """

    def __init__(
        self,
        settings: Settings,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        worker: WorkerContext | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.worker = worker
        self.registry = registry if registry is not None else CollectorRegistry()
        # The members (router.members): the configured URLs, then what discovery and the admin
        # API change. Every component starts empty and takes each backend as it joins
        # (router.membership), the configured ones included, when the roster syncs below.
        seeds, watches = configured(
            {SPECULATIVE: settings.speculative_urls, BASELINE: settings.baseline_urls},
            settings.discovery,
        )
        self.store: Store
        if worker is None:
            self.store = LocalStore(settings.max_backends)
            for pool, url in seeds:
                self.store.join(pool, url, "static", None, clock())
        else:  # (the supervisor put the configured ones in the shared table)
            self.store = SharedStore(worker.table, worker.slot)
        self.roster = Roster(self.store)
        # the routable URLs of each pool: the roster's lists, updated in place
        self.pools: dict[Pool, list[str]] = self.roster.pools
        self.tracker = (
            InflightTracker([], clock)
            if worker is None
            else SharedTracker([], worker.table, worker.slot, clock)
        )
        self.health = HealthRegistry(
            [],
            HealthConfig(
                startup_grace=settings.startup_grace,
                fall=settings.fall,
                rise=settings.rise,
                eject_base=settings.eject_base,
                eject_max=settings.eject_max,
                ramp_seconds=settings.ramp_seconds,
            ),
            clock(),
        )
        # warnings for the operator (a backend that cannot be reached, the pools' checks),
        # listed in /router/status, /ready and on the live page (router.health.notices)
        self.notices = Notices()
        # the pools against what their engines say, once each answers (router.health.pool_check)
        self.pool_check = PoolCheck(
            self.pools,
            mapped=bool(settings.speculative_model_map or settings.baseline_model_map),
            quiet=worker is not None and not worker.leader,
        )
        self.poller = HealthPoller(
            [],
            self.health,
            self.tracker.started,
            settings.health_interval,
            settings.health_timeout,
            settings.scrape_metrics,
            clock,
            generate_timeout=settings.health_generate_timeout,
            gauge_lag=settings.engine_gauge_lag,
            notices=self.notices,
            on_info=self.pool_check.update,
            on_leave=self.pool_check.forget,
        )
        self.keeper = CrossoverKeeper(
            settings,
            self.tracker,
            self.poller.loads,
            load_table(settings),
            clock,
            board=None if worker is None else CrossoverBoard(worker.table),
            leader=worker is None or worker.leader,
        )
        self.exchange = None if worker is None else TableExchange(worker)
        self.decider = Decider(
            self.pools,
            self.tracker,
            self.health,
            self.keeper,
            self.poller.loads,
            policy=settings.policy,
            hysteresis=settings.hysteresis,
            load_signal=settings.load_signal,
            clock=clock,
            explore_share=settings.explore_share if settings.learn else 0.0,
            explore_band=settings.explore_band,
            slo_ttft=settings.slo_ttft_ms / 1000,
            slo_tpot=settings.slo_tpot_ms / 1000,
        )
        slo = (settings.slo_ttft_ms / 1000, settings.slo_tpot_ms / 1000)
        self.metrics = RouterMetrics(self.registry, slo=slo)
        meter = self.metrics.queue_meter() if worker is not None else None
        # the queue holds a request only under measured overload, with capacity steady
        self.strain = Strain(*slo, clock, self.tracker.flights)
        self.admission = Admission(
            settings.queue_size, meter, self.strain, self.capacity_steady, settings.queue_timeout
        )
        self.state = StateCollector(
            self.tracker,
            self.health,
            self.keeper,
            self.poller.loads,
            settings.policy,
            settings.load_signal,
            clock,
            self.admission if worker is None else None,  # (else: in the merged files)
            slo=slo,
            members=self.roster,
            modes=self.poller.modes,
        )
        self.recent = RecentWindow(clock, slo=slo)
        self.registry.register(self.state)
        # with ``defer_accounting`` (on by default; never under --workers, whose /metrics
        # merges every worker's files) the accounting nothing on a request's path reads runs at
        # later turns of the loop (router.forward.ended), settled before anything reads it. (The
        # keeper's traffic averages, which routing reads, are fed at once: ``observe_traffic``.)
        self.ended: Ended[Outcome] | None = None
        self.observers: list[Callable[[Outcome], None]]
        if worker is None and settings.defer_accounting:
            self.ended = Ended(
                [self.metrics.observe, self.keeper.observe_curves, self.recent.observe], clock
            )
            self.observers = [self.keeper.observe_traffic, self.ended.add]
            self.keeper.settle = self.ended.settle
        else:
            self.observers = [self.metrics.observe, self.keeper.observe, self.recent.observe]
        if settings.queue_size > 0:
            self.observers.append(self.strain.observe)
        # The fleet planner (router.planning), when on: the leader plans under --workers
        self.planner: FleetPlanner | None = None
        if settings.planner != "off":
            self.planner = FleetPlanner(
                settings,
                self.roster,
                self.health.states,
                self.tracker,
                self.poller,
                self.keeper,
                clock,
                writer=worker is None or worker.leader,
                shared=None if worker is None else worker.rundir / "plan.json",
            )
            self.observers.append(self.planner.observe)
            self.registry.register(PlanCollector(self.planner.document))
        self.feed = Feed(self.ui_snapshot, settings.ui_interval)
        self.clients: dict[str, OriginPool] = {}
        owner = worker is None or worker.leader  # discovers, and removes drained members
        discovery = None
        if watches and owner:
            metrics = self.metrics
            discovery = Discovery(
                watches,
                self.store,
                self.roster.sync,
                resolver_for(
                    [parse_dns_server(s) for s in settings.dns_servers],
                    settings.discovery_interval,
                ),
                settings.discovery_interval,
                settings.discovery_grace,
                settings.drain_timeout,
                clock,
                observe=lambda w, state, answer: metrics.discovered(
                    w.pool, w.name, result_of(answer), len(state.addresses), state.failing
                ),
            )
        self.membership = Membership(
            settings,
            self.store,
            self.roster,
            self.tracker,
            self.health,
            self.poller,
            self.metrics,
            self.decider,
            self.clients,
            clock,
            owner=owner,
            discovery=discovery,
            shared_status=None if worker is None else worker.discovery_status,
        )
        self.membership.settle = self.settle
        self.roster.subscribe(self._forget_strain)
        self.roster.sync()  # the configured members join
        self.proxy: Proxy | None = None
        self.busy: BusyPoll | None = None
        self.share: ShareWatch | None = None  # whether the core looks shared (busy polling holds)
        self.streams = CallbackStreams()  # streams served from callbacks (when on)
        if self.ended is not None:
            self.streams.busy = self.ended.busy
        self.control = build_control_app(self)

    def _forget_strain(self, changes: Changes) -> None:
        for m in changes.removed:
            self.strain.forget(m.url)

    def capacity_steady(self) -> bool:
        """Whether the engines' capacity is steady: every member active (none draining) and
        usable (none loading, down or ejected), and no switch the planner advised under way
        (draining, restarting or loading). The router's queue holds requests only then:
        capacity on its way is no reason to answer 503. (An engine ramping in after an
        ejection takes traffic already: not counted.)"""
        now = self.clock()
        health = self.health
        for url, member in self.roster.members.items():
            if not member.active or url not in health.states or not health.usable(url, now):
                return False
        switch = None if self.planner is None else self.planner.switch
        return switch is None or switch.phase == "advised"

    # -- views and actions for the control endpoints (router.control.controlled.Controlled) ---
    def settle(self) -> None:
        """Run the accounting still queued for later turns (``router.forward.ended``): what
        reads the observers' state reads every finished request."""
        if self.ended is not None:
            self.ended.settle()

    def status(self) -> dict[str, Any]:
        self.settle()
        return router_status(self)

    def ui_snapshot(self) -> dict[str, Any]:
        """One snapshot for the live page (made on the feed's timer, never per request)."""
        return live_document(self.status(), self.keeper.curves(), self.recent.series(), self.plan())

    def closing(self) -> None:
        """The server is about to stop: end the live page's feeds, which would otherwise hold
        the graceful shutdown open (``router.serving`` calls this before uvicorn's shutdown)."""
        self.feed.close()

    # -- views for the status document and the proxy (router.control.status, router.lifecycle)
    def connections(self, url: str) -> dict[str, int]:
        client = self.clients.get(url)
        if client is None:
            return {"open": 0, "idle": 0, "busy": 0, "connecting": 0}
        opened, idle = client.open_connections, client.idle_connections
        return {
            "open": opened,
            "idle": idle,
            "busy": opened - idle,
            "connecting": client.connecting,
        }

    def default_model(self, pool: Pool, url: str) -> str | None:
        """The model a request that names none is sent as: the pool's, when its model map
        names one, else what the backend lists first at /v1/models."""
        served = set(self.settings.pool_model_map(pool).values())
        if len(served) == 1:
            return served.pop()
        return self.poller.served_models.get(url)

    def abort_lag(self, url: str) -> float:
        """SGLang goes on running a request whose client left for 2 s (a started stream) or
        until its next 4-s poll; vLLM aborts at once (docs/engines.md, section 8)."""
        seen = self.poller.loads.get(url)
        return self.settings.engine_abort_lag if seen and seen.flavor == "sglang" else 0.0

    # -- the rest of Controlled ----------------------------------------------------------------
    def readiness(self) -> dict[str, Any]:
        return readiness(self)

    def usable_pools(self) -> dict[Pool, bool]:
        return {pool: self.decider.pool_usable(pool) for pool in POOLS}

    def metrics_text(self) -> bytes:
        self.settle()
        worker = self.worker
        if worker is None:
            return generate_latest(self.registry)
        # Counters and histograms: every worker's files, merged by prometheus-client (a dead
        # worker's stay, so nothing it counted is lost); live gauges: the shared table.
        merged = CollectorRegistry()
        files = MultiProcessCollector(None, path=str(worker.metrics_dir))
        self.roster.sync()
        merged.register(MembersOnly(files, lambda: self.roster.members))
        merged.register(self.state)
        if self.planner is not None:
            merged.register(PlanCollector(self.planner.document))
        return generate_latest(merged)

    def table(self) -> tables.Table:
        return self.keeper.table()

    def replace_table(self, raw: Any) -> tables.Table:
        table = self.keeper.replace(raw)
        if self.exchange is not None:
            self.exchange.share(raw)
        return table

    def pin_crossover(self, value: int) -> None:
        self.keeper.pin(value)

    def add_backend(self, pool: Pool, url: str) -> Member:
        return self.membership.join(pool, url)

    def remove_backend(self, pool: Pool, url: str) -> Member:
        return self.membership.leave(pool, url)

    def members(self, pool: Pool) -> list[Member]:
        self.roster.sync()
        return self.roster.of_pool(pool)

    def plan(self) -> dict[str, Any]:
        """``GET /router/plan``: the fleet planner's last plan (router.planning)."""
        if self.planner is None:
            return {"planner": "off", "status": "off: set SPEC_ROUTER_PLANNER=advisory"}
        return self.planner.document()

    def in_flight(self) -> Mapping[str, int]:
        return self.tracker.by_backend

    async def list_models(self) -> dict[str, Any]:
        now = self.clock()
        return await list_models(
            self.settings, self.pools, self.clients, lambda url: self.health.usable(url, now)
        )

    # -- lifecycle (router.lifecycle) ---------------------------------------------------------
    @asynccontextmanager
    async def running(self) -> AsyncIterator[RouterApp]:
        """Start the upstream clients, the proxy, the poller and the timers; stop them on exit."""
        try:
            async with lifecycle.running(self):
                yield self
        finally:
            # (the proxy's pools are closed: no callback stream may use it now; review N4)
            self.streams.proxy = None
            self.settle()
            if self.ended is not None:  # (a later lifecycle may run on another loop)
                self.ended.detach()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        def started() -> None:
            lifecycle.tune_gc()
            # under ``uvicorn router.app:app``: uvicorn's protocol with one keep-alive timer for
            # all connections (router.fastpath.lean), before uvicorn opens its socket
            # (and, when SPEC_ROUTER_CALLBACK_STREAMS is on, plain streams served from its
            # callbacks: router.forward.callback)
            extend = None
            if self.settings.callback_streams:
                self.streams.proxy = self.proxy
                extend = callback_protocol(self.streams)
            lean.adopt(receive, extend=extend)

        await lifecycle.lifespan(self.running, receive, send, started=started)

    # -- ASGI ---------------------------------------------------------------------------------
    def _proxy_for(self, path: str) -> Proxy | None:
        """The proxy, for a path it serves (else None: the control app's)."""
        proxy = self.proxy
        if proxy is not None and path.startswith("/v1/") and path != "/v1/models":
            return proxy
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            proxy = self._proxy_for(scope["path"])
            if proxy is not None:
                await proxy(scope, receive, send)
                return
            await self.control(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":
            await send({"type": "websocket.close", "code": 1003})


def load_table(settings: Settings) -> tables.Table | None:
    """The table at TABLE_PATH (``tables.starting_table``); a missing file without
    TABLE_FRESH, or a bad one, is a start-up error."""
    try:
        return tables.starting_table(settings.table_path, settings.table_fresh)
    except tables.TableError as exc:
        raise SettingsError(f"SPEC_ROUTER_TABLE_PATH: {exc}") from None


def create_app(
    settings: Settings | None = None, registry: CollectorRegistry | None = None
) -> RouterApp:
    """Build the router from ``settings`` (default: environment and SPEC_ROUTER_CONFIG)."""
    try:
        return RouterApp(settings if settings is not None else load_settings(), registry)
    except SettingsError as exc:
        # One clear line, then stop: uvicorn would otherwise print a long traceback.
        print(f"spec-router: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


_app: RouterApp | None = None


def __getattr__(name: str) -> Any:
    """``router.app:app``, built on first use (not when ``RouterApp`` is imported)."""
    global _app
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _app is None:
        refuse_uvicorn_workers()
        _app = create_app()
    return _app
