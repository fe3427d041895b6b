"""``spec-router demo`` against real sims: the load generator's own CPU per run, the demo's table,
and the live page it names and holds."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from router.calibrate.loadgen import run_closed_loop
from router.sim.model import BASELINE, EAGLE3
from router.tools.demo import (
    engine_facts,
    run_target,
    scrape_metrics,
)
from router.tools.processes import Proc


def test_each_run_measures_the_load_generators_own_cpu(sims: dict[str, Proc]) -> None:
    # this process is the load generator: a run of 0.6 s costs it some CPU, and no more than
    # the run's length (one thread)
    args = argparse.Namespace(duration=0.6, prompt_tokens=32, output_tokens=32, time_scale=0.05)
    point, _ = asyncio.run(run_target(sims["baseline"].url, "baseline", 4, args))
    assert point.total_tps > 0
    assert 0.0 < point.loadgen_cpu <= 1.05


def test_the_demo_table_has_the_engines_acceptance_length_and_caps(sims: dict[str, Proc]) -> None:
    # as calibrate reads them: a table that says 1.0 for an engine that accepts 2.8 tokens an
    # iteration makes the router take each of its iterations for 2.8 times shorter than it is
    spec, base = sims["speculative"].url, sims["baseline"].url
    before = asyncio.run(scrape_metrics(spec))
    asyncio.run(
        run_closed_loop(
            f"{spec}/v1", concurrency=2, prompt_tokens=32, output_tokens=64, duration=1.0
        )
    )
    urls = {"speculative": spec, "baseline": base}
    tau, caps = asyncio.run(engine_facts(spec, urls, before))
    assert tau == pytest.approx(EAGLE3.tau, rel=0.15)  # greedy requests: the preset's 2.8
    assert caps == {"speculative": EAGLE3.max_running, "baseline": BASELINE.max_running}


@pytest.mark.slow
def test_the_demo_names_its_live_page_and_holds(tmp_path: Path) -> None:
    # (short requests: a run of 0.4 s measures several after its warm-up)
    cmd = [sys.executable, "-m", "router", "demo", "--levels", "2", "--duration", "0.4"]
    cmd += ["--output-tokens", "32"]
    cmd += ["--hold", "1.5", "--hold-step", "0.5", "--plot", str(tmp_path / "demo.png")]
    lines: list[str] = []
    page = None
    up_while_holding = False
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("live page: "):
                    page = line.split()[2]
                    r = httpx.get(page, follow_redirects=True, timeout=10)
                    assert r.status_code == 200 and "spec-router live" in r.text
                if line.startswith("holding for") and page is not None:
                    r = httpx.get(page.replace("/router/ui", "/ready"), timeout=10)
                    up_while_holding = r.status_code == 200
            assert proc.wait(timeout=120) == 0, "".join(lines)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert page is not None, "".join(lines)
    assert up_while_holding, "".join(lines)
    assert (tmp_path / "demo.png").exists()
