"""``GET /router/status``: one JSON document of what the router knows, from its owners' views.

Each part comes from the component that owns it (counts from the tracker, health from the
registry, engine loads from the poller, the crossover from the keeper, the queue, the fast path,
busy polling, the recent window, the live page's feed, the worker's place); this module only
lays them out. ``router_status`` assembles the whole document from the router's components
(``Observed``, which ``router.app.RouterApp`` provides).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from router import compiled
from router.account.inflight import InflightTracker
from router.account.recent import RecentWindow
from router.control.feed import Feed
from router.decide.capacity import RELAXED_TPOT, RELAXED_TTFT
from router.fastpath import fast_path_status
from router.fastpath.busypoll import BusyPoll, ShareWatch
from router.forward.admission import Admission
from router.forward.callback import CallbackStreams
from router.forward.decider import Decider
from router.forward.proxy import Proxy
from router.health.notices import Notices
from router.health.poller import EngineLoad, HealthPoller
from router.health.pool_check import PoolCheck
from router.health.state import HealthRegistry, pool_problem, pool_status, usable
from router.learn.keeper import CrossoverKeeper
from router.membership import Membership
from router.pools import POOLS, Pool
from router.settings import Settings
from router.workers import WorkerContext


class Observed(Protocol):
    """The router's components the status document is read from (``router.app.RouterApp``)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def tracker(self) -> InflightTracker: ...
    @property
    def health(self) -> HealthRegistry: ...
    @property
    def poller(self) -> HealthPoller: ...
    @property
    def pool_check(self) -> PoolCheck: ...
    @property
    def keeper(self) -> CrossoverKeeper: ...
    @property
    def decider(self) -> Decider: ...
    @property
    def admission(self) -> Admission: ...
    @property
    def proxy(self) -> Proxy | None: ...
    @property
    def streams(self) -> CallbackStreams: ...
    @property
    def busy(self) -> BusyPoll | None: ...
    @property
    def share(self) -> ShareWatch | None: ...
    @property
    def recent(self) -> RecentWindow: ...
    @property
    def feed(self) -> Feed: ...
    @property
    def worker(self) -> WorkerContext | None: ...
    @property
    def notices(self) -> Notices: ...
    @property
    def membership(self) -> Membership: ...

    def connections(self, url: str) -> dict[str, int]: ...


def readiness(app: Observed) -> dict[str, Any]:
    """The /ready document. ``ready`` while some pool can take traffic; ``status`` says whether
    both are whole (``ok``), one is not (``degraded``: say a speculative pool that never came
    up, the baseline serving everything) or none can serve (``down``, the one 503)."""
    now = app.clock()
    pools = pool_states(app.decider.pools, app.health, now)
    usable_pools = {pool: p["status"] != "down" for pool, p in pools.items()}
    return {
        "ready": any(usable_pools.values()),
        "status": overall(pools.values()),
        "pools": usable_pools,
        "problems": [p["problem"] for p in pools.values() if p["problem"]],
        "warnings": [n.message for n in app.notices.current()]
        + [f["message"] for f in app.pool_check.status()],
    }


def pool_states(
    pools: Mapping[Pool, Sequence[str]], health: HealthRegistry, now: float
) -> dict[Pool, dict[str, Any]]:
    """Each pool's ``status`` (ok, degraded, down) and what keeps it from being whole."""
    out: dict[Pool, dict[str, Any]] = {}
    for pool in POOLS:
        urls = pools[pool]
        states = [health.states[url] for url in urls]
        out[pool] = {
            "status": pool_status(states, now),
            "problem": pool_problem(pool, urls, states, now),
        }
    return out


def overall(pools: Iterable[Mapping[str, Any]]) -> str:
    """``ok`` when every pool is whole, ``down`` when none can serve, else ``degraded``."""
    statuses = [p["status"] for p in pools]
    if all(s == "ok" for s in statuses):
        return "ok"
    return "down" if all(s == "down" for s in statuses) else "degraded"


