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
    # light: a request that finds nothing in flight goes to the speculative engine (one that
    # finds another there may do more good on the idle baseline: the default policy weighs the
    # slowdown it would cause)
    spans = [(r.sent_at or 0.0, (r.sent_at or 0.0) + (r.e2e or 0.0)) for r in light]
    alone = [
        r for r, (t, _) in zip(light, spans, strict=True) if not any(a < t < b for a, b in spans)
    ]
    assert alone and {r.pool for r in alone} == {"speculative"}, light
    # heavy: arrivals outpace one engine; the baseline takes a share
    pools = Counter(r.pool for r in heavy)
    assert pools["baseline"] > 0 and pools["speculative"] > 0, pools
    assert (tmp_path / "heavy.md").read_text().startswith("#")
    wait_for(lambda: router_status(router.url)["in_flight"]["total"] == 0)
