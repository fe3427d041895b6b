"""What runs while the router serves, started and stopped in one place."""

from __future__ import annotations

import asyncio
import logging

from router.learn.keeper import CrossoverKeeper

tuning_log = logging.getLogger("spec_router.tuning")


async def keep_learning(keeper: CrossoverKeeper) -> None:
    """The keeper's timer: one learning step every ``LEARN_INTERVAL`` seconds, and the table
    written when ``PERSIST_INTERVAL`` has passed since it last was."""
    interval = keeper.settings.learn_interval
    while True:
        await asyncio.sleep(interval)
        try:
            keeper.update()
            if keeper.persist_due():
                keeper.persist()
        except Exception:
            tuning_log.exception("crossover update failed")
