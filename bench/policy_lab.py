"""Policy lab: routing policies against open-loop traffic on the simulated engines, in-process.

A discrete-event simulation of two continuous-batching engines that follows the sims' own model
(``router.sim.model``: iteration cost, prefill stalls, speculative gains, ``max_running``), driven
by the same pure policy functions the router runs (``router.decide.policy``). It answers in
seconds what an HTTP replay answers in minutes, so policies can be compared on many workloads;
``bench/traffic.py`` then checks the conclusions over real sockets.

    python bench/policy_lab.py --workload poisson --rates 0.3,1.5,2.5
    python bench/policy_lab.py --workload azure-conv --loads 0.3,0.7,1.1
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from router.decide.learner import LearnConfig, Learner, marginal_gain
from router.decide.policy import (
    BackendView,
    Decision,
    PoolView,
    RoutingState,
    Snapshot,
    choose,
)
from router.decide.predict import PoolModel, Request
from router.pools import BASELINE, SPECULATIVE, Pool
from router.settings import PolicyName
from router.sim.model import (
    BASELINE as BASE_PRESET,
)
from router.sim.model import (
    EAGLE3,
    Preset,
    prefill_time,
    sample_gain,
    solve_alpha,
    step_time,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.support.models import preset_model  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces"


@dataclass(frozen=True)
class Arrival:
    at: float
    prompt_tokens: int
    output_tokens: int
    temperature: float


@dataclass
class Req:
    arrival: Arrival
    pool: Pool = SPECULATIVE
    generated: int = 0
    first: float | None = None
    last: float | None = None
    rng: random.Random = field(default_factory=random.Random)

    @property
    def done(self) -> bool:
        return self.generated >= self.arrival.output_tokens


class Engine:
    def __init__(self, preset: Preset, url: str, seed: int) -> None:
        self.p = preset
        self.url = url
        self.running: list[Req] = []
        self.waiting: deque[Req] = deque()
        self.context = 0
        self.busy_until: float | None = None  # end of the iteration under way
        self.joiners: list[Req] = []
        self.completed = 0
        self.alpha = {
            False: solve_alpha(preset.tau, preset.spec_k),
            True: solve_alpha(preset.tau_sampling, preset.spec_k),
        }
        self.seed = seed

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    def submit(self, req: Req, now: float) -> None:
        req.rng = random.Random(f"{self.seed}:{id(req)}")
        self.waiting.append(req)
        if self.busy_until is None:
            self._start(now)

    def _start(self, now: float) -> None:
        self.joiners = []
        while self.waiting and len(self.running) < self.p.max_running:
            r = self.waiting.popleft()
            self.running.append(r)
            self.context += r.arrival.prompt_tokens
            self.joiners.append(r)
        if not self.running:
            self.busy_until = None
            return
        d = step_time(self.p, len(self.running), self.context)
        d += sum(prefill_time(self.p, r.arrival.prompt_tokens) for r in self.joiners)
        self.busy_until = now + d

    def finish_iteration(self, now: float, done: list[Req]) -> None:
        k = self.p.spec_k
        gained = 0
        for r in self.running:
            if r.generated == 0:
                g = 1
                r.first = now
            else:
                g = (
                    sample_gain(self.alpha[r.arrival.temperature > 0], k, r.rng.random())
                    if k
                    else 1
                )
                g = min(g, r.arrival.output_tokens - r.generated)
            r.generated += g
            gained += g
            if r.done:
                r.last = now
        self.context += gained
        for r in [r for r in self.running if r.done]:
            self.completed += 1
            self.running.remove(r)
            self.context -= r.arrival.prompt_tokens + r.generated
            done.append(r)
        self._start(now)


Chooser = Callable[[Snapshot, Arrival], Decision | None]


def run(
    arrivals: Sequence[Arrival],
    choose_backend: Chooser,
    snapshot: Callable[[list[Engine], float, RoutingState], Snapshot],
    seed: int = 0,
    presets: tuple[Preset, Preset] = (EAGLE3, BASE_PRESET),
    pools: tuple[Pool, Pool] = (SPECULATIVE, BASELINE),
) -> list[Req]:
    engines = [Engine(p, f"e{i}", seed + i) for i, p in enumerate(presets)]
    pool_of = {e.url: pools[i] for i, e in enumerate(engines)}
    done: list[Req] = []
    state = RoutingState()
    for a in arrivals:
        # advance every engine to the arrival
        while True:
            nxt = min(
                (e for e in engines if e.busy_until is not None and e.busy_until <= a.at),
                key=lambda e: e.busy_until or 0.0,
                default=None,
            )
            if nxt is None:
                break
            assert nxt.busy_until is not None
            nxt.finish_iteration(nxt.busy_until, done)
        if isinstance(snapshot, SloSnapshot):
            snapshot.arrival = a
        snap = snapshot(engines, a.at, state)
        decision = choose_backend(snap, a)
        assert decision is not None
        state = snap.state._replace(rr=snap.state.rr + 1)
        req = Req(a, pool_of[decision.backend])
        next(e for e in engines if e.url == decision.backend).submit(req, a.at)
    while any(e.busy_until is not None for e in engines):
        nxt = min((e for e in engines if e.busy_until is not None), key=lambda e: e.busy_until or 0)
        assert nxt.busy_until is not None
        nxt.finish_iteration(nxt.busy_until, done)
    return done


# -- workloads ----------------------------------------------------------------------------------


def lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(median * math.exp(sigma * rng.gauss(0, 1)))))


def poisson(rate: float, duration: float, seed: int, sampling_share: float = 0.5) -> list[Arrival]:
    rng = random.Random(seed)
    t, out = 0.0, list[Arrival]()
    while True:
        t += rng.expovariate(rate)
        if t > duration:
            return out
        temp = 1.0 if rng.random() < sampling_share else 0.0
        out.append(
            Arrival(t, lognormal(rng, 400, 1.0, 8, 8000), lognormal(rng, 200, 0.8, 2, 2000), temp)
        )


def bursty(rate: float, duration: float, seed: int) -> list[Arrival]:
    """On/off: 10 s on at 3x the mean rate, 20 s off at 0 (mean = rate)."""
    rng = random.Random(seed)
    t, out = 0.0, []
    while t < duration:
        phase = t % 30.0
        if phase >= 10.0:
            t += 30.0 - phase
            continue
        t += rng.expovariate(rate * 3)
        if t % 30.0 < 10.0 and t < duration:
            temp = 1.0 if rng.random() < 0.5 else 0.0
            out.append(
                Arrival(
                    t, lognormal(rng, 400, 1.0, 8, 8000), lognormal(rng, 200, 0.8, 2, 2000), temp
                )
            )
    return out


def azure(
    name: str, rate: float, duration: float, seed: int, offset: float = 600.0, hot: float = 0.5
) -> list[Arrival]:
    rows = []
    with open(TRACES / f"azure-llm-2023-{name}.csv") as fh:
        for row in csv.DictReader(fh):
            ts = datetime.fromisoformat(row["TIMESTAMP"][:26])
            rows.append((ts.timestamp(), int(row["ContextTokens"]), int(row["GeneratedTokens"])))
    t0 = rows[0][0]
    rows = [(t - t0, p, o) for t, p, o in rows]
    natural = len(rows) / rows[-1][0]
    scale = natural / rate  # time stretch
    rng = random.Random(seed)
    out = []
    for t, p, o in rows:
        at = t * scale - offset
        if 0 <= at <= duration:
            temp = 1.0 if rng.random() < hot else 0.0
            out.append(Arrival(at, max(1, p), max(2, o), temp))
    return out


# -- scoring ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    strict: float
    relaxed: float
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p90: float
    spec_share: float
    n: int


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def score(done: list[Req], warm: float = 0.0) -> Score:
    rs = [r for r in done if r.arrival.at >= warm]
    ttft, tpot, strict, relaxed = [], [], 0, 0
    for r in rs:
        assert r.first is not None and r.last is not None
        t1 = r.first - r.arrival.at
        t2 = (
            (r.last - r.first) / (r.arrival.output_tokens - 1) if r.arrival.output_tokens > 1 else 0
        )
        ttft.append(t1)
        tpot.append(t2)
        strict += t1 <= 1.0 and t2 <= 0.025
        relaxed += t1 <= 3.0 and t2 <= 0.050
    n = max(1, len(rs))
    return Score(
        strict / n,
        relaxed / n,
        pct(ttft, 0.5),
        pct(ttft, 0.99),
        pct(tpot, 0.5),
        pct(tpot, 0.9),
        sum(r.pool == SPECULATIVE for r in rs) / n,
        len(rs),
    )


# -- policies -----------------------------------------------------------------------------------


def model_curves_gain(prompt: int = 400, output: int = 200) -> Callable[[Pool, int], float] | None:
    sys.path.insert(0, str(ROOT))
    from tests.support.tables import model_table

    learner = Learner(LearnConfig(), model_table(prompt, output))
    return marginal_gain(learner.curves())


def basic_snapshot(
    crossover: int, gain: Callable[[Pool, int], float] | None
) -> Callable[[list[Engine], float, RoutingState], Snapshot]:
    def build(engines: list[Engine], now: float, state: RoutingState) -> Snapshot:
        spec = PoolView(SPECULATIVE, (BackendView(engines[0].url, engines[0].load),))
        base = PoolView(BASELINE, (BackendView(engines[1].url, engines[1].load),))
        return Snapshot(spec, base, crossover, 1, state, gain)

    return build


class SloSnapshot:
    """Snapshots for the slo policy: request features, models, and each engine's prefill share
    (a decayed sum of the prefill time sent to it, as the router's decider keeps it)."""

    def __init__(self, window: float = 5.0, ttft: float = 1.0, tpot: float = 0.025) -> None:
        self.models: dict[Pool, PoolModel] = {
            SPECULATIVE: preset_model(EAGLE3),
            BASELINE: preset_model(BASE_PRESET),
        }
        self.window = window
        self.share: dict[str, tuple[float, float]] = {}  # url -> (value, at)
        self.slo = (ttft, tpot)
        self.arrival: Arrival | None = None

        self.stats: dict[str, list[float]] = {}

    def prefill_share(self, url: str, now: float) -> float:
        v, at = self.share.get(url, (0.0, now))
        return v * math.exp(-(now - at) / self.window) / self.window

    def sent(self, url: str, pool: Pool, prompt: int, now: float) -> None:
        v, at = self.share.get(url, (0.0, now))
        v = v * math.exp(-(now - at) / self.window) + self.models[pool].prefill(prompt)
        self.share[url] = (v, now)

    def load_avg(self, e: Engine, now: float) -> float:
        """Little's law on measured stays, as the router's decider keeps it."""
        st = self.stats.setdefault(e.url, [0.0, 0.0, 0.0, 0.0, 0, now, 0])
        arrivals, area, done, area_total, done_last, at, load_last = st
        keep = math.exp(-(now - at) / self.window)
        area_total += load_last * (now - at)
        st[0] = arrivals * keep
        st[1] = area * keep + load_last * (now - at)
        st[2] = done * keep + (e.completed - done_last)
        st[3], st[4], st[5], st[6] = area_total, e.completed, now, e.load
        stay = st[1] / st[2] if st[2] > 0 else 0.0
        return float(st[0]) / self.window * stay

    def __call__(self, engines: list[Engine], now: float, state: RoutingState) -> Snapshot:
        a = self.arrival
        assert a is not None
        views = [
            BackendView(
                e.url,
                e.load,
                prefill_share=self.prefill_share(e.url, now),
                load_avg=self.load_avg(e, now),
            )
            for e in engines
        ]
        req = Request(a.prompt_tokens, a.output_tokens, a.temperature > 0, *self.slo)
        return Snapshot(
            PoolView(SPECULATIVE, (views[0],)),
            PoolView(BASELINE, (views[1],)),
            7,
            1,
            state,
            None,
            req,
            self.models,
        )


def slo_policy(snaps: SloSnapshot) -> Chooser:
    def decide(snap: Snapshot, a: Arrival) -> Decision | None:
        d = choose("slo", snap)[0]
        if d is not None:
            snaps.sent(d.backend, d.pool, a.prompt_tokens, a.at)
            snaps.stats[d.backend][0] += 1.0
        return d

    return decide


def named(policy: PolicyName) -> Chooser:
    def decide(snap: Snapshot, a: Arrival) -> Decision | None:
        return choose(policy, snap)[0]

    return decide


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--workload", default="poisson", choices=["poisson", "bursty", "azure-conv", "azure-code"]
    )
    ap.add_argument("--rates", default="0.3,1.0,1.5,2.0,2.5")
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--policies", default="round_robin,spillover,predictive")
    args = ap.parse_args(argv)
    gain = model_curves_gain()
    policies = args.policies.split(",")
    print(
        f"workload {args.workload}, {args.duration:g} s, {args.seeds} seeds: "
        "strict/relaxed goodput %, TTFT p99, TPOT p50, share to speculative"
    )
    for rate in [float(x) for x in args.rates.split(",")]:
        for policy in policies:
            scores = []
            for seed in range(args.seeds):
                if args.workload == "poisson":
                    arr = poisson(rate, args.duration, seed)
                elif args.workload == "bursty":
                    arr = bursty(rate, args.duration, seed)
                else:
                    arr = azure(args.workload.split("-")[1], rate, args.duration, seed)
                if policy.startswith("slo"):
                    parts = policy.split(":")  # slo:TTFT:TPOT
                    ttft, tpot = (
                        (float(parts[1]), float(parts[2])) if len(parts) == 3 else (1.0, 0.025)
                    )
                    snaps = SloSnapshot(ttft=ttft, tpot=tpot)
                    done = run(arr, slo_policy(snaps), snaps, seed)
                else:
                    done = run(arr, named(policy), basic_snapshot(7, gain), seed)
                scores.append(score(done))
            s = [
                sum(getattr(x, f) for x in scores) / len(scores) for f in Score.__dataclass_fields__
            ]
            print(
                f"rate {rate:4.2f} {policy:12s} strict {100 * s[0]:5.1f} relaxed {100 * s[1]:5.1f} "
                f"ttft p99 {s[3]:6.2f} tpot p50 {1000 * s[4]:6.1f} ms "
                f"spec {100 * s[6]:4.0f}% n {s[7]:.0f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
