"""What runs while the router serves, started and stopped in one place.

Two parts, one for each role, so that nothing is started twice or stopped in two ways:

- ``deciding``: what the decision needs, whoever carries the requests (the proxy under
  ``serve``, or a gateway that asks ``spec-router epp``): an upstream client per member (the
  proxy's connections, or the EPP's for ``/v1/models``), the health poller, the members' timer
  and DNS discovery (``router.membership``), the keeper's learning timer and, under
  ``--workers``, the table exchange. On exit it stops each and writes the table once more.
- ``running``: the proxy's lifecycle, ``deciding`` plus what only the proxy needs: the
  ``Proxy`` over the clients, busy polling and the watch on a shared core.

``RouterApp`` built the components that do not need a loop; this module starts and stops them,
and ``lifespan`` (the ASGI lifespan protocol, for the proxy's app and the EPP's) or a test
enters them. ``tune_gc`` is the process-wide part a server's start-up adds.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import resource
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol, TypeVar

from router.account.inflight import InflightTracker
from router.account.outcome import Outcome
from router.asgi import Receive, Send
from router.decide.capacity import Steps
from router.fastpath.busypoll import SHARE_PERIOD, BusyPoll, ShareWatch
from router.forward.admission import Admission
from router.forward.decider import Decider
from router.forward.proxy import Proxy
from router.health.poller import HealthPoller
from router.health.state import HealthRegistry
from router.learn.keeper import CrossoverKeeper
from router.membership import TICK as MEMBERS_TICK
from router.membership import Membership
from router.origin import Origin
from router.planning.service import FleetPlanner
from router.planning.worker import PlanWorker, WorkerFailed
from router.pools import BASELINE, SPECULATIVE, Pool
from router.settings import Settings
from router.upstream.client import OriginPool
from router.workers import TableExchange, WorkerContext

log = logging.getLogger("spec_router")
tuning_log = logging.getLogger("spec_router.tuning")

# Young objects the collector may gather before it runs (CPython's default is 700). A router
# with thousands of streams in flight keeps thousands of live young objects (tasks, frames,
# buffers); with the default, the collector runs every few milliseconds and walks all of them,
# 1-7 ms each time (measured: ~170 gen-0 and 15 gen-1 runs in 8 s of 256 streams, none with
# anything to free). Request objects are freed by reference counting; the collector is only for
# the rare cycle (bench/results/overhead.md).
GC_YOUNG_THRESHOLD = 50_000


# Longest the event loop runs the decision surfaces' arithmetic before it serves I/O again.
SLICE = 0.0005  # seconds
T = TypeVar("T")

# How long to leave the core to the requests after the learner's work ran for some seconds.
Pace = Callable[[float], float]

# The event loop's thread alone where the OS can tell (Linux), else the whole process.
_RUSAGE: int = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)


class Deciding(Protocol):
    """The router's components ``deciding`` starts (``router.app.RouterApp``)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def poller(self) -> HealthPoller: ...
    @property
    def keeper(self) -> CrossoverKeeper: ...
    @property
    def exchange(self) -> TableExchange | None: ...
    @property
    def clients(self) -> dict[str, OriginPool]: ...
    @property
    def membership(self) -> Membership: ...
    @property
    def decider(self) -> Decider: ...
    @property
    def tracker(self) -> InflightTracker: ...


class Runnable(Deciding, Protocol):
    """The router's components as ``running`` starts them for the proxy: it reads the ones
    built without a loop and sets ``proxy``, ``busy`` and ``share``."""

    @property
    def pools(self) -> Mapping[Pool, list[str]]: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def tracker(self) -> InflightTracker: ...
    @property
    def health(self) -> HealthRegistry: ...
    @property
    def decider(self) -> Decider: ...
    @property
    def admission(self) -> Admission: ...
    @property
    def observers(self) -> list[Callable[[Outcome], None]]: ...
    @property
    def worker(self) -> WorkerContext | None: ...
    @property
    def planner(self) -> FleetPlanner | None: ...

    proxy: Proxy | None
    busy: BusyPoll | None
    share: ShareWatch | None

    def abort_lag(self, url: str) -> float: ...

    def default_model(self, pool: Pool, url: str) -> str | None: ...


