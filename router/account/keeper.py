"""Keeps the crossover current: feeds served requests to the learner, moves the crossover on a
timer, persists the table, and swaps in a table an operator PUTs. The thin shell around
``router.decide.learner`` (pure) and ``router.decide.table`` (pure, plus an atomic file write).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from router.account.inflight import SPECULATIVE, InflightTracker
from router.decide import table as tables
from router.decide.learner import LearnConfig, Learner, marginal_gain
from router.decide.snapshot import Router
from router.decide.table import Table
from router.forward.proxy import Outcome
from router.settings import Settings

log = logging.getLogger("spec_router.tuning")

# A relative change in acceptance length that counts as news (re-target without waiting).
TAU_CHANGE = 0.03


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class CrossoverKeeper:
    def __init__(
        self,
        settings: Settings,
        router: Router,
        tracker: InflightTracker,
        table: Table | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.router = router
        self.tracker = tracker
        self.clock = clock
        self.pinned = settings.crossover is not None  # an explicit CROSSOVER is not learned over
        self.table_path = settings.table_path
        self.learning = settings.learn
        self.learner = self._learner(table)
        self._tau_used: float | None = None
        self._last_persist = clock()
        self.updates = 0
        self._publish_gain()

    def _learner(self, table: Table | None) -> Learner:
        s = self.settings
        cfg = LearnConfig(
            decay=s.learn_decay, max_step=s.learn_max_step, min_samples=s.learn_min_samples
        )
        return Learner(cfg, table)

    def _publish_gain(self) -> None:
        self.router.gain = marginal_gain(self.learner.curves())

    # -- input ----------------------------------------------------------------------------------
    def observe(self, out: Outcome) -> None:
        """Outcome observer: a finished, complete stream becomes a learning sample."""
        usage = out.usage
        first = out.first_byte
        if (
            not self.learning
            or out.backend is None
            or out.pool is None
            or usage is None
            or first is None
            or out.area_first is None
            or out.status != 200
            or out.client_gone
            or out.error is not None
            or not out.stream
            or usage.completion_tokens < 2
            or out.ended <= first
        ):
            return
        decode = out.ended - first
        concurrency = (self.tracker.area(out.backend, out.ended) - out.area_first) / decode
        spt = decode / (usage.completion_tokens - 1)
        self.learner.record(
            out.pool, concurrency, spt, first - out.started, out.ended - out.started
        )

    def _accept_length(self) -> float | None:
        # (an idle engine reports 0: no speculation happened, not an acceptance of 0)
        values = [
            seen.accept_length
            for url, seen in self.router.engine.items()
            if self.tracker.pool_of.get(url) == SPECULATIVE
            and seen.accept_length is not None
            and seen.accept_length >= 1.0
        ]
        return sum(values) / len(values) if values else None

    # -- the timer ------------------------------------------------------------------------------
    def update(self) -> int | None:
        """One learning step; returns the new crossover if it moved."""
        self.updates += 1
        tau = self._accept_length()
        self.learner.observe_accept(tau)
        changed = (
            tau is not None
            and self._tau_used is not None
            and abs(tau - self._tau_used) / self._tau_used > TAU_CHANGE
        )
        if tau is not None and (self._tau_used is None or changed):
            self._tau_used = tau
        self._publish_gain()
        if self.pinned or not self.learning:
            return None
        new = self.learner.step(self.router.crossover, changed or self._tau_moved_since_seed())
        if new is None:
            return None
        log.info(
            "crossover %d -> %d (learned; target %s, acceptance %s)",
            self.router.crossover,
            new,
            self.learner.target(),
            "n/a" if tau is None else f"{tau:.2f}",
        )
        self.router.set_crossover(new, "learned")
        return new

    def _tau_moved_since_seed(self) -> bool:
        tau = self.learner.tau
        ref = self.learner.ref_tau
        return tau is not None and ref > 1.0 and abs(tau - ref) / ref > TAU_CHANGE

    def table(self) -> Table:
        return self.learner.table(self.router.crossover, self.router.crossover_source, _now_iso())

    def persist(self) -> None:
        if self.table_path is None:
            return
        try:
            tables.save(self.table(), self.table_path)
        except OSError as exc:
            log.warning("cannot write the crossover table to %s: %s", self.table_path, exc)
        self._last_persist = self.clock()

    def replace(self, raw: Any) -> Table:
        """Validate and apply a new table (raises ``TableError``; the old one stays then)."""
        table = tables.from_json(raw)
        self.learner = self._learner(table)
        self._tau_used = None
        self.router.set_crossover(table.crossover, table.source)
        self._publish_gain()
        self.persist()
        return table

    async def run(self) -> None:
        interval = self.settings.learn_interval
        while True:
            await asyncio.sleep(interval)
            try:
                self.update()
                if self.clock() - self._last_persist >= self.settings.persist_interval:
                    self.persist()
            except Exception:
                log.exception("crossover update failed")
