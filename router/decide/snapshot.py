"""The routing shell: turns live state into a policy ``Snapshot`` and keeps the policy's memory.

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
from collections.abc import Callable, Container
from dataclasses import dataclass

from router.account.inflight import BASELINE, SPECULATIVE, InflightTracker
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
from router.health.state import HealthRegistry


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What a backend's /metrics said at one scrape."""

    running: int
    queued: int
    accept_length: float | None
    scraped_at: float
    started_at_scrape: int  # this replica's `started` count for the backend at that moment
    flavor: str  # "sglang" or "vllm"


class Router:
    def __init__(
        self,
        pools: dict[str, list[str]],
        tracker: InflightTracker,
        health: HealthRegistry,
        policy: str,
        crossover: int,
        crossover_source: str,
        hysteresis: int,
        load_signal: str = "local",
        clock: Callable[[], float] = time.monotonic,
        explore_share: float = 0.0,
        explore_band: int = 2,
    ) -> None:
        self.pools = pools
        self.tracker = tracker
        self.health = health
        self.policy = policy
        self.crossover = crossover
        self.crossover_source = crossover_source
        self.hysteresis = hysteresis
        self.load_signal = load_signal
        self.clock = clock
        self.state = RoutingState()
        self.engine: dict[str, EngineLoad] = {}
        self.gain: Callable[[str, int], float] | None = None
        self.explore_share = explore_share
        self.explore_band = explore_band
        self._explore_credit = 0.0

    def set_crossover(self, value: int, source: str) -> None:
        self.crossover = value
        self.crossover_source = source

    def backend_load(self, url: str) -> int:
        local = self.tracker.by_backend[url]
        if self.load_signal == "local":
            return local
        seen = self.engine.get(url)
        if seen is None:
            return local
        engine = seen.running + seen.queued + (self.tracker.started[url] - seen.started_at_scrape)
        return engine if self.load_signal == "engine" else max(local, engine)

    def _view(self, name: str, now: float) -> PoolView:
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
        return Snapshot(
            self._view(SPECULATIVE, now),
            self._view(BASELINE, now),
            self.crossover,
            self.hysteresis,
            self.state,
            self.gain,
        )

    def decide(self) -> Decision | None:
        snap = self.snapshot()
        decision, self.state = choose(self.policy, snap)
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

    def any_usable(self) -> bool:
        now = self.clock()
        return any(self.health.usable(url, now) for urls in self.pools.values() for url in urls)

    def pool_usable(self, pool: str) -> bool:
        now = self.clock()
        return any(self.health.usable(url, now) for url in self.pools[pool])