@asynccontextmanager
async def deciding(app: Deciding, open_client: Callable[[str], OriginPool]) -> AsyncIterator[None]:
    """Start what the decision needs (clients made by ``open_client``, the poller, the members'
    timer and discovery, the keeper's timer, the table exchange); stop them on exit."""
    ensure_logging(app.settings.log_level)
    loop = asyncio.get_running_loop()
    clients = app.clients
    membership = app.membership
    membership.roster.sync()
    for url in membership.roster.members:  # (draining ones too: they may still be asked)
        clients[url] = open_client(url)
    membership.open_client = open_client  # backends that join from now on
    keeper = app.keeper
    exchange = app.exchange
    app.poller.start()
    tasks: list[asyncio.Task[None]] = []
    try:
        # the first resolution before serving: the pools start with what the names answer (or
        # a clear warning for each that does not), not empty
        await membership.discover()
        tasks.append(loop.create_task(keep_members(membership)))
        if membership.discovery is not None:
            tasks.append(loop.create_task(keep_discovering(membership)))
        pace = learning_pace(app.settings.learn_share, serving(app.tracker))
        tasks.append(loop.create_task(keep_learning(keeper, app.decider, pace)))
        if exchange is not None:
            tasks.append(loop.create_task(exchange.follow(keeper)))
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        keeper.persist()
        await app.poller.stop()
        for client in clients.values():
            client.close()
        clients.clear()
        membership.open_client = None


@asynccontextmanager
async def running(app: Runnable) -> AsyncIterator[None]:
    """The proxy's lifecycle: ``deciding``, with the proxy over its clients, busy polling and
    the watch on a shared core."""
    s = app.settings
    loop = asyncio.get_running_loop()
    busy = app.busy = BusyPoll(loop, s.busy_poll_us / 1e6) if s.busy_poll_us else None
    poke = busy.poke if busy is not None else None

    def open_client(url: str) -> OriginPool:
        return OriginPool(
            Origin.parse(url),
            max_connections=s.max_connections_per_backend,
            max_idle=s.max_idle_per_backend,
            keepalive_expiry=s.keepalive_expiry,
            poke=poke,
        )

    try:
        async with deciding(app, open_client):
            app.proxy = Proxy(
                s,
                app.decider,
                app.tracker,
                app.health,
                app.clients,
                app.observers,
                app.clock,
                poke=poke,
                admission=app.admission,
                abort_lag=app.abort_lag,
                default_model=app.default_model,
                sync=None if app.worker is None else app.membership.roster.sync,
            )
            share_task = None
            if busy is not None and s.busy_poll_yield:
                share = app.share = ShareWatch()
                share_task = loop.create_task(_watch_share(busy, share))
            planner = app.planner  # (the leader plans under --workers)
            plan_task = (
                loop.create_task(keep_planning(planner))
                if planner is not None and planner.writer
                else None
            )
            keeper = app.keeper
            log.info(
                "spec-router: policy=%s crossover=%s (%s) speculative=%s baseline=%s",
                app.decider.policy,
                f"none measured up to {keeper.crossover}"
                if keeper.no_crossover
                else keeper.crossover,
                keeper.source,
                ",".join(app.pools[SPECULATIVE]),
                ",".join(app.pools[BASELINE]),
            )
            try:
                yield
            finally:
                for task in (share_task, plan_task):
                    if task is not None:
                        task.cancel()
                        await asyncio.gather(task, return_exceptions=True)
                app.proxy = None
    finally:
        if busy is not None:
            busy.stop()


