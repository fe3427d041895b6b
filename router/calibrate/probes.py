"""Short measurements after the sweep, for the ``slo`` policy's models: prefill and sampling.

- **Prefill**: at concurrency 1 (an idle engine: a request starts at once, alone) the time to
  first token is the prefill plus one iteration. Requests with a short and a long prompt, next
  to the sweep's own, give each pool's prefill line ``base + tokens * per_token``.
- **Sampling**: the speculative engine's decode speed at concurrency 1 with temperature 1,
  against the sweep's at temperature 0: drafts are accepted less often when sampling, and the
  ratio of the two speeds is the ratio of the acceptance lengths. Measured only when the sweep
  itself was greedy (``--temperature 0``, the default) on a synthetic workload.

Pure helpers; ``router.calibrate.sweep.probe`` does the I/O with the sweep's own level runner.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from router.decide.table import Point, Prefill, fit_line

SHORT_PROMPT = 16
LONG_PROMPT_MIN = 2048
PROBE_REQUESTS = 6


def prefill_line(samples: Sequence[tuple[float, float]]) -> Prefill | None:
    """A prefill line through (prompt tokens, prefill seconds) samples; None without spread."""
    usable = [(x, y) for x, y in samples if math.isfinite(y) and y > 0]
    if len({x for x, _ in usable}) < 2:
        return None
    line = fit_line([x for x, _ in usable], [y for _, y in usable])
    per_token = max(0.0, line.beta)
    return Prefill(max(0.0, line.alpha), per_token)


def iteration_at_one(point: Point, tau: float) -> float:
    """Seconds per iteration of a lone request, from its decode speed (tokens/s / tau)."""
    return tau / point.decode_tps_p50 if point.decode_tps_p50 > 0 else 0.0


def long_prompt(workload_prompt: int) -> int:
    return max(LONG_PROMPT_MIN, 4 * workload_prompt)
