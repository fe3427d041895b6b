"""What one router process of ``spec-router serve --workers N`` knows of the others.

Its place (``WorkerContext``: its slot, the shared table, the run's directory), how an
operator's table reaches the other workers (``TableExchange``), and the refusal of plain
``uvicorn router.app:app --workers N`` (``router.uvicorn_guard``, and
``refuse_uvicorn_workers`` where it could not run): uvicorn's workers know
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
from router.uvicorn_guard import refusal, uvicorn_workers

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


def refuse_uvicorn_workers() -> None:
    """Stop ``uvicorn router.app:app --workers N`` (N > 1) in a worker, with one clear line:
    the fallback where ``router.uvicorn_guard`` did not run in uvicorn's own process (no .pth
    installed), so every worker prints it, after uvicorn said it was running."""
    if multiprocessing.parent_process() is None:
        return
    n = uvicorn_workers(sys.argv, dict(os.environ))
    if n <= 1:
        return
    print(refusal(n), file=sys.stderr, flush=True)
    # uvicorn's supervisor restarts a worker that exits: stop it, so that the refusal stands.
    os.kill(os.getppid(), signal.SIGTERM)
    raise SystemExit(2)
