"""How often the host takes a pinned core away: a busy loop reads the clock for a few seconds
and counts the gaps between reads over 20 us (a quiet core has almost none). Run it pinned,
under ``flock -x`` with nothing else running:

    taskset -c 0 python bench/lab/host_stalls.py --seconds 3
"""

from __future__ import annotations

import argparse
import collections
import time


def gaps(seconds: float, over_ns: int = 20_000) -> list[int]:
    """The gaps (ns) over ``over_ns`` between consecutive clock reads in ``seconds``."""
    clock = time.perf_counter_ns
    end = clock() + int(seconds * 1e9)
    last = clock()
    found = []
    while last < end:
        now = clock()
        if now - last > over_ns:
            found.append(now - last)
        last = now
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    found = sorted(gaps(args.seconds))
    by_50us = collections.Counter(min(g // 50_000 * 50, 1000) for g in found)
    print(
        f"{len(found)} gaps over 20 us in {args.seconds:g} s ({len(found) / args.seconds:.0f} a "
        f"second), {sum(found) / 1e6:.1f} ms in all; largest us {[g // 1000 for g in found[-5:]]}; "
        f"by 50 us (1000: 1 ms or more): {dict(sorted(by_50us.items()))}"
    )


if __name__ == "__main__":
    main()