def router_status(app: Observed) -> dict[str, Any]:
    """The whole ``/router/status`` document."""
    busy, share, feed, proxy = app.busy, app.share, app.feed, app.proxy
    decider = app.decider
    membership = app.membership
    membership.roster.sync()
    return status_document(
        now=app.clock(),
        tracker=app.tracker,
        health=app.health,
        loads=app.poller.loads,
        keeper=app.keeper,
        decider=decider,
        connections=app.connections,
        served_models=app.poller.served_models,
        backends_of=lambda pool: [m.url for m in membership.roster.of_pool(pool)],
        member=membership.backend,
        pool_check=app.pool_check,
        extra={
            # what the operator should look at: backends that cannot be reached
            # (router.health.notices), then the pools' checks against what their engines say
            # (router.health.pool_check); each pool's own status is under "pools"
            "warnings": app.notices.document(app.clock()) + app.pool_check.status(),
            # what the default policy routes for, whatever the policy: the share of requests
            # within this SLO (recent.within_slo, /metrics spec_router_slo_*)
            "objective": objective(decider.slo_ttft, decider.slo_tpot),
            "membership": membership.status(),
            # the decision's hot path compiled (mypyc) or from source, and why (router.compiled)
            "build": compiled.status(),
            "slo": decider.status() if decider.policy == "slo" else None,
            "queue": app.admission.status(),
            "fast_path": {
                **(proxy.responders.status() if proxy is not None else fast_path_status()),
                **app.streams.status(),
            },
            "busy_poll": {
                "window_us": app.settings.busy_poll_us,
                "spinning": busy is not None and busy.running,
                "turns": 0 if busy is None else busy.spins,
                # the core looks shared (too many involuntary context switches a second, or
                # too long waiting for the core): no spinning until it stops
                "held": busy is not None and busy.held,
                "involuntary_switches_per_s": None if share is None else share.rate,
                "waiting_for_core": None if share is None else share.wait,
            },
            "recent": app.recent.summary(),
            "ui": {
                "feed_connections": feed.connections,
                "snapshots": feed.seq,
                "interval_s": feed.interval,
            },
            "workers": workers_document(app.tracker, app.worker),
        },
    )


def _engine(seen: EngineLoad | None, now: float) -> dict[str, Any] | None:
    if seen is None:
        return None
    return {
        "flavor": seen.flavor,
        "running": seen.running,
        "queued": seen.queued,
        "spec_accept_length": seen.accept_length,
        "age_s": round(now - seen.scraped_at, 3),
    }


