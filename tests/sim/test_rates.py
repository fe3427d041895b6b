"""Each preset's batching loop, run closed-loop on a virtual clock, follows its analytic model.

Every preset (each engine regime's speculative preset and the baseline) at concurrency 1, 16
and 64: per-request decode tok/s and total tok/s within 5% of ``closed_loop``, measured the way
calibration measures them (``window_stats``). On virtual time (tests/support/clock.py) the
answer is the same on a busy machine as on a quiet one; what HTTP adds on top is measured over
sockets by ``bench/sim_fidelity.py`` (``bench/results/sim-fidelity.md``).
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from router.calibrate.loadgen import RequestResult, window_stats
from router.sim.engine import Engine
from router.sim.model import PRESETS, Preset, closed_loop, prefill_time
from tests.support.clock import VirtualTimeLoop, run_virtual

PROMPT, OUTPUT = 32, 64
CONCURRENCY = (1, 16, 64)
# Model seconds measured per point: at concurrency 1 a speculative preset's rate rests on a few
# hundred random acceptance draws, so it gets longer.
WINDOW, WINDOW_ONE = 10.0, 16.0


def warmup(p: Preset, n: int) -> float:
    """Model seconds before the steady state: the first iteration takes every first prefill at
    once; then a quarter of a request's life (three quarters when requests queue, as the first
    ones, of spread lengths, end sooner than steady-state ones)."""
    point = closed_loop(p, n, PROMPT, OUTPUT)
    request = OUTPUT / point.per_request_tps
    burst = min(n, p.max_running) * prefill_time(p, PROMPT) + 2 * point.iteration_time
    return burst + (0.75 if n > p.max_running else 0.25) * request


def closed_loop_results(p: Preset, n: int, duration: float) -> list[RequestResult]:
    """``n`` clients back to back against the engine for ``duration`` virtual seconds, each
    first request's length spread as ``run_closed_loop(desync=True)`` spreads it."""

    async def main(loop: VirtualTimeLoop) -> list[RequestResult]:
        engine = Engine(p, seed=1, clock=loop.time)
        runner = asyncio.create_task(engine.run())
        results: list[RequestResult] = []
        end = loop.time() + duration

        async def client(worker: int) -> None:
            seq = 0
            length = max(2, round(OUTPUT * (worker + 1) / n))
            while loop.time() < end:
                result = RequestResult(worker, seq, loop.time(), length, status=200)
                results.append(result)
                req = engine.submit(PROMPT, length)
                while tokens := await req.next_tokens():
                    result.chunk_times.append(loop.time())
                    result.chunk_tokens.append(tokens)
                result.end = loop.time()
                seq, length = seq + 1, OUTPUT

        await asyncio.gather(*(client(i) for i in range(n)))
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        return results

    return run_virtual(main)


@pytest.mark.parametrize("concurrency", CONCURRENCY)
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_rates_follow_the_model(name: str, concurrency: int) -> None:
    preset = PRESETS[name]
    model = closed_loop(preset, concurrency, PROMPT, OUTPUT)
    window = WINDOW_ONE if concurrency == 1 and preset.spec_k else WINDOW
    warm = warmup(preset, concurrency)
    results = closed_loop_results(preset, concurrency, warm + window)
    start = min(r.start for r in results)
    stats = window_stats(results, start + warm, start + warm + window)
    assert stats.requests >= concurrency
    assert stats.per_request_tps == pytest.approx(model.per_request_tps, rel=0.05)
    assert stats.total_tps == pytest.approx(model.total_tps, rel=0.05)
