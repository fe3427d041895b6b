"""``python -m router calibrate`` as a process against the eagle3 and baseline sims."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from router.decide.table import from_json
from router.sim.model import BASELINE, EAGLE3, crossover
from tests.support.processes import Proc, refused_port, sim_args, spawn

SCALE = "0.1"
# Requests of 48 tokens or more: a request's decode speed needs two bursts of tokens, and at this
# time scale eagle3's ~6 decode steps for 16 tokens (about 2.5 ms apart) reached a loaded client
# in one read; with 8 requests needed at each level, one such request refused the sweep.


@pytest.fixture(scope="module")
def pools() -> Iterator[dict[str, str]]:
    """Sims of our own: other tests change the session sims' settings (tau, faults)."""
    spec = spawn(sim_args("eagle3", "--time-scale", SCALE, "--seed", "1"))
    base: Proc | None = None
    try:
        base = spawn(sim_args("baseline", "--time-scale", SCALE, "--seed", "2"))
        yield {"speculative": spec.url, "baseline": base.url}
    finally:
        spec.stop()
        if base is not None:
            base.stop()


def calibrate(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "router", "calibrate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_finds_the_analytic_crossover(pools: dict[str, str], tmp_path: Path) -> None:
    # Short prompts and outputs keep it quick; the levels bracket the crossing, where the
    # curves differ by 4-9% a level, so the speculative pool's noise (about 2% here) cannot
    # move the answer by more than one.
    prompt, output = 32, 64
    out, png = tmp_path / "table.json", tmp_path / "curves.png"
    done = calibrate(
        "--speculative", pools["speculative"],
        "--baseline", pools["baseline"] + "/v1",
        "--concurrency", "5,7,9",
        "--prompt-tokens", str(prompt),
        "--output-tokens", str(output),
        "--requests-per-level", "32",
        "--time-scale", SCALE,
        "--out", str(out),
        "--plot", str(png),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = from_json(json.loads(out.read_text()))
    analytic = crossover(EAGLE3, BASELINE, prompt, output)
    assert analytic is not None
    # The table's crossover is a whole number of requests (the lowest from which the baseline
    # is as good); the model's is where the curves cross, 6.7 here, i.e. 7 requests.
    assert table.crossover is not None, table.reason
    assert abs(table.crossover - math.ceil(analytic)) <= 1, (table.crossover, analytic)
    assert table.source == "calibrated" and table.objective == "tpot"
    assert table.measured_at.endswith("Z")
    assert (table.workload.prompt_tokens, table.workload.output_tokens) == (prompt, output)
    for pool in (table.speculative, table.baseline):
        assert [p.concurrency for p in pool.points] == [5, 7, 9]
        assert all(p.samples == 32 and p.errors == 0 for p in pool.points)
        assert pool.fit is not None
    # In model time (x 0.1 undone): the model says 39.1 and 36.0 tok/s at 5; generous bounds.
    assert 30 < table.speculative.points[0].decode_tps_p50 < 48
    assert 28 < table.baseline.points[0].decode_tps_p50 < 44
    assert table.speculative.fit is not None and 2.5 < table.speculative.fit.tau < 3.1
    assert "--time-scale 0.1" in table.notes
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "[6/6] baseline    c=9" in done.stderr  # progress, plain lines off a terminal
    assert f"crossover: {table.crossover}" in done.stdout


@pytest.mark.slow
def test_a_chain_pair_gets_no_crossover_with_the_reason(tmp_path: Path) -> None:
    # EAGLE-3 as its paper measured it on SGLang (docs/regimes.md): the baseline never catches
    # up per request; here about x1.6 at 8 in the model, far outside the noise of 16 requests
    spec = spawn(sim_args("eagle3-chain", "--time-scale", SCALE, "--seed", "1"))
    try:
        base = spawn(sim_args("baseline", "--time-scale", SCALE, "--seed", "2"))
        try:
            out = tmp_path / "table.json"
            done = calibrate(
                "--speculative", spec.url,
                "--baseline", base.url,
                "--concurrency", "1,4,8",
                "--prompt-tokens", "32",
                "--output-tokens", "64",
                "--requests-per-level", "16",
                "--time-scale", SCALE,
                "--no-probes",
                "--out", str(out),
            )  # fmt: skip
        finally:
            base.stop()
    finally:
        spec.stop()
    assert done.returncode == 0, done.stderr
    raw = json.loads(out.read_text())
    # null, never "9" (one past the highest level measured, as version 1 wrote it)
    assert raw["crossover"] is None and raw["version"] == 2
    assert raw["measured_up_to"] == 8 and 1.3 < raw["margin"] < 2.0
    assert "no crossover measured up to 8" in raw["reason"]
    table = from_json(raw)
    assert table.crossover is None and table.limit == 8
    assert "crossover: none" in done.stdout and "no crossover measured up to 8" in done.stdout
    assert "More engines should speculate" in done.stdout


def test_dataset_against_both_endpoints(pools: dict[str, str], tmp_path: Path) -> None:
    dataset = tmp_path / "mix.jsonl"
    dataset.write_text(
        json.dumps({"messages": [{"role": "user", "content": "a b c"}], "temperature": 0})
        + "\n"
        + json.dumps({"prompt": "once upon a time", "max_tokens": 48, "temperature": 0})
        + "\n"
    )
    out = tmp_path / "table.json"
    done = calibrate(
        "--speculative", pools["speculative"],
        "--baseline", pools["baseline"],
        "--concurrency", "1,2",
        "--dataset", str(dataset),
        "--output-tokens", "64",
        "--requests-per-level", "8",
        "--time-scale", SCALE,
        "--interleave",
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = from_json(json.loads(out.read_text()))
    assert table.workload.dataset == "mix.jsonl" and table.workload.output_tokens == 56
    # --interleave: level by level, the pools in turn (a level measured again, when two
    # neighbours' noise made decode speed rise with concurrency, is marked and left out)
    order = [
        line.split()[:3]
        for line in done.stderr.splitlines()
        if line.startswith("[") and "(again)" not in line
    ]
    assert order == [
        ["[1/4]", "speculative", "c=1"],
        ["[2/4]", "baseline", "c=1"],
        ["[3/4]", "speculative", "c=2"],
        ["[4/4]", "baseline", "c=2"],
    ]
    assert "level by level, the two in turn" in table.notes


def test_refuses_a_sweep_with_errors(pools: dict[str, str], tmp_path: Path) -> None:
    # A baseline of its own: the fault's draws come from the sim's seeded generator, so a fresh
    # sim fails the same requests every run, whichever tests the module's sims served before.
    base = spawn(sim_args("baseline", "--time-scale", SCALE, "--seed", "2"))
    try:
        httpx.post(base.url + "/sim/config", json={"fault": "status=503,p=0.3"}).raise_for_status()
        out = tmp_path / "table.json"
        done = calibrate(
            "--speculative", pools["speculative"],
            "--baseline", base.url,
            "--concurrency", "2",
            "--prompt-tokens", "8",
            "--output-tokens", "64",
            "--requests-per-level", "8",
            "--out", str(out),
        )  # fmt: skip
    finally:
        base.stop()
    assert done.returncode == 1
    assert f"not writing {out}: baseline pool at concurrency 2: " in done.stderr
    assert "requests failed (first: HTTP 503" in done.stderr
    assert not out.exists()


def test_refuses_when_a_pool_is_down(pools: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "table.json"
    with refused_port() as port:  # (bound here: no other test's server takes it meanwhile)
        done = calibrate(
            "--speculative", f"http://127.0.0.1:{port}",
            "--baseline", pools["baseline"],
            "--concurrency", "1,4",
            "--out", str(out),
        )  # fmt: skip
    assert done.returncode == 1
    assert "speculative pool at concurrency 1: 1 of 1 requests failed (first: ConnectError" in (
        done.stderr
    )
    assert not out.exists()


def test_bad_dataset_is_a_usage_error(tmp_path: Path) -> None:
    dataset = tmp_path / "bad.jsonl"
    dataset.write_text('{"prompt": "x", "max_tokens": 4}\n{"input": 1}\n')
    done = calibrate(
        "--speculative", "http://127.0.0.1:1",
        "--baseline", "http://127.0.0.1:1",
        "--dataset", str(dataset),
        "--out", str(tmp_path / "t.json"),
    )  # fmt: skip
    assert done.returncode == 2
    assert "bad.jsonl: dataset line 2 has neither messages nor prompt" in done.stderr


@pytest.mark.parametrize(
    ("engine", "source"),
    [
        ("sglang", "sglang generation_tokens / spec_verify_calls over the sweep"),
        ("vllm", "vllm spec_decode counters over the sweep"),
    ],
)
def test_acceptance_over_the_sweep_from_the_engines_counters(
    engine: str, source: str, tmp_path: Path
) -> None:
    # Behind an API key (both engines guard /v1/*, SGLang also /server_info). The acceptance
    # is the counters' deltas over the sweep, not SGLang's lifetime avg_spec_accept_length.
    args = ["--time-scale", SCALE, "--engine", engine, "--api-key", "k", "--seed", "3"]
    spec = spawn(sim_args("eagle3", *args))
    try:
        base = spawn(sim_args("baseline", *args))
        try:
            out = tmp_path / "table.json"
            done = calibrate(
                "--speculative", spec.url,
                "--baseline", base.url,
                "--api-key", "k",
                "--concurrency", "2",
                "--prompt-tokens", "8",
                "--output-tokens", "64",
                "--requests-per-level", "8",
                "--time-scale", SCALE,
                "--out", str(out),
            )  # fmt: skip
        finally:
            base.stop()
    finally:
        spec.stop()
    assert done.returncode == 0, done.stderr
    table = from_json(json.loads(out.read_text()))
    assert table.speculative.fit is not None and 2.4 < table.speculative.fit.tau < 3.2
    assert source in table.notes


@pytest.mark.slow
def test_probes_measure_prefill_and_sampled_acceptance(
    pools: dict[str, str], tmp_path: Path
) -> None:
    """After the sweep: each pool's prefill line, and the speculative acceptance at
    temperature 1 (the eagle3 preset accepts 2.8 tokens per step greedy, 2.4 sampling)."""
    out = tmp_path / "table.json"
    done = calibrate(
        "--speculative", pools["speculative"],
        "--baseline", pools["baseline"],
        "--concurrency", "1,2",
        "--prompt-tokens", "256",
        "--output-tokens", "96",
        "--requests-per-level", "12",
        "--time-scale", SCALE,
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = from_json(json.loads(out.read_text()))
    fit = table.speculative.fit
    assert fit is not None and fit.tau_sampling is not None
    assert fit.tau_sampling / fit.tau == pytest.approx(EAGLE3.tau_sampling / EAGLE3.tau, rel=0.12)
    for pool, preset in (("speculative", EAGLE3), ("baseline", BASELINE)):
        prefill = table.pool(pool).prefill
        assert prefill is not None, pool
        # the sims' prefill: (1 + eps) x (30 ms + tokens / 2,500 per s), in model seconds
        want = preset.prefill_factor / preset.r_pre
        assert prefill.per_token == pytest.approx(want, rel=0.2), pool
        assert prefill.base < 0.1
    assert "acceptance length" in done.stderr and "prefill" in done.stderr