async def lifespan(
    running: Callable[[], AbstractAsyncContextManager[object]],
    receive: Receive,
    send: Send,
    started: Callable[[], None] | None = None,
) -> None:
    """The ASGI lifespan protocol over ``running()``: start-up completes once it is entered
    (and ``started`` ran), shutdown once it is left."""
    message = await receive()
    assert message["type"] == "lifespan.startup"
    done = False
    try:
        async with running():
            if started is not None:
                started()
            await send({"type": "lifespan.startup.complete"})
            done = True
            message = await receive()
            assert message["type"] == "lifespan.shutdown"
    except BaseException as exc:
        # After start-up completed, a failure is a shutdown failure (as Starlette does):
        # uvicorn asserts against a late startup.failed, and the real error would be lost.
        failed = "lifespan.shutdown.failed" if done else "lifespan.startup.failed"
        await send({"type": failed, "message": f"{type(exc).__name__}: {exc}"})
        raise
    await send({"type": "lifespan.shutdown.complete"})


async def keep_members(membership: Membership) -> None:
    """The members' timer (``Membership.tick``): follow the set, cut the streams of a drain
    that timed out, remove what drained."""
    while True:
        await asyncio.sleep(MEMBERS_TICK)
        try:
            membership.tick()
        except Exception:
            log.exception("membership tick failed")


async def keep_planning(planner: FleetPlanner, worker: PlanWorker | None = None) -> None:
    """The fleet planner's timers: a look at the engines every ``look_interval`` (their
    counters, the switch in progress), a plan every ``PLAN_INTERVAL``. The plan itself runs in
    a child process (``router.planning.worker``: it can take seconds of CPU when its model's
    cache is cold, which in this process would hold the GIL the proxy needs), and the looks go
    on meanwhile: the event loop only gathers its inputs and publishes its result. The child
    is stopped when this task ends, however it ends."""
    worker = worker if worker is not None else PlanWorker(record=planner.settings.plan_record_path)
    log.info("fleet planner: %s, a plan every %gs", planner.mode, planner.interval)
    try:
        while True:
            await asyncio.sleep(planner.look_interval)
            try:
                if planner.clock() - planner.last_tick < planner.interval:
                    planner.look()
                    continue
                r = planner.gather()
                t0 = time.perf_counter()
                job = asyncio.ensure_future(worker.run(r, planner.plan_timeout))
                try:
                    while not job.done():
                        await asyncio.wait({job}, timeout=planner.look_interval)
                        if not job.done():
                            # (not ``look_while_planning``: counting each interval a late plan
                            # misses left the forecast as plans on time would, and over sockets
                            # eagle3-chain's planner then moved to baseline at ~1.5 h in 3 runs
                            # of 3, against 1 of 4 with them lumped: -4 to -5 points; see
                            # bench/results/fleet.md, session 10. Off until that is understood.)
                            planner.look()
                finally:
                    if not job.done():
                        job.cancel()
                        await asyncio.gather(job, return_exceptions=True)
                try:
                    out = job.result()
                except WorkerFailed as exc:
                    planner.failed(r, str(exc), worker)
                    continue
                planner.publish(r, out, time.perf_counter() - t0, worker)
            except Exception:
                log.exception("fleet planner round failed")
    finally:
        await worker.close()


async def keep_discovering(membership: Membership) -> None:
    """A discovery round every ``SPEC_ROUTER_DISCOVERY_INTERVAL`` (the first ran at start)."""
    assert membership.discovery is not None
    interval = membership.discovery.interval
    while True:
        await asyncio.sleep(interval)
        try:
            await membership.discover()
        except Exception:
            log.exception("discovery round failed")


async def keep_learning(
    keeper: CrossoverKeeper, decider: Decider | None = None, pace: Pace | None = None
) -> None:
    """The keeper's timer: one learning step every ``LEARN_INTERVAL`` seconds, then the
    ``decider``'s surfaces for the slo policy, computed in slices between requests
    (``in_slices``), and the table written when ``PERSIST_INTERVAL`` has passed since it last
    was. ``pace`` (``learning_pace``) says how long to leave the core to the requests after
    each stretch of this work (the step, then each slice); None: one loop turn."""
    interval = keeper.settings.learn_interval
    clock = time.perf_counter
    while True:
        await asyncio.sleep(interval)
        try:
            start = clock()
            keeper.update()
            job = None if decider is None else decider.pending()
            if decider is not None and job is not None:
                await asyncio.sleep(0.0 if pace is None else pace(clock() - start))
                decider.install(job, await in_slices(job.steps(), pace=pace))
            if keeper.persist_due():
                keeper.persist()
        except Exception:
            tuning_log.exception("crossover update failed")


