"""Open-loop arrivals through the router with ``spec-router replay``: requests come when they
come, not when the last one ends."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from router.tools.goodput import Result
from router.tools.llamacpp import MODEL
from router.tools.replay_report import read_json
from tests.real.conftest import Calibration, RouterFactory
from tests.support.http import router_status, wait_for


def replay(url: str, rate: float, duration: float, seed: int, out: Path) -> list[Result]:
    """Poisson arrivals, 40-word prompts, 32-token outputs, as a user runs it."""
    done = subprocess.run(
        [
            sys.executable, "-m", "router", "replay", "--url", url, "--model", MODEL,
            "--synthetic", "poisson", "--rate", str(rate), "--duration", str(duration),
            "--seed", str(seed), "--prompt-median", "40", "--prompt-sigma", "0",
            "--output-median", "32", "--output-sigma", "0", "--drain", "120",
            "--out", str(out), "--report", str(out.with_suffix(".md")),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    _, results = read_json(out)
    return results


def _median(values: list[float | None]) -> float | None:
    known = sorted(v for v in values if v is not None)
    return known[len(known) // 2] if known else None


def _totals_at_top(calibration: Calibration) -> tuple[float, float]:
    """Each pool's calibrated total tok/s at the highest concurrency measured on both."""
    spec = {p.concurrency: p.total_tps for p in calibration.table.speculative.points}
    base = {p.concurrency: p.total_tps for p in calibration.table.baseline.points}
    top = max(set(spec) & set(base))
    return spec[top], base[top]


def test_replay_light_then_heavy(
    calibration: Calibration, start_router: RouterFactory, tmp_path: Path
) -> None:
    table = tmp_path / "table.json"
    shutil.copy(calibration.path, table)
    router = start_router(TABLE_PATH=str(table), EXPLORE_SHARE="0")

    light = replay(router.url, 0.5, 12.0, 1, tmp_path / "light.json")
    heavy = replay(router.url, 4.0, 15.0, 2, tmp_path / "heavy.json")
    assert light and heavy
    assert all(r.ok for r in light + heavy), [r.error for r in light + heavy if not r.ok]
    assert all(r.output_tokens == 32 for r in light + heavy)
    # heavy: arrivals outpace one engine, and both take a share
    heavy_pools = Counter(r.pool for r in heavy)
    assert heavy_pools["baseline"] > 0 and heavy_pools["speculative"] > 0, heavy_pools
    # light: most go to the speculative engine when speculation pays there, and the baseline
    # takes a larger share under the heavy load. Whether it pays is the engines' to say, not the
    # test's: the prompts start with a per-run nonce, and on some runs this draft pair decodes
    # no faster than the baseline (speculative TPOT 22-37 ms against the baseline's 21-36 ms,
    # where other runs give 10-13 against 28-35), and then the router rightly learns not to
    # prefer it (its predictions follow what it measures: tests/learn/test_learning_e2e.py).
    light_spec = sum(r.pool == "speculative" for r in light) / len(light)
    heavy_spec = heavy_pools["speculative"] / len(heavy)
    spec_tpot = _median([r.tpot for r in light if r.pool == "speculative"])
    base_tpot = _median([r.tpot for r in light if r.pool == "baseline"])
    pays = spec_tpot is not None and (base_tpot is None or spec_tpot < 0.8 * base_tpot)
    # Under the heavy load the router sends the excess where the engines serve more. On a GPU
    # that is the baseline (the pivot's 354 against 773 tok/s); two llama-servers sharing two CPU
    # cores may not cross at all (2026-12-04, a slow host: calibrated 41.3 against 33.3 tok/s at
    # 16 requests, and 83% of the heavy phase rightly went to speculation). The calibration
    # says which, at the most requests it measured on both.
    spec_top, base_top = _totals_at_top(calibration)
    context = Counter(r.pool for r in light), heavy_pools, spec_tpot, base_tpot, spec_top, base_top
    if pays:
        assert light_spec >= 0.5, context
        if base_top > spec_top:
            assert heavy_spec < light_spec, context
        elif spec_top > 1.1 * base_top:
            assert heavy_spec >= 0.5, context
    assert (tmp_path / "heavy.md").read_text().startswith("#")
    wait_for(lambda: router_status(router.url)["in_flight"]["total"] == 0)
