"""The fleet lab's fast engine against the policy lab's step-by-step one, on the same requests.

Both run the sims' loop (``router.sim.model``); ``bench/lab_sim.py``'s engine steps every
iteration and draws every speculative gain, ``bench/lab/fleet_engine.py`` jumps between events
and draws each request's decode iterations once. One engine, Poisson arrivals with the Azure
conversation trace's lengths (80% at temperature 1), 3000 s, several rates and presets.

    python bench/lab/fleet_fidelity.py     # writes bench/results/fleet-engine-fidelity.md
"""

from __future__ import annotations

import math
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

import lab_sim  # noqa: E402
from fleet_engine import Engine, Req  # noqa: E402
from fleet_regimes import REGIMES, regime  # noqa: E402
from fleet_workloads import trace_lengths  # noqa: E402

from router.sim.model import Preset  # noqa: E402
from router.tools.traffic import Arrival  # noqa: E402

OUT = HERE.parents[1] / "bench" / "results" / "fleet-engine-fidelity.md"
DURATION, WARMUP, HOT = 3000.0, 100.0, 0.8


def workload(rate: float, seed: int = 1) -> list[Arrival]:
    rng = random.Random(seed)
    pairs = trace_lengths("conv")
    out: list[Arrival] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t > DURATION:
            return out
        p, o = pairs[rng.randrange(len(pairs))]
        out.append(Arrival(t, p, o, 1.0 if rng.random() < HOT else 0.0))


def stats(rows: list[tuple[float, float]]) -> tuple[float, ...]:
    def q(xs: list[float], p: float) -> float:
        return sorted(xs)[int(p * len(xs))]

    ttft, tpot = [r[0] for r in rows], [r[1] for r in rows]
    strict = sum(a <= 1 and b <= 0.025 for a, b in rows) / len(rows)
    relaxed = sum(a <= 3 and b <= 0.05 for a, b in rows) / len(rows)
    return strict, relaxed, q(ttft, 0.5), q(ttft, 0.9), q(tpot, 0.5), q(tpot, 0.9)


def compare(p: Preset, rate: float) -> tuple[tuple[float, ...], tuple[float, ...], float, float]:
    arrivals = workload(rate)
    t0 = time.perf_counter()
    slow = lab_sim.Engine(p, "x", 1)
    done: list[lab_sim.Req] = []
    for a in arrivals:
        while slow.busy_until is not None and slow.busy_until <= a.at:
            slow.finish_iteration(slow.busy_until, [], done)
        slow.submit(lab_sim.Req(a), a.at)
    while slow.busy_until is not None:
        slow.finish_iteration(slow.busy_until, [], done)
    t1 = time.perf_counter()
    fast = Engine(p, 1)
    done2: list[Req] = []
    for a in arrivals:
        fast.advance(a.at, done2)
        fast.submit(Req(a.at, a.prompt_tokens, a.output_tokens, a.temperature > 0), a.at)
    fast.advance(math.inf, done2)
    t2 = time.perf_counter()
    a_rows = []
    for r in done:
        if r.arrival.at > WARMUP and r.first is not None and r.last is not None:
            n = r.arrival.output_tokens
            a_rows.append((r.first - r.arrival.at, (r.last - r.first) / (n - 1) if n > 1 else 0.0))
    b_rows = [(r.ttft, r.tpot) for r in done2 if r.at > WARMUP]
    return stats(a_rows), stats(b_rows), t1 - t0, t2 - t1


def main() -> int:
    lines = [
        "# The fleet lab's engine against the policy lab's",
        "",
        "    python bench/lab/fleet_fidelity.py",
        "",
        __doc__.split("\n\n")[1].replace("\n", " "),
        "",
        "| preset | req/s | strict % (step / event) | relaxed % | TTFT p50 / p90 s (step) | "
        "(event) | TPOT p50 / p90 ms (step) | (event) | seconds (step / event) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    seen = set()
    for reg in REGIMES:
        for p in regime(reg):
            if p.name in seen:
                continue
            seen.add(p.name)
            for rate in (0.3, 0.6, 0.9):
                a, b, ta, tb = compare(p, rate)
                lines.append(
                    f"| {p.name} | {rate} | {100 * a[0]:.1f} / {100 * b[0]:.1f} | "
                    f"{100 * a[1]:.1f} / {100 * b[1]:.1f} | {a[2]:.2f} / {a[3]:.2f} | "
                    f"{b[2]:.2f} / {b[3]:.2f} | {1000 * a[4]:.1f} / {1000 * a[5]:.1f} | "
                    f"{1000 * b[4]:.1f} / {1000 * b[5]:.1f} | {ta:.2f} / {tb:.2f} |"
                )
                print(lines[-1], flush=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