def status_document(
    *,
    now: float,
    tracker: InflightTracker,
    health: HealthRegistry,
    loads: Mapping[str, EngineLoad],
    keeper: CrossoverKeeper,
    decider: Decider,
    connections: Callable[[str], dict[str, int]],
    extra: Mapping[str, Any],
    served_models: Mapping[str, str] | None = None,
    backends_of: Callable[[Pool], list[str]] | None = None,
    member: Callable[[str, float], dict[str, Any]] | None = None,
    pool_check: PoolCheck | None = None,
) -> dict[str, Any]:
    """The document; each pool lists ``backends_of(pool)`` (default: the routable ones), each
    backend with what ``member`` says of its membership (where it came from, draining)."""
    wall = time.time()

    def ago(t: float | None) -> float | None:
        return None if t is None else round(now - t, 3)

    pools: dict[str, Any] = {}
    for pool in POOLS:
        backends = []
        urls = decider.pools[pool] if backends_of is None else backends_of(pool)
        routable = set(decider.pools[pool])
        for url in urls:
            h = health.states[url]
            backends.append(
                {
                    "url": url,
                    "state": h.state.value,
                    # (a draining backend takes no new request, whatever its health)
                    "usable": usable(h, now) and url in routable,
                    "in_flight": tracker.by_backend[url],
                    "lingering": tracker.lingering(url, now),
                    "load": decider.backend_load(url),
                    "weight": round(health.weight(url, now), 3),
                    "last_check": None if h.last_check is None else wall - (now - h.last_check),
                    "last_check_age_s": ago(h.last_check),
                    "checks": h.checks,
                    "consecutive_failures": h.failures,
                    "consecutive_successes": h.successes,
                    "ever_healthy": h.ever_healthy,
                    "last_error": h.last_error,
                    "ejected_for_s": round(max(0.0, h.ejected_until - now), 3),
                    "ejections": h.ejections,
                    "connections": connections(url),
                    "engine": _engine(loads.get(url), now),
                    "served_model": (served_models or {}).get(url),
                    **({} if member is None else member(url, now)),
                    # what it said about itself at its last start (None: not yet)
                    "reports": None if pool_check is None else pool_check.reported(url),
                }
            )
        states = [health.states[url] for url in decider.pools[pool]]
        pools[pool] = {
            "status": pool_status(states, now),
            "problem": pool_problem(pool, decider.pools[pool], states, now),
            "usable": any(b["usable"] for b in backends),
            "in_flight": tracker.by_pool[pool],
            "slow_clients": tracker.slow_clients[pool],
            "backends": backends,
        }
    none = keeper.no_crossover_status(len(decider.pools["speculative"]),
                                      len(decider.pools["baseline"]))  # fmt: skip
    return {
        "status": overall(pools.values()),
        "policy": decider.policy,
        # the policy deciding now, and why when it is not the configured one
        "deciding_as": decider.deciding_as,
        "deciding_as_why": deciding_as_why(decider.policy, decider.deciding_as),
        # null: none measured (``no_crossover`` says up to where, and what follows from it)
        "crossover": None if none is not None else keeper.crossover,
        "crossover_source": keeper.source,
        "no_crossover": none,
        # requests per speculative engine before the rest go elsewhere (to the baseline, or
        # with no crossover by load)
        "speculative_limit": keeper.crossover,
        "learning": {**keeper.status(), "explore_share": decider.explore_share},
        "hysteresis": decider.hysteresis,
        "load_signal": decider.load_signal,
        "in_flight": tracker.snapshot(),
        "pools": pools,
        # what is wrong with the deployment as the engines describe it (router.health.checks):
        # each with its level (error: it cannot work as meant), reason and fix
        "warnings": [] if pool_check is None else pool_check.status(),
        **extra,
    }


def objective(slo_ttft: float, slo_tpot: float) -> dict[str, float]:
    """The SLO requests are judged against (milliseconds), at both tiers."""
    return {
        "slo_ttft_ms": round(slo_ttft * 1000, 3),
        "slo_tpot_ms": round(slo_tpot * 1000, 3),
        "relaxed_ttft_ms": round(slo_ttft * RELAXED_TTFT * 1000, 3),
        "relaxed_tpot_ms": round(slo_tpot * RELAXED_TPOT * 1000, 3),
    }


def deciding_as_why(policy: str, deciding_as: str) -> str | None:
    """Why the configured policy decides as another (``Decider.deciding_as``)."""
    if policy == deciding_as:
        return None
    return (
        f"{policy} is deciding as {deciding_as}: no curves yet (no table at start, nothing "
        "learned yet); `spec-router calibrate` gives them at once"
    )


def workers_document(tracker: InflightTracker, worker: WorkerContext | None) -> dict[str, Any]:
    """Which worker answered, and each worker's share of the machine-wide counts (the rest of
    the document -- connections, health, engine loads, queue, learning -- is that worker's)."""
    pid = os.getpid()
    if worker is None:
        share = {
            "worker": 0,
            "pid": pid,
            "in_flight": tracker.total,
            "by_pool": dict(tracker.by_pool),
            "started": sum(tracker.started.values()),
        }
        return {"count": 1, "this": 0, "pid": pid, "leader": True, "slots": [share]}
    return {
        "count": worker.count,
        "this": worker.slot,
        "pid": pid,
        "leader": worker.leader,
        "slots": worker.table.workers(),
    }
