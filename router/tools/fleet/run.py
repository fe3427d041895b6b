"""One fleet run: the DNS zone, the engines, the router, the actuator and the replay.

Three clocks. The engines' model clock: what the sims simulate, what requests are scored in
(the SLOs) and what ``--time-scale`` turns into wall seconds. The day's clock: the envelope,
the restart time and the planner's minutes; ``compress`` day seconds pass per engine second.
And the wall clock, which only the processes see. The router's planner is told its own
seconds are ``time_scale / compress`` wall seconds (``SPEC_ROUTER_PLAN_TIME_SCALE``), so it
plans a day of minutes and restarts of ``--restart-s`` as if they were real.

The actuator polls the router's plan and members (``actuator.step``) and moves engines between
the zone's two names; it records each outage (an engine out of service for a switch) and the
split over time. After the replay, the run waits until the router holds nothing in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from router.decide.table import to_json
from router.plan import Holt, Mix, mix_of, observe
from router.planning.service import MIX_WINDOW, Sample, holt_document, params_of, sample_of
from router.pools import BASELINE, POOLS, SPECULATIVE, Pool
from router.settings import Settings, sim_time_env
from router.sim.model import Preset
from router.tools.fleet.actuator import Landed, Leave, Restart, Slot, split, step
from router.tools.fleet.engines import Engine, address, free_port, initial_modes
from router.tools.fleet.score import Outage
from router.tools.fleet.table import model_table
from router.tools.fleet.zone import Zone
from router.tools.goodput import Result
from router.tools.processes import Proc, spawn
from router.tools.replay import replay
from router.tools.replay_report import Sent
from router.tools.traffic import Arrival

NAMES: dict[Pool, str] = {
    SPECULATIVE: "speculative.fleet.spec-router.test",
    BASELINE: "baseline.fleet.spec-router.test",
}
LOOK = 0.1  # wall seconds between two looks of the actuator
READY_TIMEOUT = 60.0


@dataclass(frozen=True)
class FleetConfig:
    engines: int
    speculative: int  # engines speculative at the start
    planner: bool  # else the split stays
    spec: Preset
    base: Preset
    time_scale: float  # wall seconds per engine second (the sims' --time-scale)
    compress: float  # day seconds per engine second
    restart_s: float  # day seconds out of service for a switch
    day_seconds: float
    mean_prompt: float
    mean_output: float
    yesterday: tuple[float, ...] = ()  # arrivals per day second, one per planner interval
    # the mix the router kept from the day before, and the requests it was read from
    yesterday_mix: tuple[Mix, Sample] | None = None
    plan_interval: float = 60.0  # day seconds
    drain: float = 600.0  # engine seconds the replay waits for the last answers
    # end the day once this many switches have landed (a smoke test of the actuation that
    # does not hang on how soon the planner acts); the arrivals after are not sent
    until_switches: int | None = None

    @property
    def plan_time_scale(self) -> float:
        return self.time_scale / self.compress

    @property
    def restart_engine_s(self) -> float:
        """The restart in engine seconds (the sims' ``--startup-delay``)."""
        return self.restart_s / self.compress


@dataclass
class Timeline:
    """What the actuator saw, on the day's clock."""

    split: list[tuple[float, int, int, int]] = field(default_factory=list)  # t, spec, base, out
    outages: list[Outage] = field(default_factory=list)
    plans: list[dict[str, Any]] = field(default_factory=list)  # the advice it acted on
    in_flight_after: int | None = None  # the router's count once the replay ended
    last_plan: dict[str, Any] | None = None  # GET /router/plan once the replay ended
    plans_seen: int = 0  # distinct plans the actuator read (a planner that stalls shows here)
    # CPU seconds (user + system) each process used until the replay ended, and the cores it
    # may run on: the router, its plan worker, the engines (their sum), this process (the load)
    cpu: dict[str, Any] = field(default_factory=dict)


@dataclass
class FleetRun:
    results: list[Result]
    timeline: Timeline
    router_output: list[str]


def router_env(
    cfg: FleetConfig, zone: Zone, port: int, table: Path, state: Path | None
) -> dict[str, str]:
    ts = cfg.time_scale
    env = {
        "SPEC_ROUTER_SPECULATIVE_URLS": f"http://{NAMES[SPECULATIVE]}:{port}",
        "SPEC_ROUTER_BASELINE_URLS": f"http://{NAMES[BASELINE]}:{port}",
        "SPEC_ROUTER_DISCOVERY": "dns",
        "SPEC_ROUTER_DNS_SERVERS": zone.address,
        "SPEC_ROUTER_DISCOVERY_INTERVAL": "0.1",
        "SPEC_ROUTER_DISCOVERY_GRACE": "0",
        "SPEC_ROUTER_DRAIN_TIMEOUT": f"{max(5.0, cfg.drain * ts):g}",
        "SPEC_ROUTER_HEALTH_INTERVAL": f"{min(2.0, max(0.05, 0.5 * ts)):g}",
        "SPEC_ROUTER_TABLE_PATH": str(table),
        "SPEC_ROUTER_PLANNER": "autoscale" if cfg.planner else "off",
        "SPEC_ROUTER_PLAN_INTERVAL": f"{cfg.plan_interval:g}",
        "SPEC_ROUTER_PLAN_TIME_SCALE": f"{cfg.plan_time_scale:g}",
        "SPEC_ROUTER_PLAN_SEASON": f"{cfg.day_seconds:g}",
        "SPEC_ROUTER_RESTART_S": f"{cfg.restart_s:g}",
        "SPEC_ROUTER_GPU_BUDGET": str(cfg.engines),
        "SPEC_ROUTER_ADMIN_TOKEN": secrets.token_hex(8),
        "SPEC_ROUTER_LOG_LEVEL": "info",
        **sim_time_env(ts),
    }
    if state is not None:
        env["SPEC_ROUTER_PLAN_STATE_PATH"] = str(state)
        env["SPEC_ROUTER_PLAN_RECORD_PATH"] = str(state.with_name("plan-rounds.bin"))
    return env


def yesterday_state(cfg: FleetConfig, env: dict[str, str]) -> dict[str, Any] | None:
    """The forecast's state after yesterday (its rates in wall requests per second, one per
    planner interval), as the router keeps it across restarts: the planner starts the day
    having seen one, as the bench lab's does; with the mix it kept (``yesterday_mix``)."""
    if not cfg.yesterday:
        return None
    with _environ(env):
        params = params_of(Settings())
    wall = params.interval
    holt: Holt | None = None
    for per_day_second in cfg.yesterday:
        # per day second -> per engine second (x compress) -> per wall second (/ time_scale)
        holt = observe(holt, per_day_second * cfg.compress / cfg.time_scale, wall,
                       params.forecast)  # fmt: skip
    if holt is None:
        return None
    mix, sample = cfg.yesterday_mix if cfg.yesterday_mix is not None else (None, None)
    return holt_document(holt, wall, mix, sample)


def yesterday_mix(day: Sequence[Arrival]) -> tuple[Mix, Sample]:
    """The mix a router that served ``day`` keeps at its end (``PLAN_STATE_PATH``): its last
    MIX_WINDOW requests' lengths and share at temperature > 0 (what ``FleetPlanner`` reads
    them into), and how many there were with their lengths' spreads (``sample_of``)."""
    last = [(a.prompt_tokens, max(1, a.output_tokens), a.temperature > 0)
            for a in list(day)[-MIX_WINDOW:]]  # fmt: skip
    if not last:
        raise ValueError("a mix needs at least one request")
    hot = sum(s for _, _, s in last) / len(last)
    mix = mix_of([float(p) for p, _, _ in last], [float(o) for _, o, _ in last], hot)
    return mix, sample_of(last)


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Any:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Fleet:
    """The running fleet: zone, engines, router; ``run`` replays arrivals through it."""

    def __init__(self, cfg: FleetConfig, workdir: Path) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.zone = Zone()
        hosts = [address(i) for i in range(cfg.engines)]
        self.port = free_port(hosts)
        presets: dict[Pool, str] = {SPECULATIVE: cfg.spec.name, BASELINE: cfg.base.name}
        self.engines = [
            Engine(i, self.port, mode, presets, cfg.time_scale, workdir)
            for i, mode in enumerate(initial_modes(cfg.engines, cfg.speculative))
        ]
        self.slots = {e.url: Slot(e.url, e.mode, "serving") for e in self.engines}
        self.router: Proc | None = None
        self.timeline = Timeline()
        self.acted: set[str] = set()
        self._last_at: Any = None
        self.zero = time.monotonic()
        self.enough = asyncio.Event()  # set once ``until_switches`` have landed

    # -- set-up and tear-down ----------------------------------------------------------------
    async def start(self) -> str:
        for e in self.engines:
            e.start(e.mode)
        await self._wait_engines([e.url for e in self.engines])
        self._publish()
        cfg = self.cfg
        table = self.workdir / "table.json"
        doc = to_json(model_table(cfg.spec, cfg.base, round(cfg.mean_prompt),
                                  round(cfg.mean_output), cfg.time_scale))  # fmt: skip
        table.write_text(json.dumps(doc))
        state = self.workdir / "plan-state.json" if cfg.planner else None
        env = router_env(cfg, self.zone, self.port, table, state)
        if state is not None:
            held = yesterday_state(cfg, env)
            if held is not None:
                state.write_text(json.dumps(held))
        self.router = await asyncio.to_thread(spawn, ["-m", "router", "serve", "--port", "0"], env)
        await self._wait_members()
        return self.router.url

    def stop(self) -> None:
        if self.router is not None:
            self.router.stop()
            (self.workdir / "router.log").write_text("\n".join(self.router.output) + "\n")
        for e in self.engines:
            e.stop()
        self.zone.close()

    async def _wait_engines(self, urls: Sequence[str]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        async with httpx.AsyncClient(timeout=1.0) as client:
            for url in urls:
                while True:
                    with contextlib.suppress(httpx.HTTPError):
                        if (await client.get(f"{url}/ready")).status_code == 200:
                            break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"engine {url} did not come up")
                    await asyncio.sleep(0.05)

    async def _wait_members(self) -> None:
        """Until the router routes to every engine (each a usable member of its pool)."""
        assert self.router is not None
        want = {e.url for e in self.engines}
        deadline = time.monotonic() + READY_TIMEOUT
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    status = (await client.get(f"{self.router.url}/router/status")).json()
                    usable = {b["url"] for p in status["pools"].values() for b in p["backends"]
                              if b["usable"]}  # fmt: skip
                    if want <= usable:
                        return
                if time.monotonic() > deadline:
                    raise RuntimeError("the router did not find every engine:\n"
                                       + "\n".join(self.router.output[-30:]))  # fmt: skip
                await asyncio.sleep(0.05)

    def _publish(self) -> None:
        """The zone's names answer each mode's engines that serve or load in it."""
        for pool in POOLS:
            self.zone.set(NAMES[pool], [
                e.host for e in self.engines
                if self.slots[e.url].mode == pool and self.slots[e.url].phase != "leaving"
            ])  # fmt: skip

    # -- the day ------------------------------------------------------------------------------
    def day(self, t: float | None = None) -> float:
        """Day seconds since the replay's zero."""
        now = time.monotonic() if t is None else t
        return (now - self.zero) / self.cfg.time_scale * self.cfg.compress

    async def run(
        self,
        arrivals: Sequence[Arrival],
        watch: Callable[[Sent], Coroutine[Any, Any, None]] | None = None,
    ) -> FleetRun:
        assert self.router is not None
        url = self.router.url
        async with httpx.AsyncClient(timeout=5.0) as client:
            self.zero = time.monotonic() + 0.05  # (the replay's own zero, within a few ms)
            acting = asyncio.create_task(self._act(client, url))
            try:
                results = await replay(arrivals, url, time_scale=self.cfg.time_scale,
                                       drain=self.cfg.drain, watch=watch,
                                       stop=self.enough)  # fmt: skip
                if self.enough.is_set():  # (the day ended early: what was not sent is not in it)
                    results = [r for r in results if r.error != "not sent"]
            finally:
                acting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await acting
            self.timeline.in_flight_after = await self._settled(client, url)
            if self.cfg.planner:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    self.timeline.last_plan = (await client.get(f"{url}/router/plan")).json()
        self.timeline.cpu = self._cpu()
        self._sample()
        return FleetRun(results, self.timeline, list(self.router.output))

    async def _settled(self, client: httpx.AsyncClient, url: str) -> int | None:
        """The router's count of requests in flight once it stops moving (polled)."""
        deadline = time.monotonic() + 10.0
        total: int | None = None
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                status = (await client.get(f"{url}/router/status")).json()
                total = int(sum(p["in_flight"] for p in status["pools"].values()))
                if total == 0:
                    return 0
            await asyncio.sleep(0.05)
        return total

    def _cpu(self) -> dict[str, Any]:
        """CPU seconds and cores of the run's processes so far (``Timeline.cpu``)."""
        assert self.router is not None
        worker = ((self.timeline.last_plan or {}).get("worker") or {}).get("pid")
        engines = [e.proc.pid for e in self.engines if e.proc is not None]
        out: dict[str, Any] = {
            "router": cpu_of(self.router.pid),
            "plan_worker": None if worker is None else cpu_of(int(worker)),
            "engines_now": [cpu_of(pid) for pid in engines],  # (a restarted engine: since)
            "load": cpu_of(os.getpid()),
        }
        return out

    def _sample(self) -> None:
        counts = split(list(self.slots.values()))
        out = sum(s.phase != "serving" for s in self.slots.values())
        row = (self.day(), counts[SPECULATIVE], counts[BASELINE], out)
        if not self.timeline.split or self.timeline.split[-1][1:] != row[1:]:
            self.timeline.split.append(row)

    async def _act(self, client: httpx.AsyncClient, url: str) -> None:
        self._sample()
        until = self.cfg.until_switches
        while True:
            try:
                await self._look(client, url)
            except (httpx.HTTPError, ValueError, KeyError):
                pass  # the next look tries again
            self._sample()
            landed = sum(o.back is not None for o in self.timeline.outages)
            if until is not None and landed >= until:
                self.enough.set()
            await asyncio.sleep(LOOK)

    async def _look(self, client: httpx.AsyncClient, url: str) -> None:
        plan: dict[str, Any] | None = None
        if self.cfg.planner:
            plan = (await client.get(f"{url}/router/plan")).json()
            if plan.get("at") != self._last_at and plan.get("status") == "planning":
                self._last_at = plan.get("at")
                self.timeline.plans_seen += 1
        members: dict[Pool, dict[str, Any]] = {}
        for pool in POOLS:
            doc = (await client.get(f"{url}/router/pools/{pool}/backends")).json()
            members[pool] = {b["url"]: b for b in doc["backends"]}
        healthy: dict[str, bool] = {}
        for s in self.slots.values():
            if s.phase == "loading":
                with contextlib.suppress(httpx.HTTPError):
                    healthy[s.url] = (
                        await client.get(f"{s.url}/ready", timeout=0.5)
                    ).status_code == 200
        # how long a drained engine waits for the planner to see it go: a few plans
        patience = 4 * self.cfg.plan_interval * self.cfg.plan_time_scale + 2.0
        slots = list(self.slots.values())
        acted = frozenset(self.acted)
        for move in step(plan, slots, members, healthy, acted, time.monotonic(), patience):
            await self._apply(move, plan, members)

    async def _apply(
        self,
        move: Leave | Restart | Landed,
        plan: dict[str, Any] | None,
        members: dict[Pool, dict[str, Any]],
    ) -> None:
        engine = next(e for e in self.engines if e.url == move.url)
        now = self.day()
        if isinstance(move, Leave):
            self.acted.add(move.switch_id)
            self.slots[move.url] = Slot(move.url, move.source, "leaving", move.into,
                                        move.switch_id, time.monotonic())  # fmt: skip
            self._publish()
            held = int(members[move.source].get(move.url, {}).get("in_flight", 0))
            self.timeline.outages.append(Outage(move.url, now, None, move.into, held))
            if plan is not None:
                self.timeline.plans.append({"t_day": now, "switch": plan.get("switch"),
                                            "reason": plan.get("reason")})  # fmt: skip
        elif isinstance(move, Restart):
            await asyncio.to_thread(engine.stop)
            engine.start(move.into, self.cfg.restart_engine_s)
            self.slots[move.url] = Slot(move.url, move.into, "loading")
            self._publish()
        else:
            self.slots[move.url] = Slot(move.url, move.mode, "serving")
            for i in range(len(self.timeline.outages) - 1, -1, -1):
                o = self.timeline.outages[i]
                if o.engine == move.url and o.back is None:
                    self.timeline.outages[i] = o._replace(back=now)
                    break


def cpu_of(pid: int) -> dict[str, Any] | None:
    """A live process's CPU seconds (user + system, from /proc) and allowed cores; None when
    it is gone or there is no /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cores = sorted(os.sched_getaffinity(pid))
    except (OSError, IndexError, AttributeError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    # fields[0] is the state (field 3): utime and stime are fields 14 and 15
    return {"pid": pid, "cpu_s": round((int(fields[11]) + int(fields[12])) / tick, 2),
            "cores": cores}  # fmt: skip


async def run_fleet(
    cfg: FleetConfig,
    arrivals: Sequence[Arrival],
    watch: Callable[[Sent], Coroutine[Any, Any, None]] | None = None,
    keep: Path | None = None,
) -> FleetRun:
    """Start the fleet, replay ``arrivals`` (engine clock) through it, stop it."""
    workdir = Path(tempfile.mkdtemp(prefix="spec-router-fleet-"))
    fleet = Fleet(cfg, workdir)
    try:
        await fleet.start()
        return await fleet.run(arrivals, watch)
    finally:
        await asyncio.to_thread(fleet.stop)
        if keep is not None:
            shutil.copytree(workdir, keep, dirs_exist_ok=True)
        shutil.rmtree(workdir, ignore_errors=True)
