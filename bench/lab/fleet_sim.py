"""The fleet in the lab: N engines that switch mode, a router in front, a controller deciding.

Engines (``fleet_engine``) run one of two presets. Switching one is a restart: it stops taking
requests, **finishes what it has in flight** (a graceful stop, as a Kubernetes pod given its
termination grace period does; the lab drops nothing), then is out of service for the target
mode's restart time (its preset's ``startup``), then comes up empty in the new mode. The drain
and the restart are counted apart.

The router (one for every row, so rows differ by their split only): the one users run
(``fleet_router.DeciderRouter``: the router's own decision shell with its default ``slo``
policy; engines join and leave it as discovery would tell it), or, without one, **spillover**:
a request goes to the least loaded speculative engine while that one has fewer than
``threshold`` in flight, else to the least loaded baseline engine; with one pool empty the
other takes all; ties rotate. ``threshold`` is the crossover from the curves at the workload's
mix (``router.plan.spill_threshold``), fixed for the run as a calibrated table would be.

A controller is called every ``interval`` seconds with what the lab's router could observe
(the arrivals counted in the interval, the recent lengths and temperature share, every engine's
mode, state, in-flight count and time to come up) and returns a switch or none; the lab applies
it. Static rows have no controller; the oracle's is a fixed schedule.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fleet_engine import Engine, Req
from fleet_router import DeciderRouter

from router.plan import Action, EngineState
from router.pools import BASELINE, SPECULATIVE, Pool
from router.sim.model import Preset

# Requests the mix is estimated over (the most recent ones): about ten minutes at mid load.
MIX_WINDOW = 2000


@dataclass
class Slot:
    """One engine's place in the fleet."""

    name: str
    mode: Pool  # serving (up), going to (draining, loading), or last (down)
    status: str = "up"  # up | draining | loading | down
    engine: Engine | None = None
    ready: float = 0.0  # loading: when it comes up
    drained: float = 0.0  # draining: when it began
    url: str = ""  # the engine's address as the router knows it (a new one per start)


@dataclass
class Switch:
    """One switch as it happened."""

    engine: str
    mode: Pool
    decided: float
    drained: float = math.nan  # when its last request finished
    up: float = math.nan  # when it came up in the new mode
    need: float = math.nan  # the controller's upper forecast over the restart, if it said
    have: float = math.nan  # what the engines staying up serve, as it reckoned
    short: bool = False  # the split up was below the need already when it decided


@dataclass
class Observed:
    """What a controller gets each interval."""

    now: float
    arrivals: int
    seconds: float
    prompts: Sequence[int]
    outputs: Sequence[int]
    hot: float
    fleet: tuple[EngineState, ...]


Controller = Callable[[Observed], tuple[Action | None, dict[str, float]]]


@dataclass
class Result:
    requests: list[Req]
    switches: list[Switch]
    timeline: list[tuple[float, int, int]]  # (time, speculative up, baseline up) at each change
    restart_s: float  # engine-seconds out of service restarting
    drain_s: float  # engine-seconds draining
    duration: float
    notes: list[dict[str, float]] = field(default_factory=list)  # the controller's, per call


