"""An operator's mistakes at start-up fail loudly (issue 34): real ``spec-router serve`` and
``uvicorn router.app:app`` processes, their stderr and exit status.

Each refusal is one line on stderr naming the setting and the fix, and exit status 2, before
anything listens. The backends are ports nothing listens on: a refusal never gets that far, and
a router that starts does not need them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from router.tools.replay_report import FORMAT
from router.uvicorn_guard import refusal
from tests.conftest import router_env
from tests.support.processes import free_port, spawn

SERVE = [sys.executable, "-m", "router", "serve", "--port", "0"]
UVICORN = [sys.executable, "-m", "uvicorn", "router.app:app", "--port", "0"]


def env(**settings: str) -> dict[str, str]:
    return router_env(
        f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}", **settings
    )


def refused(command: list[str], environ: dict[str, str]) -> str:
    """Run ``command``; assert it exits 2 with one line on stderr, before listening; the line."""
    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "running on" not in done.stdout.lower() + done.stderr.lower()
    return lines[0]


@pytest.mark.parametrize("command", [SERVE, UVICORN], ids=["serve", "uvicorn"])
@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("SPEC_ROUTER_SPECULATIVE_URL", "SPEC_ROUTER_SPECULATIVE_URLS"),
        ("SPEC_ROUTER_CROSOVER", "SPEC_ROUTER_CROSSOVER"),
    ],
)
def test_a_misspelt_variable_stops_start_up(command: list[str], typo: str, meant: str) -> None:
    environ = env()
    environ[typo] = "4"
    line = refused(command, environ)
    assert f"unknown setting {typo} in the environment: did you mean {meant}?" in line


def test_an_engine_url_ending_in_v1_stops_start_up() -> None:
    port = free_port()
    line = refused(SERVE, env(speculative_urls=f"http://127.0.0.1:{port}/v1"))
    assert f"SPEC_ROUTER_SPECULATIVE_URLS='http://127.0.0.1:{port}/v1'" in line
    assert f"drop the /v1 from http://127.0.0.1:{port}/v1 (use http://127.0.0.1:{port})" in line


def test_a_table_path_that_does_not_exist_stops_start_up(tmp_path: Path) -> None:
    path = tmp_path / "table.json"
    line = refused(SERVE, env(table_path=str(path)))
    assert f"SPEC_ROUTER_TABLE_PATH: {path} does not exist" in line
    assert "SPEC_ROUTER_TABLE_FRESH=true" in line
    assert not path.exists()


def test_a_fresh_start_writes_no_default_table_over_the_path(tmp_path: Path) -> None:
    path = tmp_path / "table.json"
    router = spawn(SERVE[1:], env(table_path=str(path), table_fresh="true", log_level="info"))
    try:
        status = httpx.get(f"{router.url}/router/status", timeout=10).json()
        assert status["crossover_source"] == "default"
    finally:
        router.stop()  # a graceful stop: the table is written on the way out, when there is one
    assert "application shutdown complete" in "\n".join(router.output).lower()
    assert not path.exists()


def test_a_replays_results_given_as_the_table_is_named(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"format": FORMAT, "meta": {}, "summary": {}, "results": []}))
    line = refused(SERVE, env(table_path=str(path)))
    assert "this looks like a replay's results file (spec-router replay --out run.json)" in line
    assert "not a crossover table" in line and "spec-router calibrate --out FILE" in line


def test_a_size_as_the_docs_write_it_and_whitespace_separated_urls_start(tmp_path: Path) -> None:
    spec = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    router = spawn(SERVE[1:], env(speculative_urls=" ".join(spec), max_body_bytes="1 KiB"))
    try:
        status = httpx.get(f"{router.url}/router/status", timeout=10).json()
        assert [b["url"] for b in status["pools"]["speculative"]["backends"]] == spec
        big = httpx.post(f"{router.url}/v1/completions", content=b"x" * 1025, timeout=10)
        assert big.status_code == 413
    finally:
        router.stop()


def test_a_size_the_docs_do_not_write_says_what_to_write() -> None:
    line = refused(SERVE, env(max_body_bytes="32M"))
    assert "SPEC_ROUTER_MAX_BODY_BYTES='32M': '32M' is ambiguous: write 32MiB" in line


@pytest.mark.parametrize("workers", ["--workers 2", "WEB_CONCURRENCY=2"])
def test_uvicorn_with_workers_is_refused_once_before_it_runs(workers: str) -> None:
    environ = env()
    command = list(UVICORN)
    if workers.startswith("--"):
        command += workers.split()
    else:
        environ["WEB_CONCURRENCY"] = "2"
    line = refused(command, environ)
    assert line == refusal(2)
