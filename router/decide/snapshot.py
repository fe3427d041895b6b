"""The decision shell: turns live state into a policy ``Snapshot`` and keeps the policy's memory.

It owns only what the policies remember between requests (round-robin position, hysteresis,
exploration credit). Everything else it reads, through the interfaces of its owners: in-flight
counts from the tracker, health from the registry, engine loads from the poller, the crossover
and the curves from the keeper.

Load signals (``LOAD_SIGNAL``):
- ``local``: this router's own in-flight count per backend. Exact and instant, but blind to
  other router replicas in front of the same engines.
- ``engine``: the engine's reported running + queued requests at the last scrape, plus the
  requests this replica sent there since that scrape. Replicas agree (they read the same engine)
  at the cost of up to one scrape interval of lag.
- ``max``: the larger of the two, the conservative choice.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Mapping
from typing import Protocol

from router.account.inflight import InflightTracker
from router.decide.learner import Gain
from router.decide.policy import (
    BackendView,
    Decision,
    PoolView,
    RoutingState,
    Snapshot,
    choose,
    explore,
    reroute,
)
from router.health.poller import EngineLoad
from router.health.state import HealthRegistry
from router.pools import BASELINE, SPECULATIVE, Pool
from router.settings import LoadSignal, PolicyName


class Tuning(Protocol):
    """What routing reads from the crossover's owner (``router.account.keeper``)."""

    @property
    def crossover(self) -> int: ...

    @property
    def gain(self) -> Gain | None: ...


class Decider:
    def __init__(
        self,
        pools: Mapping[Pool, list[str]],
        tracker: InflightTracker,
        health: HealthRegistry,
        tuning: Tuning,
        loads: Mapping[str, EngineLoad],
        policy: PolicyName,
        hysteresis: int,
        load_signal: LoadSignal = "local",
        clock: Callable[[], float] = time.monotonic,
        explore_share: float = 0.0,
        explore_band: int = 2,
    ) -> None:
        self.pools = pools
        self.tracker = tracker
        self.health = health
        self.tuning = tuning
        self.loads = loads
        self.policy: PolicyName = policy
        self.hysteresis = hysteresis
        self.load_signal: LoadSignal = load_signal
        self.clock = clock
        self.explore_share = explore_share
        self.explore_band = explore_band
        self._state = RoutingState()
        self._explore_credit = 0.0

    def backend_load(self, url: str) -> int:
        local = self.tracker.by_backend[url]
        if self.load_signal == "local":
            return local
        seen = self.loads.get(url)
        if seen is None:
            return local
        engine = seen.running + seen.queued + (self.tracker.started[url] - seen.started_at_scrape)
        return engine if self.load_signal == "engine" else max(local, engine)

    def _view(self, name: Pool, now: float) -> PoolView:
        health, load = self.health, self.backend_load
        return PoolView(
            name,
            tuple(
                [
                    BackendView(url, load(url), health.usable(url, now), health.weight(url, now))
                    for url in self.pools[name]
                ]
            ),
        )

    def snapshot(self) -> Snapshot:
        now = self.clock()
        tuning = self.tuning
        return Snapshot(
            self._view(SPECULATIVE, now),
            self._view(BASELINE, now),
            tuning.crossover,
            self.hysteresis,
            self._state,
            tuning.gain,
        )

    def decide(self) -> Decision | None:
        snap = self.snapshot()
        decision, self._state = choose(self.policy, snap)
        if decision is not None and self.explore_share > 0 and self.policy != "round_robin":
            decision = self._maybe_explore(snap, decision)
        return decision

    def _maybe_explore(self, snap: Snapshot, decision: Decision) -> Decision:
        """Send a bounded share of requests near the crossover the other way (see learning)."""
        if abs(snap.speculative.load - snap.crossover) > self.explore_band:
            return decision
        self._explore_credit += self.explore_share
        if self._explore_credit < 1.0:
            return decision
        alt = explore(snap, decision)
        if alt is None:
            return decision
        self._explore_credit -= 1.0
        return alt

    def retry(self, failed: Decision, tried: Container[str]) -> Decision | None:
        return reroute(self.snapshot(), failed, tried)

    def pool_usable(self, pool: Pool) -> bool:
        now = self.clock()
        return any(self.health.usable(url, now) for url in self.pools[pool])
