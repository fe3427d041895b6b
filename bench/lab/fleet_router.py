"""The router users run, for the fleet lab: ``spec-router serve``'s own decision shell.

A ``router.forward.decider.Decider`` over a real ``InflightTracker`` and ``HealthRegistry``
with a ``CrossoverKeeper`` started from the table ``spec-router fleet`` gives its router
(``router.tools.fleet.table.model_table``: the presets' curves at the day's mean lengths), on
the lab's clock (model seconds, the table's time scale 1), as ``bench/lab_sim.py`` drives it.
The policy is the router's default (``slo``) unless told otherwise. Engines join and leave as
discovery would tell the router (``Roster``: the pools' URL lists changed in place, then
``members_changed``); a draining engine takes no new requests and its requests in flight
keep their leases until they end.

Not imitated: learning (off: the table is the presets' own model, what learning moves
towards), exploration (off with learning), the router-side queue (off by default).
"""

from __future__ import annotations

from fleet_engine import Req
from lab_sim import LEARN_INTERVAL, Clock, lab_decider, lab_settings

from router.account.inflight import InflightTracker, Lease
from router.decide.params import DEFAULT, Params
from router.forward.request import RequestInfo
from router.health.state import HealthConfig, HealthRegistry
from router.learn.keeper import CrossoverKeeper
from router.pools import BASELINE, SPECULATIVE, Pool
from router.settings import PolicyName
from router.sim.model import Preset
from router.tools.fleet.table import model_table

# Model seconds between the keeper's timer ticks (the surfaces for the rate lately): the
# router's 5 s wall at the sims' time scale 0.25, as in ``bench/lab_sim.py``.
TICK = LEARN_INTERVAL


class DeciderRouter:
    """Routes each request as ``spec-router serve`` would (see the module docstring)."""

    def __init__(
        self,
        spec: Preset,
        base: Preset,
        prompt: float,
        output: float,
        policy: PolicyName = "slo",
        params: Params = DEFAULT,
    ) -> None:
        self.clock = Clock()
        self.pools: dict[Pool, list[str]] = {SPECULATIVE: [], BASELINE: []}
        # (the settings need a URL per pool; the pools start empty and fill as engines join)
        named: dict[Pool, list[str]] = {
            SPECULATIVE: ["http://spec.lab"],
            BASELINE: ["http://base.lab"],
        }
        settings = lab_settings(named, policy, learn=False)
        table = model_table(spec, base, round(prompt), round(output), 1.0)
        self.tracker = InflightTracker([], self.clock)
        self.health = HealthRegistry([], HealthConfig(), 0.0)
        self.keeper = CrossoverKeeper(settings, self.tracker, {}, table, self.clock)
        self.decider = lab_decider(
            settings, self.pools, self.tracker, self.health, self.keeper, self.clock, 0.0, params
        )
        self.keeper.update()
        self.leases: dict[int, Lease] = {}
        self.next_tick = 0.0

    def join(self, url: str, pool: Pool, t: float) -> None:
        """An engine came up (discovery: it joined its pool and is healthy)."""
        self.clock.now = t
        self.tracker.add(pool, url)
        self.health.add(url, t)
        self.health.probe(url, True, t)
        self.pools[pool].append(url)
        self.decider.members_changed([url], [])

    def leave(self, url: str, t: float) -> None:
        """An engine is switched: it leaves its pool (drains; no new requests)."""
        self.clock.now = t
        for urls in self.pools.values():
            if url in urls:
                urls.remove(url)
        self.decider.members_changed([], [url])

    def tick(self, t: float) -> None:
        """The keeper's timer: the surfaces for the rate lately."""
        if t < self.next_tick:
            return
        self.clock.now = t
        self.next_tick = t + TICK
        self.decider.refresh()

    def route(self, r: Req, t: float) -> str | None:
        """The backend ``r`` goes to (None: nothing up)."""
        self.tick(t)
        self.clock.now = t
        info = RequestInfo(
            stream=True,
            max_tokens=r.output,
            temperature=1.0 if r.hot else 0.0,
            prompt_tokens=r.prompt,
        )
        decision = self.decider.decide(self.decider.request(info))
        if decision is None:
            return None
        self.leases[id(r)] = self.tracker.acquire(decision.backend)
        return decision.backend

    def finished(self, r: Req) -> None:
        lease = self.leases.pop(id(r), None)
        if lease is not None:
            self.clock.now = max(self.clock.now, r.last)
            lease.release()
