"""The two pools every request chooses between, as a typed literal."""

from __future__ import annotations

from typing import Final, Literal

Pool = Literal["speculative", "baseline"]
SPECULATIVE: Final = "speculative"
BASELINE: Final = "baseline"
POOLS: Final[tuple[Pool, Pool]] = (SPECULATIVE, BASELINE)


def other(pool: Pool) -> Pool:
    return BASELINE if pool == SPECULATIVE else SPECULATIVE
