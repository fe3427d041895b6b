"""``spec-router doctor`` against real sims over sockets: one test per finding, on sims started
with the settings that cause it (the sims report them as the engines do)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from router.decide import table as tables
from router.sim.model import PRESETS
from router.tools import doctor
from tests.support.processes import Proc, refused_port, sim_args, spawn
from tests.support.tables import model_table

SCALE = "0.05"
Sims = Callable[..., str]


@pytest.fixture(scope="module")
def sim() -> Iterator[Sims]:
    """``sim(preset, *flags)``: the URL of a sim started with them, shared within the module."""
    started: dict[tuple[str, ...], Proc] = {}

    def start(preset: str, *flags: str) -> str:
        key = (preset, *flags)
        if key not in started:
            started[key] = spawn(sim_args(preset, "--time-scale", SCALE, *flags))
        return started[key].url

    try:
        yield start
    finally:
        for proc in started.values():
            proc.stop()


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    """The doctor in this process (``main``), with ``--json``: its status and document."""
    status = doctor.main([*args, "--json", "--timeout", "10"])
    return status, json.loads(capsys.readouterr().out)


def codes(doc: dict[str, Any], level: str | None = None) -> list[str]:
    return [f["code"] for f in doc["findings"] if level is None or f["level"] == level]


def finding(doc: dict[str, Any], code: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [f for f in doc["findings"] if f["code"] == code]
    assert len(found) == 1, (code, doc["findings"])
    return found[0]


def test_the_seeds_settings_are_both_named(sim: Sims) -> None:
    spec = sim("eagle3", "--max-running", "48", "--cuda-graph-max-bs", "8")
    base = sim("baseline")
    done = subprocess.run(
        [sys.executable, "-m", "router", "doctor", "--speculative", spec, "--baseline", base],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr  # warnings: it works, worse than it could
    out = done.stdout
    assert "WARNING speculative-cap: " + spec + " runs at most 48 requests at once" in out
    assert "(SGLang's default for speculation)" in out and "--max-running-requests 256" in out
    assert "WARNING cuda-graphs: " + spec + " captures CUDA graphs up to 8" in out
    assert "--cuda-graph-max-bs 48" in out
    assert "sgl-project/sglang/blob/v0.5.3/python/sglang/srt/server_args.py#L1049" in out
    assert "ERROR" not in out
    assert out.rstrip().endswith("spec-router doctor: 0 errors, 3 warnings, 2 infos")


def test_a_healthy_pair_has_no_error(sim: Sims, capsys: pytest.CaptureFixture[str]) -> None:
    status, doc = run(capsys, "--speculative", sim("eagle3-chain"), "--baseline", sim("baseline"))
    assert status == 0 and doc["worst"] != "error" and not codes(doc, "error")
    spec, base = doc["engines"]
    assert (spec["speculative"], spec["running_cap"], spec["cuda_graph_max_bs"]) == (
        True,
        256,
        256,
    )
    assert (base["speculative"], base["running_cap"]) == (False, 256)
    assert spec["identity"]["sglang.random_seed"] != base["identity"]["sglang.random_seed"]
    # the chain preset was measured without overlap scheduling, as SGLang 0.5.3 ran it
    assert codes(doc, "warning") == ["overlap-off"]


def test_overlap_off_on_the_baseline(sim: Sims, capsys: pytest.CaptureFixture[str]) -> None:
    base = sim("baseline", "--disable-overlap-schedule")
    _, doc = run(capsys, "--speculative", sim("eagle3-chain"), "--baseline", base)
    off = [f for f in doc["findings"] if f["code"] == "overlap-off"]
    assert {tuple(f["urls"]) for f in off} == {(sim("eagle3-chain"),), (base,)}
    # (speculation on SGLang 0.5.23: the fix is to drop the flag)
    assert all("drop --disable-overlap-schedule" in f["fix"] for f in off)


def test_a_wide_draft_tree(sim: Sims, capsys: pytest.CaptureFixture[str]) -> None:
    _, doc = run(capsys, "--speculative", sim("eagle3-tree"), "--baseline", sim("baseline"))
    tree = finding(doc, "draft-tree")
    assert tree["level"] == "warning" and "topk 4, 22 draft tokens" in tree["message"]


def test_metrics_off(sim: Sims, capsys: pytest.CaptureFixture[str]) -> None:
    spec = sim("eagle3-chain", "--disable-metrics")
    _, doc = run(capsys, "--speculative", spec, "--baseline", sim("baseline"))
    off = finding(doc, "metrics-off")
    assert off["urls"] == [spec] and off["fix"] == "--enable-metrics"
    vllm = sim("baseline", "--engine", "vllm", "--disable-log-stats", "--model", "default")
    _, doc = run(capsys, "--speculative", sim("eagle3-chain"), "--baseline", vllm)
    assert finding(doc, "metrics-off")["fix"] == "drop --disable-log-stats"


def test_a_health_that_generates_and_no_ready(
    sim: Sims, capsys: pytest.CaptureFixture[str]
) -> None:
    old = sim("baseline", "--engine-version", "0.5.3")
    _, doc = run(capsys, "--speculative", sim("eagle3-chain"), "--baseline", old)
    found = [f for f in doc["findings"] if f["code"] == "health-generates"]
    levels = {f["urls"][0]: f["level"] for f in found}
    assert levels == {old: "warning", sim("eagle3-chain"): "info"}


def test_pools_swapped_is_an_error(sim: Sims, capsys: pytest.CaptureFixture[str]) -> None:
    status, doc = run(capsys, "--speculative", sim("baseline"), "--baseline", sim("eagle3-chain"))
    assert status == 1 and finding(doc, "pools-swapped")["level"] == "error"


def test_one_sim_under_two_names(sim: Sims, capsys: pytest.CaptureFixture[str]) -> None:
    spec = sim("eagle3-chain")
    other = spec.replace("127.0.0.1", "localhost")
    status, doc = run(capsys, "--speculative", spec, "--baseline", other)
    same = finding(doc, "same-engine")
    assert status == 1 and same["level"] == "error" and set(same["urls"]) == {spec, other}
    # two sims of one preset are two engines: nothing said
    twin = sim("eagle3-chain", "--seed", "5")
    _, doc = run(capsys, "--speculative", f"{spec},{twin}", "--baseline", sim("baseline"))
    assert "same-engine" not in codes(doc)


def test_different_models_tokenizers_and_contexts(
    sim: Sims, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = sim("eagle3-chain")
    other = sim("baseline", "--model", "qwen", "--model-path", "Qwen/Qwen3-8B")
    status, doc = run(capsys, "--speculative", spec, "--baseline", other)
    assert status == 1
    assert {"different-models", "different-model-names"} <= set(codes(doc, "error"))
    tokenizer = sim("baseline", "--tokenizer-path", "another/tokenizer")
    status, doc = run(capsys, "--speculative", spec, "--baseline", tokenizer)
    assert status == 1 and codes(doc, "error") == ["different-tokenizers"]
    short = sim("baseline", "--context-length", "8192")
    status, doc = run(capsys, "--speculative", spec, "--baseline", short)
    ctx = finding(doc, "different-context-lengths")
    assert status == 0 and ctx["level"] == "warning" and "8192 at " + short in ctx["message"]


def test_vllm_hides_its_config(sim: Sims, capsys: pytest.CaptureFixture[str]) -> None:
    spec = sim("eagle3-chain", "--engine", "vllm", "--model", "default")
    base = sim("baseline", "--engine", "vllm", "--model", "default")
    status, doc = run(capsys, "--speculative", spec, "--baseline", base)
    assert status == 0 and not codes(doc, "error")
    engines = {e["url"]: e for e in doc["engines"]}
    assert engines[spec]["speculative"] is True and engines[spec]["spec_steps"] == 3
    assert engines[base]["speculative"] is False
    assert "process_start_time_seconds" in engines[spec]["identity"]
    assert len([f for f in doc["findings"] if f["code"] == "vllm-config-hidden"]) == 2


def test_a_table_without_a_crossover(
    sim: Sims, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "chain.json"
    tables.save(model_table(32, 256, spec_preset=PRESETS["eagle3-chain"]), path)
    args = ["--speculative", sim("eagle3-chain"), "--baseline", sim("baseline")]
    _, doc = run(capsys, *args, "--table", str(path))
    advice = finding(doc, "no-crossover")
    assert advice["level"] == "info" and "up to 32" in advice["message"]
    assert "2 speculative engines rather than 1 + 1" in advice["fix"]
    path.write_text("{}")
    assert doctor.main([*args, "--table", str(path)]) == 2


def test_the_probe(sim: Sims, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--speculative", sim("eagle3-chain"), "--baseline", sim("baseline")]
    status, doc = run(capsys, *args, "--probe", "--probe-concurrency", "4")
    assert status == 0
    spec, base = doc["probes"]
    assert spec["errors"] == base["errors"] == 0
    assert spec["peak_load"] >= 2 and base["peak_load"] >= 2  # the metrics showed the load
    assert 2.0 < spec["accept_length"] < 4.0 and base["accept_length"] is None
    speed = finding(doc, "probe-speed")
    assert speed["level"] == "info" and spec["decode_tps"] > base["decode_tps"]
    assert not {"load-not-shown", "no-acceptance", "probe-errors"} & set(codes(doc))


def test_an_engine_that_does_not_answer(sim: Sims, capsys: pytest.CaptureFixture[str]) -> None:
    with refused_port() as port:  # (bound here: no other test's server takes it meanwhile)
        down = f"http://127.0.0.1:{port}"
        status, doc = run(capsys, "--speculative", down, "--baseline", sim("baseline"))
    assert status == 1 and finding(doc, "unreachable")["urls"] == [down]