class Fleet:
    def __init__(self, spec: Preset, base: Preset, n: int, speculative: int, seed: int,
                 threshold: int, router: DeciderRouter | None = None) -> None:  # fmt: skip
        if not 0 <= speculative <= n:
            raise ValueError("need 0 <= speculative engines <= n")
        self.presets: dict[Pool, Preset] = {SPECULATIVE: spec, BASELINE: base}
        self.seed = seed
        self.threshold = threshold
        self.router = router
        self.slots = [Slot(f"e{i}", SPECULATIVE if i < speculative else BASELINE)
                      for i in range(n)]  # fmt: skip
        self.started = 0
        for s in self.slots:
            s.engine = self._engine(s, 0.0)
            if router is not None:
                router.join(s.url, s.mode, 0.0)
        self.by_url = {s.url: s for s in self.slots}
        self.rr = 0
        self.done: list[Req] = []
        self.switches: list[Switch] = []
        self.timeline: list[tuple[float, int, int]] = [(0.0, *self.up_counts())]
        self.restart_s = self.drain_s = 0.0

    def _engine(self, slot: Slot, at: float) -> Engine:
        self.started += 1
        slot.url = f"http://{slot.name}.{self.started}"
        e = Engine(self.presets[slot.mode], self.seed * 1000 + self.started,
                   int(slot.name[1:]))  # fmt: skip
        e.t0 = at
        return e

    def up_counts(self) -> tuple[int, int]:
        ups = [s for s in self.slots if s.status == "up"]
        return (sum(s.mode == SPECULATIVE for s in ups), sum(s.mode == BASELINE for s in ups))

    def advance(self, t: float) -> None:
        """Run every engine to ``t``; drained engines start their restart, loaded ones come up."""
        changed = False
        for s in self.slots:
            if s.engine is not None:
                before = len(self.done)
                s.engine.advance(t, self.done)
                if self.router is not None:
                    for r in self.done[before:]:
                        self.router.finished(r)
                if s.status == "draining" and s.engine.load == 0:
                    last = max((r.last for r in self.done[before:]), default=s.drained)
                    end = max(last, s.drained)
                    self.drain_s += end - s.drained
                    s.status, s.engine = "loading", None
                    s.ready = end + self.presets[s.mode].startup
                    self.restart_s += self.presets[s.mode].startup
                    self._switch(s).drained = end
            if s.status == "loading" and s.ready <= t:
                s.status = "up"
                s.engine = self._engine(s, s.ready)
                self.by_url[s.url] = s
                if self.router is not None:
                    self.router.join(s.url, s.mode, s.ready)
                self._switch(s).up = s.ready
                changed = True
        if changed:
            self.timeline.append((t, *self.up_counts()))

    def _switch(self, s: Slot) -> Switch:
        return next(w for w in reversed(self.switches) if w.engine == s.name)

    def route(self, r: Req, t: float) -> None:
        if self.router is not None:
            url = self.router.route(r, t)
            if url is None:
                r.dropped = True
                self.done.append(r)
                return
            slot = self.by_url[url]
            assert slot.status == "up" and slot.engine is not None
            slot.engine.submit(r, t)
            return
        ups = [s for s in self.slots if s.status == "up" and s.engine is not None]
        if not ups:
            r.dropped = True
            self.done.append(r)
            return
        spec = [s for s in ups if s.mode == SPECULATIVE]
        base = [s for s in ups if s.mode == BASELINE]
        chosen = self._least(spec)
        if chosen is None or (base and self._load(chosen) >= self.threshold):
            chosen = self._least(base)
        assert chosen is not None and chosen.engine is not None
        self.rr += 1
        chosen.engine.submit(r, t)

    @staticmethod
    def _load(s: Slot) -> int:
        assert s.engine is not None
        return s.engine.load

    def _least(self, slots: list[Slot]) -> Slot | None:
        if not slots:
            return None
        n = len(slots)
        return min((slots[(self.rr + i) % n] for i in range(n)), key=self._load)

    def apply(self, action: Action, t: float, note: dict[str, float]) -> None:
        slot = next(s for s in self.slots if s.name == action.engine)
        if slot.status not in ("up", "down"):
            raise ValueError(f"{slot.name} is {slot.status}: one switch at a time")
        w = Switch(slot.name, action.mode, t, need=note.get("need", math.nan),
                   have=note.get("have", math.nan), short=bool(note.get("short", 0.0)))  # fmt: skip
        self.switches.append(w)
        if slot.status == "down":
            slot.mode, slot.status = action.mode, "loading"
            slot.ready = t + self.presets[action.mode].startup
            self.restart_s += self.presets[action.mode].startup
            w.drained = t
        else:
            if self.router is not None:
                self.router.leave(slot.url, t)
            slot.mode, slot.status, slot.drained = action.mode, "draining", t
        self.timeline.append((t, *self.up_counts()))

    def states(self, t: float) -> tuple[EngineState, ...]:
        out = []
        for s in self.slots:
            load = s.engine.load if s.engine is not None else 0
            if s.status == "loading":
                eta = s.ready - t
            elif s.status == "draining":
                eta = self.presets[s.mode].startup
            else:
                eta = 0.0
            out.append(EngineState(s.name, s.mode, s.status, max(0.0, eta), load))  # type: ignore[arg-type]
        return tuple(out)


def run(
    requests: Sequence[Req],
    spec: Preset,
    base: Preset,
    n: int,
    speculative: int,
    threshold: int,
    seed: int = 1,
    controller: Controller | None = None,
    interval: float = 60.0,
    duration: float | None = None,
    router: DeciderRouter | None = None,
) -> Result:
    """Every request routed onto a fleet of ``n`` engines (``speculative`` of them speculative
    at the start), with ``controller`` called every ``interval`` seconds; until all finish.
    ``router``: the router users run (``fleet_router``, fresh for this run); None: spillover
    at ``threshold``."""
    reqs = [Req(r.at, r.prompt, r.output, r.hot, r.index) for r in requests]
    fleet = Fleet(spec, base, n, speculative, seed, threshold, router)
    end = duration if duration is not None else (reqs[-1].at if reqs else 0.0)
    notes: list[dict[str, float]] = []
    recent: deque[Req] = deque(maxlen=MIX_WINDOW)
    tick = interval
    counted = 0
    i = 0
    while i < len(reqs) or (controller is not None and tick <= end):
        at = reqs[i].at if i < len(reqs) else math.inf
        if controller is not None and tick <= end and tick <= at:
            fleet.advance(tick)
            if recent:
                hot = sum(r.hot for r in recent) / len(recent)
                obs = Observed(tick, counted, interval, [r.prompt for r in recent],
                               [r.output for r in recent], hot, fleet.states(tick))  # fmt: skip
                action, note = controller(obs)
                note["t"] = tick
                notes.append(note)
                if action is not None:
                    fleet.apply(action, tick, note)
            counted = 0
            tick += interval
            continue
        r = reqs[i]
        fleet.advance(r.at)
        fleet.route(r, r.at)
        recent.append(r)
        counted += 1
        i += 1
    fleet.advance(math.inf)
    return Result(reqs, fleet.switches, fleet.timeline, fleet.restart_s, fleet.drain_s, end,
                  notes)  # fmt: skip
