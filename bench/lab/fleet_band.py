"""The forecast's band at the sockets' scale: a pure replay, no engines, no planner.

Yesterday as ``spec-router fleet`` seeds it (the envelope's mean rate an interval), then today's
Poisson counts, ~2 an interval as over sockets (``bench/fleet.py`` compresses the day 48x),
through the router's window of ten intervals with the newest interval's own count, with or
without a x3 surge of ten intervals at 1.5 h of an 8-hour day. At some intervals of the day, the
band's top at the day's peak against the point there (``eagle3-chain`` keeps all speculative only
while that is under about +16%), the mean over the seeds.

    python bench/lab/fleet_band.py                  # the forecast as it is
    python bench/lab/fleet_band.py --var-step 0     # its variance the errors' mean square
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from router.plan import ForecastParams, Holt, forecast, observe  # noqa: E402

DAY = 480  # intervals (8 hours of planner minutes)
WIN = 10  # the router's window, intervals
CAPACITY = 3.86  # arrivals an interval at the all-baseline fleet's SLO capacity, over sockets
PEAK = DAY // 2
AT = (80, 95, 100, 110, 120, 150, 180, 210)


def share(t: float, surge: bool) -> float:
    """The envelope: 10-110% of capacity over the day, x3 for ten intervals from 1.5 h."""
    s = 0.1 + 1.0 * (1 - math.cos(2 * math.pi * t / DAY)) / 2
    return s * 3 if surge and 90 <= t < 100 else s


def expected(surge: bool) -> list[float]:
    return [sum(share(i + (j + 0.5) / 12, surge) for j in range(12)) / 12 * CAPACITY
            for i in range(DAY)]  # fmt: skip


def counts(rates: list[float], seed: int) -> list[int]:
    rng = random.Random(seed)
    out = []
    for r in rates:
        c, t = 0, rng.expovariate(1.0)
        while t < r:
            c += 1
            t += rng.expovariate(1.0)
        out.append(c)
    return out


def day(p: ForecastParams, seed: int, surge: bool) -> dict[int, float]:
    """The band's top at the peak over the point there, at each of ``AT``."""
    state: Holt | None = None
    for r in expected(False):
        state = observe(state, r, 1.0, p)
    got = {}
    cs = counts(expected(surge), seed)
    for i, c in enumerate(cs[: max(AT) + 1]):
        last = cs[max(0, i - WIN + 1) : i + 1]
        state = observe(state, sum(last) / len(last), float(len(last)), p, overlap=len(last),
                        fresh=(float(c), 1.0))  # fmt: skip
        if i in AT:
            fc = forecast(state, 180, 1.0, p)
            k = min(179, PEAK - i - 1)
            got[i] = fc.upper[k] / fc.point[k] - 1
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--var-step", type=float, default=None)
    ap.add_argument("--seeds", type=int, default=8)
    args = ap.parse_args(argv)
    p = ForecastParams(season=DAY)
    if args.var_step is not None:
        p = p._replace(var_step=args.var_step)
    print("interval: " + " ".join(f"{i:>5}" for i in AT))
    for surge in (False, True):
        runs = [day(p, s, surge) for s in range(args.seeds)]
        cells = " ".join(f"{100 * statistics.mean(r[i] for r in runs):+4.0f}%" for i in AT)
        print(f"{'surge' if surge else 'calm':>8}: {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
