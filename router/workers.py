"""What one router process of ``spec-router serve --workers N`` knows of the others.

Its place (``WorkerContext``: its slot, the shared table, the run's directory), how an
operator's table reaches the other workers (``TableExchange``), and the refusal of plain
``uvicorn router.app:app --workers N`` (``refuse_uvicorn_workers``): uvicorn's workers know
nothing of each other, so each would route with its own counts. The processes themselves are
``router.process``'s; the app only reads this.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from router.account.shared import SharedTable
from router.decide import table as tables

if TYPE_CHECKING:
    from router.learn.keeper import CrossoverKeeper

log = logging.getLogger("spec_router.worker")

# Seconds between a worker's looks for a table another worker was given (PUT /router/table).
TABLE_FOLLOW_INTERVAL = 0.25


@dataclass(frozen=True)
class WorkerContext:
    """What one worker is told about its place: its slot, the table, the run's directory."""

    slot: int
    count: int
    table: SharedTable
    rundir: Path

    @property
    def leader(self) -> bool:
        return self.slot == 0

    @property
    def metrics_dir(self) -> Path:
        return self.rundir / "metrics"

    @property
    def discovery_status(self) -> Path:
        """Where the leader, which discovers, leaves the names' state for the others."""
        return self.rundir / "discovery.json"

    @property
    def table_exchange(self) -> Path:
        """Where a worker leaves an operator's table for the others (``PUT /router/table``)."""
        return self.rundir / "table.json"


class TableExchange:
    """An operator's table, from the worker that took the PUT to the others: the file in the
    run's directory and a sequence number in the table's header. (The crossover it carries is
    in force everywhere at once, through the board; this brings the curves and models.)"""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.seen = ctx.table.table_seq

    def share(self, raw: Any) -> None:
        path = self.ctx.table_exchange
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(raw))
        os.replace(tmp, path)  # whole or not at all, for a reader in another worker
        self.seen = self.ctx.table.bump_table_seq()

    async def follow(self, keeper: CrossoverKeeper) -> None:
        while True:
            await asyncio.sleep(TABLE_FOLLOW_INTERVAL)
            seq = self.ctx.table.table_seq
            if seq == self.seen:
                continue
            self.seen = seq
            try:
                raw = json.loads(self.ctx.table_exchange.read_text())
                keeper.replace(raw, publish=False)
            except (OSError, ValueError, tables.TableError) as exc:
                log.warning("cannot take up the table another worker was given: %s", exc)


def uvicorn_workers(argv: list[str], environ: dict[str, str]) -> int:
    """How many workers the uvicorn command line that started this process asked for (its
    workers are spawned with the supervisor's ``sys.argv``); 1 when it is not that."""
    if not argv or "--reload" in argv:
        return 1
    program = os.path.basename(argv[0])
    if program != "uvicorn" and not argv[0].endswith(os.path.join("uvicorn", "__main__.py")):
        return 1
    value = environ.get("WEB_CONCURRENCY", "1")
    for i, arg in enumerate(argv):
        if arg == "--workers" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--workers="):
            value = arg.split("=", 1)[1]
    return int(value) if value.isdigit() else 1


def refuse_uvicorn_workers() -> None:
    """Stop ``uvicorn router.app:app --workers N`` (N > 1) at start-up, with one clear line."""
    if multiprocessing.parent_process() is None:
        return
    n = uvicorn_workers(sys.argv, dict(os.environ))
    if n <= 1:
        return
    print(
        f"spec-router: refusing to run under `uvicorn --workers {n}`: each worker would route "
        "with its own in-flight counts. Use `spec-router serve --workers N` (one shared count).",
        file=sys.stderr,
        flush=True,
    )
    # uvicorn's supervisor restarts a worker that exits: stop it, so that the refusal stands.
    os.kill(os.getppid(), signal.SIGTERM)
    raise SystemExit(2)
