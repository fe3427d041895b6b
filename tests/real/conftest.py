"""The real-engine tier: llama.cpp's llama-server as the speculative and the baseline engine.

Run by ``make test-real`` only (``scripts/test-real.sh``: it builds the engine and the models
first, cached, and passes their paths in ``SPEC_ROUTER_LLAMA_SERVER`` and
``SPEC_ROUTER_REAL_MODELS``); plain ``make test`` does not collect this directory (pyproject's
``testpaths``). Both servers run for the whole session, each on a core of its own; the tests
compare the two within one run (ratios, never absolute speeds: this machine's speed varies).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from router.decide.table import Table, from_json
from router.tools.llamacpp import Build, LlamaServer, cores
from router.tools.processes import Proc, spawn
from tests.support.http import router_ready, router_status, wait_for

# What every test sends: ~60-token prompts ("hello" is one token of the model's vocabulary,
# plus the chat template and the nonce), 64-token outputs.
PROMPT_WORDS = 40
OUTPUT_TOKENS = 64
LEVELS = (1, 4, 16)
# The service level to route for (the default slo policy's): these one-core engines make ~40-90
# tok/s for a lone request and 4-8 at 16, against the default 25 ms per token meant for GPUs.
SLO = {"SLO_TTFT_MS": "3000", "SLO_TPOT_MS": "100"}


@pytest.fixture(scope="session")
def build() -> Build:
    return Build.from_env()


@pytest.fixture(scope="session")
def engines(build: Build, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    logs = tmp_path_factory.mktemp("llama-server")
    spec_core, base_core = cores()
    spec = LlamaServer(build, True, spec_core, logs)
    base = LlamaServer(build, False, base_core, logs)
    try:
        spec.start(wait=False)
        base.start(wait=False)
        spec.wait_ready()
        base.wait_ready()
        yield Engines(spec, base)
    finally:
        spec.stop()
        base.stop()


@dataclass
class Engines:
    speculative: LlamaServer
    baseline: LlamaServer

    def by_pool(self, pool: str) -> LlamaServer:
        return self.speculative if pool == "speculative" else self.baseline


@dataclass(frozen=True)
class Calibration:
    path: Path
    table: Table
    stdout: str
    stderr: str


@pytest.fixture(scope="session")
def calibration(engines: Engines, tmp_path_factory: pytest.TempPathFactory) -> Calibration:
    """``spec-router calibrate`` against both servers, interleaved, as a user runs it."""
    out = tmp_path_factory.mktemp("calibration") / "table.json"
    done = subprocess.run(
        [
            sys.executable, "-m", "router", "calibrate",
            "--speculative", engines.speculative.url,
            "--baseline", engines.baseline.url,
            "--concurrency", ",".join(map(str, LEVELS)),
            "--prompt-tokens", str(PROMPT_WORDS),
            "--output-tokens", str(OUTPUT_TOKENS),
            "--requests-per-level", "8",
            "--interleave",
            "--out", str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    sys.stderr.write(done.stderr)  # the per-level lines, for the log of the run
    return Calibration(out, from_json(json.loads(out.read_text())), done.stdout, done.stderr)


RouterFactory = Callable[..., Proc]


def settled(url: str) -> bool:
    """Every backend usable and, as the router counts it, carrying no load."""
    pools = router_status(url)["pools"]
    backends = [b for pool in pools.values() for b in pool["backends"]]
    return bool(backends) and all(b["usable"] and b["load"] == 0 for b in backends)


@pytest.fixture
def start_router(engines: Engines) -> Iterator[RouterFactory]:
    """``spec-router serve`` in front of both servers, with ``SLO``; waits for ``/ready``."""
    started: list[Proc] = []

    def start(**settings: str) -> Proc:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_ROUTER_")}
        env.update(
            {
                "SPEC_ROUTER_SPECULATIVE_URLS": engines.speculative.url,
                "SPEC_ROUTER_BASELINE_URLS": engines.baseline.url,
                "SPEC_ROUTER_HEALTH_INTERVAL": "0.25",
                "SPEC_ROUTER_LOG_LEVEL": "warning",
                **{f"SPEC_ROUTER_{k}": v for k, v in SLO.items()},
            }
        )
        env.update({f"SPEC_ROUTER_{k.upper()}": v for k, v in settings.items()})
        proc = spawn(["-m", "router", "serve", "--port", "0"], env=env)
        started.append(proc)
        wait_for(lambda: router_ready(proc.url), timeout=30)
        # /ready needs one usable pool; every test here starts from both engines healthy and
        # idle as the router sees them (an engine may still be finishing a previous test's
        # requests, and the first request would then go elsewhere)
        wait_for(lambda: settled(proc.url), timeout=60)
        return proc

    yield start
    for proc in started:
        proc.stop()