def learning_pause(worked: float, share: float, busy: bool) -> float:
    """Seconds to leave the core to the requests after the learner's work ran ``worked``
    seconds in one stretch, so that it takes at most ``share`` of the core while the router is
    ``busy`` serving (the work, then ``worked * (1 - share) / share`` of rest); none when it is
    not (a turn of the loop, as between any two slices) or when ``share`` is 1.

    Why: at 256 streams on one saturated core the surfaces' ~124 ms in 0.5-ms slices with one
    loop turn between took ~31% of the core for ~0.4 s, and every top-1% TTFT of tail.py's run
    was sent in that window (bench/results/fast-path.md, session 13)."""
    if not busy or share >= 1.0:
        return 0.0
    return worked * (1.0 - share) / share


def learning_pace(share: float, busy: Callable[[], bool]) -> Pace:
    """``learning_pause`` at ``share``, asking ``busy`` (``serving``) after each stretch."""

    def pace(worked: float) -> float:
        return learning_pause(worked, share, busy())

    return pace


def serving(tracker: InflightTracker) -> Callable[[], bool]:
    """Whether this process has requests in flight (its own: under ``--workers`` another
    worker's requests are on another core)."""
    own = tracker.own_by_backend

    def busy() -> bool:
        return any(own.values())

    return busy


async def in_slices(steps: Steps[T], budget: float = SLICE, pace: Pace | None = None) -> T:
    """Run ``steps`` on the event loop, giving the loop a turn after each ``budget`` seconds
    of them, and the rest ``pace`` asks for after each slice (``learning_pace``: a bounded
    share of the core while requests are in flight). Not a thread: the router has one core,
    and under uvloop every I/O callback takes the GIL again, each take able to wait the
    interpreter's switch interval (5 ms) while another thread computes; the surfaces' tens of
    milliseconds in a thread showed as a tail under load (bench/results/tail-default.md)."""
    clock = time.perf_counter
    start = clock()
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: T = done.value
            return result
        worked = clock() - start
        if worked >= budget:
            await asyncio.sleep(0.0 if pace is None else pace(worked))
            start = clock()


def _waited_for_core() -> float | None:
    """Seconds this thread has spent runnable but waiting for a core, where Linux keeps it."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


async def _watch_share(busy: BusyPoll, share: ShareWatch) -> None:
    """Hold busy polling while the router's core looks shared (``ShareWatch``)."""
    while True:
        switches = resource.getrusage(_RUSAGE).ru_nivcsw
        shared = share.update(time.monotonic(), switches, _waited_for_core())
        if shared != busy.held:
            log.info(
                "busy polling %s: %.0f involuntary context switches/s, %.1f%% of the time "
                "waiting for the core",
                "held, the core looks shared" if shared else "resumed",
                share.rate or 0.0,
                100 * (share.wait or 0.0),
            )
        busy.hold(shared)
        await asyncio.sleep(SHARE_PERIOD)


def tune_gc() -> None:
    """Process-wide, so done when a server starts the app (its lifespan), not in tests that
    drive the app in-process: everything built at start-up moves out of the collector's sight
    (``gc.freeze``), and young collections wait for ``GC_YOUNG_THRESHOLD`` objects."""
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, GC_YOUNG_THRESHOLD), middle, old)


def ensure_logging(level: str) -> None:
    """Under ``uvicorn router.app:app`` nothing configures our loggers: give them a handler."""
    ours = logging.getLogger("spec_router")
    if not ours.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        ours.addHandler(handler)
    ours.setLevel(level.upper())
