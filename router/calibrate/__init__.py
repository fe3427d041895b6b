"""``spec-router calibrate``: measure both pools and write the crossover table.

Drives the speculative pool, then the baseline pool, each directly (not through a router) and
alone, with a closed loop of N clients at each concurrency level; measures per-request decode
tok/s, time to first token, end-to-end latency and total tok/s; and writes both curves, their
fits and the crossover (the lowest concurrency from which the baseline is at least as good) as
a versioned JSON table (``router.decide.table``) that the router loads from
``SPEC_ROUTER_TABLE_PATH``. ``docs/calibration.md`` tells how to run it against real servers
and how to read its plot.

* ``cli`` — the command line: arguments in, table and plot out.
* ``sweep`` — the I/O: each level's closed loop, the engines' counters; ``progress`` — the bar.
* ``loadgen`` — the closed-loop load generator the sweep (and the demo) drive engines with.
* ``levels`` — pure: what a level measured, whether to trust it, the table.
* ``workload`` — pure: the synthetic workload and the JSONL dataset format.
* ``plot`` — the PNG (needs matplotlib, the ``plot`` extra).
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str]) -> int:
    from router.calibrate.cli import main as run

    return run(argv)
