"""Is the router's RSS growth over a soak a leak? Rounds of plain load (no faults) through the
soak's four sims, the router's footprint after each round once idle; with ``--collect`` the
router runs with a thread that calls ``gc.collect()`` every 10 s.

The router collects young objects only every 50,000 allocations and older ones far more rarely
(``router.lifecycle.GC_YOUNG_THRESHOLD``, chosen for throughput): cyclic garbage waits for those. If
RSS keeps growing with ``--collect`` too, something is leaked; if it flattens, it was garbage.

    python bench/lab/soak_rss.py [--rounds 5] [--requests 4000] [--collect]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from collections import Counter
from pathlib import Path

# (bench/lab/: the soak's modules are one folder up, the package two)
BENCH = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from soak import SERVE, client, router_env  # noqa: E402
from soak_checks import Engines, footprint  # noqa: E402

from router.tools.processes import pinned, spawn  # noqa: E402

COLLECTING = [
    "-c",
    "import gc, sys, threading, time\n"
    "def collect():\n"
    "    while True:\n"
    "        time.sleep(10)\n"
    "        gc.collect()\n"
    "threading.Thread(target=collect, daemon=True).start()\n"
    "from router.process.serve import main\n"
    "sys.exit(main(['--port', '0']))\n",
]


async def rounds(args: argparse.Namespace) -> None:
    engines = Engines(0.05, pinned(1))
    engines.start_all()
    command = COLLECTING if args.collect else SERVE
    env = router_env(engines.pool("eagle3"), engines.pool("baseline"))
    router = spawn(command, env, prefix=pinned(0))
    try:
        await engines.wait_usable(router.url)
        rng = random.Random(1)
        print(f"collect={args.collect}: round, outcomes, footprint after the round once idle")
        for n in range(args.rounds):
            tally: Counter[str] = Counter()
            each = args.requests // args.clients + 1
            await asyncio.gather(
                *(client(router.url, rng, tally, [each]) for _ in range(args.clients))
            )
            await engines.settle(router.url)
            print(n, dict(tally), footprint(router.pid, router.url), flush=True)
    finally:
        router.stop()
        engines.stop_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--clients", type=int, default=24)
    parser.add_argument("--collect", action="store_true")
    asyncio.run(rounds(parser.parse_args()))


if __name__ == "__main__":
    main()
