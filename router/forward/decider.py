"""The decision shell: turns live state into a policy ``Snapshot`` and keeps the policy's memory.

It owns only what the policies remember between requests (round-robin position, hysteresis,
exploration credit). Everything else it reads, through the interfaces of its owners: in-flight
counts from the tracker, health from the registry, engine loads from the poller, the crossover
and the curves from the keeper.

Load signals (``LOAD_SIGNAL``):
- ``local``: this router's own in-flight count per backend (under ``serve --workers N``, the
  sum over its workers: ``router.account.shared``), plus the requests whose client left that
  the engine is still running (SGLang aborts them 2-4 s later: ``ENGINE_ABORT_LAG``). Exact
  and instant, but blind to other router replicas in front of the same engines.
- ``engine``: the engine's reported running + queued requests at the last scrape, plus the
  requests this replica sent there since that scrape -- since ``ENGINE_GAUGE_LAG`` before it
  for SGLang, whose gauges lag (router.health.poller.EngineLoad). Replicas agree (they read
  the same engine) at the cost of that lag for the requests of other replicas.
- ``max``: the larger of the two, the conservative choice.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Container, Iterable, Mapping
from typing import Any

from router.account.inflight import InflightTracker
from router.decide.policy import (
    BackendView,
    Decision,
    PoolView,
    RoutingState,
    Snapshot,
    choose,
    explore,
    offered,
    reroute,
    slo_capacities,
)
from router.decide.predict import PoolModel, Request
from router.decide.snapshot import RECENT_WINDOW, Mix, Recent, Tuning, flight
from router.decide.twin import Flight, Stream
from router.forward.request import RequestInfo
from router.health.poller import EngineLoad
from router.health.state import HealthRegistry
from router.pools import BASELINE, SPECULATIVE, Pool
from router.settings import LoadSignal, PolicyName


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
        slo_ttft: float = 1.0,
        slo_tpot: float = 0.025,
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
        self.slo_ttft = slo_ttft  # seconds, wall clock
        self.slo_tpot = slo_tpot
        self._state = RoutingState()
        self._explore_credit = 0.0
        now = clock()
        self._recent = {url: Recent(now) for urls in pools.values() for url in urls}
        self._mix = Mix()  # recent requests' sizes and share at temperature > 0
        self.extrapolated = 0  # decisions that predicted beyond the measured batch sizes

    def members_changed(self, joined: Iterable[str], removed: Iterable[str]) -> None:
        """The set of backends changed (``router.members.roster``; ``self.pools`` holds the
        routable ones, updated in place): what it keeps per backend starts and ends with
        them."""
        now = self.clock()
        for url in removed:
            self._recent.pop(url, None)
        for url in joined:
            self._recent[url] = Recent(now)

    def backend_load(self, url: str) -> int:
        local = self.tracker.by_backend[url] + self.tracker.lingering(url, self.clock())
        if self.load_signal == "local":
            return local
        seen = self.loads.get(url)
        if seen is None:
            return local
        engine = seen.running + seen.queued + (self.tracker.started[url] - seen.started_at_scrape)
        return engine if self.load_signal == "engine" else max(local, engine)

    def _view(
        self, name: Pool, now: float, window: float | None, model: PoolModel | None = None
    ) -> PoolView:
        health, load = self.health, self.backend_load
        if window is None:
            return PoolView(
                name,
                tuple(
                    [
                        BackendView(
                            url, load(url), health.usable(url, now), health.weight(url, now)
                        )
                        for url in self.pools[name]
                    ]
                ),
            )
        views = []
        tracker = self.tracker
        local = tracker.by_backend
        own = tracker.own_by_backend  # this process's (one worker's, under --workers)
        for url in self.pools[name]:
            r = self._recent[url]
            n = load(url)
            r.update(now, window, tracker.area(url, now), tracker.started[url] - local[url])
            # what this process's own traffic will keep it at, plus what others (other
            # workers, other replicas) put there
            ours = r.expected(window)
            expected = None if ours is None else ours + max(0, n - own[url])
            seen = self.loads.get(url)
            flights: tuple[Flight, ...] = ()
            stream = None
            if model is not None:
                flights = tuple([flight(o, now, model) for o in tracker.flights[url].values()])
                stream = self._stream(r, window, model, now)
            views.append(
                BackendView(
                    url,
                    n,
                    health.usable(url, now),
                    health.weight(url, now),
                    r.prefill / window,
                    expected,
                    None if seen is None else seen.cap,
                    flights,
                    stream,
                    tracker.lingering_left(url, now),
                )
            )
        return PoolView(name, tuple(views))

    def _stream(self, r: Recent, window: float, model: PoolModel, now: float) -> Stream:
        """What the slo policy expects to keep arriving at a backend: its recent arrival rate,
        at the recent requests' mean size and this router's SLO (model seconds)."""
        mix, scale = self._mix, model.scale
        rate = r.rate(now, window) * scale
        output = mix.output or self.tuning.traffic.mean_output
        return Stream(rate, mix.prompt, output, mix.sampling, self.slo_ttft / scale,
                      self.slo_tpot / scale)  # fmt: skip

    def snapshot(self, request: Request | None = None) -> Snapshot:
        now = self.clock()
        tuning = self.tuning
        models = tuning.models if request is not None else None
        window = None if models is None else RECENT_WINDOW * models[SPECULATIVE].scale
        spec = None if models is None else models[SPECULATIVE]
        base = None if models is None else models[BASELINE]
        return Snapshot(
            self._view(SPECULATIVE, now, window, spec),
            self._view(BASELINE, now, window, base),
            tuning.crossover,
            self.hysteresis,
            self._state,
            tuning.gain,
            request,
            models,
            tuning.traffic.mean_output,
            self._mix.sampling,
            tuning.no_crossover,
        )

    def request(
        self, info: RequestInfo, slo_ttft: float | None = None, slo_tpot: float | None = None
    ) -> Request | None:
        """What the ``slo`` policy needs to know of a request (None under other policies)."""
        if self.policy != "slo":
            return None
        traffic = self.tuning.traffic
        tokens = info.prompt_tokens
        if tokens is None:
            tokens = round(info.prompt_chars * traffic.tokens_per_char)
        output = info.max_tokens if info.max_tokens else traffic.mean_output
        return Request(
            float(tokens),
            float(output),
            info.sampling,
            self.slo_ttft if slo_ttft is None else slo_ttft,
            self.slo_tpot if slo_tpot is None else slo_tpot,
        )

    def peek(self, request: Request | None = None) -> Decision | None:
        """What ``decide`` would answer now, changing nothing (for a queued request)."""
        return choose(self.policy, self.snapshot(request))[0]

    def decide(self, request: Request | None = None) -> Decision | None:
        snap = self.snapshot(request)
        decision, self._state = choose(self.policy, snap)
        if decision is not None and self.explore_share > 0 and self.policy != "round_robin":
            decision = self._maybe_explore(snap, decision)
        if decision is not None and request is not None and snap.models is not None:
            decision = self._sent(snap, decision, request, snap.models)
        return decision

    def _sent(
        self, snap: Snapshot, decision: Decision, req: Request, models: Mapping[Pool, PoolModel]
    ) -> Decision:
        """Note what the chosen backend was sent; the decision carries the state it saw."""
        self._mix.add(req)
        view = next(b for b in snap.pool(decision.pool).backends if b.url == decision.backend)
        model = models[decision.pool]
        if decision.extrapolated:
            self.extrapolated += 1
        prefill = model.prefill(req.prompt_tokens)
        self._recent[decision.backend].sent(prefill * model.scale)
        return decision._replace(load=view.load, prefill_share=view.prefill_share, prefill=prefill)

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

    def status(self) -> dict[str, Any]:
        """The slo policy's state, for /router/status."""
        models = self.tuning.models
        traffic = self.tuning.traffic
        pools: dict[str, Any] = {}
        recent: dict[str, Any] = {}
        if models is not None:
            window = RECENT_WINDOW * models[SPECULATIVE].scale
            now = self.clock()
            for pool, urls in self.pools.items():
                m = models[pool]
                pools[pool] = {
                    "measured_up_to": m.measured,
                    "tau_greedy": round(m.tau_greedy, 3),
                    "tau_sampling": round(m.tau_sampling, 3),
                    "prefill_base_s": round(m.prefill_base, 5),
                    "prefill_per_token_s": m.prefill_per_token,
                    "cap": m.cap,
                    "time_scale": m.scale,
                }
                for url in urls:
                    r = self._recent[url]
                    keep = math.exp(-(now - r.at) / window) if now > r.at else 1.0
                    load = self.backend_load(url)
                    ours = r.expected(window)
                    stream = self._stream(r, window, m, now)
                    recent[url] = {
                        # what the slo policy expects to keep arriving there (model time)
                        "stream": {
                            "rate_per_s": round(stream.rate, 4),
                            "prompt_tokens": round(stream.prompt, 1),
                            "output_tokens": round(stream.output, 1),
                            "sampling_share": round(stream.sampling, 3),
                        },
                        "prefill_share": round(r.prefill * keep / window, 4),
                        "expected_load": None if ours is None else round(ours * keep, 2),
                        # a prediction for the next request here would extrapolate the curve
                        "beyond_measured": load + 1 > max(1, m.measured),
                    }
        return {
            "slo_ttft_ms": self.slo_ttft * 1000,
            "slo_tpot_ms": self.slo_tpot * 1000,
            "models": pools or None,
            "backends": recent,
            "extrapolated_decisions": self.extrapolated,
            # the decayed share of recent requests no backend could take within their SLO;
            # past policy.PRESSURE_LIMIT the excess goes to the pool with the most throughput,
            # while what arrives is at least policy.OVERLOAD of what the engines can serve;
            # short of that, past policy.SATURATED, to the pool that serves fewer within the
            # relaxed SLO (``within_slo``: requests/s and the batch, as the traffic is now)
            "pressure": round(self._state.pressure, 3),
            **self._load_measures(),
            "sampling_share": round(self._mix.sampling, 3),
            "mean_output_tokens": round(traffic.mean_output, 1),
            "tokens_per_char": round(traffic.tokens_per_char, 4),
        }

    def _load_measures(self) -> dict[str, Any]:
        """What arrives over what the engines can serve (``policy.offered``) and what each
        pool serves within the relaxed SLO (``policy.slo_capacities``), as the next request
        would see them; None without models or streams."""
        models = self.tuning.models
        if models is None:
            return {"offered": None, "within_slo": None}
        snap = self.snapshot(Request(0.0, 0.0, False, self.slo_ttft, self.slo_tpot))
        share = offered(snap, models)
        if share is None:
            return {"offered": None, "within_slo": None}
        within = {
            pool: {
                "requests_per_s": round(held.rate / models[pool].scale, 3),
                "running": held.running,
            }
            for pool, held in slo_capacities(snap, models).items()
        }
        return {"offered": round(share, 3), "within_slo": within}

    def pool_usable(self, pool: Pool) -> bool:
        now = self.clock()
        return any(self.health.usable(url, now) for url in self.pools[pool])
