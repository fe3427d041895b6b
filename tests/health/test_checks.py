"""The doctor's and the pool checks' rules over plain ``EngineInfo`` values: one test per
finding, each also showing what does not trigger it."""

from __future__ import annotations

from dataclasses import replace

from router.decide.table import Table
from router.health.checks import (
    Described,
    Finding,
    Probe,
    config_findings,
    pool_findings,
    probe_findings,
    table_findings,
    worst,
)
from router.health.info import EngineInfo, Flavor
from router.pools import BASELINE, SPECULATIVE
from router.sim.model import PRESETS
from tests.support.tables import model_table

S, B = "http://127.0.0.1:30001", "http://127.0.0.1:30002"

SPEC = EngineInfo(
    S,
    "sglang",
    "0.5.23",
    served_model="llama",
    model_path="meta-llama/Llama-3.1-8B",
    tokenizer="meta-llama/Llama-3.1-8B",
    context_length=131072,
    speculative=True,
    spec_algorithm="EAGLE3",
    spec_steps=3,
    spec_topk=1,
    spec_draft_tokens=4,
    running_cap=256,
    cuda_graph_max_bs=256,
    overlap_disabled=False,
    metrics=True,
    has_ready=True,
    health_generates=True,
    identity=(("sglang.random_seed", "1"),),
)
BASE = replace(
    SPEC,
    url=B,
    speculative=False,
    spec_algorithm=None,
    spec_steps=None,
    spec_topk=None,
    spec_draft_tokens=None,
    identity=(("sglang.random_seed", "2"),),
)


def pair(spec: EngineInfo = SPEC, base: EngineInfo = BASE) -> list[Described]:
    return [Described(SPECULATIVE, spec), Described(BASELINE, base)]


def codes(findings: list[Finding], level: str | None = None) -> list[str]:
    return [f.code for f in findings if level is None or f.level == level]


def everything(members: list[Described]) -> list[Finding]:
    return pool_findings(members) + config_findings(members)


def test_a_healthy_pair_has_nothing_above_info() -> None:
    found = everything(pair())
    assert worst(found) == "info", found
    assert codes(found) == ["health-generates", "health-generates"]  # /ready is there


def test_the_seed_settings_name_the_cap_and_the_graphs() -> None:
    seed = replace(SPEC, running_cap=48, cuda_graph_max_bs=8)
    found = config_findings(pair(seed))
    cap = next(f for f in found if f.code == "speculative-cap")
    assert cap.level == "warning" and "48" in cap.message and "SGLang's default" in cap.message
    assert "--max-running-requests 256" in cap.fix and "sglang" in cap.source
    graphs = next(f for f in found if f.code == "cuda-graphs")
    assert (
        graphs.level == "warning" and "up to 8" in graphs.message and "up to 48" in graphs.message
    )
    assert "--cuda-graph-max-bs 48" in graphs.fix
    assert worst(found) == "warning"


def test_graphs_off_and_a_cap_at_the_baselines_are_told_apart() -> None:
    found = config_findings(pair(replace(SPEC, cuda_graphs_disabled=True)))
    assert "cuda-graphs" in codes(found) and "speculative-cap" not in codes(found)


def test_overlap_off_for_speculation_says_the_fix_for_the_version() -> None:
    def fix(version: str) -> str:
        off = replace(SPEC, overlap_disabled=True, version=version)
        (finding,) = [f for f in config_findings(pair(off)) if f.code == "overlap-off"]
        assert finding.level == "warning"
        return finding.fix + " @ " + finding.source

    assert "whatever is given" in fix("0.5.3") and "v0.5.3/" in fix("0.5.3")
    assert "SGLANG_ENABLE_SPEC_V2=1" in fix("0.5.9") and "v0.5.10/" in fix("0.5.9")
    assert "topk > 1" in fix("0.5.12")
    assert "drop --disable-overlap-schedule" in fix("0.5.23+sim.0.1.0")
    baseline_off = config_findings(pair(base=replace(BASE, overlap_disabled=True)))
    assert codes(baseline_off, "warning") == ["overlap-off"]


def test_a_wide_draft_tree() -> None:
    tree = replace(SPEC, spec_topk=4, spec_draft_tokens=22)
    (finding,) = [f for f in config_findings(pair(tree)) if f.code == "draft-tree"]
    assert finding.level == "warning" and "topk 4" in finding.message and "22" in finding.message
    assert "draft-tree" not in codes(config_findings(pair()))


def test_metrics_off_names_each_engines_flag() -> None:
    flags: list[tuple[Flavor, str]] = [
        ("sglang", "--enable-metrics"),
        ("vllm", "--disable-log-stats"),
        ("llamacpp", "--metrics"),
    ]
    for flavor, flag in flags:
        off = replace(BASE, flavor=flavor, metrics=False)
        (finding,) = [f for f in config_findings(pair(base=off)) if f.code == "metrics-off"]
        assert finding.level == "warning" and flag in finding.fix


def test_a_health_that_generates_without_ready_is_a_warning() -> None:
    old = replace(SPEC, has_ready=False, version="0.5.3")
    found = [f for f in config_findings(pair(old)) if f.code == "health-generates"]
    (finding,) = [f for f in found if f.urls == (S,)]
    assert finding.level == "warning" and "/ready" in finding.fix
    vllm = replace(BASE, flavor="vllm", health_generates=False, has_ready=False)
    assert "health-generates" not in codes(config_findings([Described(BASELINE, vllm)]))


def test_pools_swapped_is_an_error_one_misplaced_engine_a_warning() -> None:
    swapped = pool_findings(pair(replace(SPEC, speculative=False), replace(BASE, speculative=True)))
    assert codes(swapped) == ["pools-swapped"] and worst(swapped) == "error"
    silent = pool_findings(pair(replace(SPEC, speculative=False)))
    assert codes(silent, "warning") == ["speculative-pool-not-speculating"]
    loud = pool_findings(pair(base=replace(BASE, speculative=True)))
    assert codes(loud, "warning") == ["baseline-pool-speculating"]
    unknown = pool_findings(pair(replace(SPEC, speculative=None)))
    assert codes(unknown) == []
    # an engine that does not say: no pool finding, but the doctor says it could not tell
    told = config_findings(pair(replace(SPEC, speculative=None)))
    (said,) = [f for f in told if f.code == "speculation-unknown"]
    assert said.level == "info" and said.urls == (S,) and "does not say" in said.message
    assert "speculation-unknown" not in codes(config_findings(pair()))


def test_one_engine_under_two_names() -> None:
    twin = replace(SPEC, url="http://localhost:30001")
    across = pool_findings(pair(SPEC, replace(twin, speculative=False)))
    assert "same-engine" in codes(across, "error")
    within = pool_findings(
        [Described(SPECULATIVE, SPEC), Described(SPECULATIVE, twin), Described(BASELINE, BASE)]
    )
    (finding,) = [f for f in within if f.code == "same-engine"]
    assert finding.level == "warning" and finding.urls == (S, "http://localhost:30001")
    assert "sglang.random_seed" in finding.message


def test_different_models_tokenizers_and_context_lengths() -> None:
    other = replace(BASE, model_path="/models/Qwen3-8B", served_model="qwen")
    found = pool_findings(pair(base=other))
    assert codes(found, "error") == ["different-models", "different-model-names"]
    # the same weights under another directory and another name, mapped by the router
    moved = replace(BASE, model_path="/data/Llama-3.1-8B", served_model="l8")
    assert codes(pool_findings(pair(base=moved), mapped=True)) == []
    assert codes(pool_findings(pair(base=moved))) == ["different-model-names"]
    tok = pool_findings(pair(base=replace(BASE, tokenizer="other/tokenizer")))
    assert codes(tok, "error") == ["different-tokenizers"]
    ctx = pool_findings(pair(base=replace(BASE, context_length=8192)))
    (finding,) = ctx
    assert (finding.code, finding.level) == ("different-context-lengths", "warning")
    assert "131072 at " + S in finding.message and "8192 at " + B in finding.message


def test_vllm_hides_its_config_and_an_unread_endpoint_is_told() -> None:
    vllm = replace(
        BASE,
        flavor="vllm",
        running_cap=None,
        cuda_graph_max_bs=None,
        health_generates=False,
        has_ready=False,
        notes=("/server_info: HTTP 401",),
    )
    found = config_findings(pair(base=vllm))
    assert {"vllm-config-hidden", "unread"} <= set(codes(found, "info"))


def test_the_table_without_a_crossover_advises_and_a_stale_one_warns() -> None:
    chain = model_table(32, 256, spec_preset=PRESETS["eagle3-chain"])
    (finding,) = table_findings(chain, pair())
    assert (finding.code, finding.level) == ("no-crossover", "info")
    assert "up to 32" in finding.message and "2 speculative engines rather than 1 + 1" in (
        finding.fix
    )
    seed: Table = model_table(32, 256, crossover=7)
    stale = replace(seed, speculative=replace(seed.speculative, cap=48))
    assert codes(table_findings(stale, pair())) == ["table-stale"]
    past = table_findings(replace(seed, crossover=64), pair(replace(SPEC, running_cap=48)))
    assert codes(past) == ["crossover-past-cap"]


def test_the_probe_findings() -> None:
    members = pair()
    quiet = Probe(8, 0.0, None, 30.0, 0.01)
    found = probe_findings([(members[0], quiet), (members[1], Probe(8, 8.0, None, 20.0, 1.2))])
    assert {"load-not-shown", "no-acceptance"} <= set(codes(found, "warning"))
    speed = next(f for f in found if f.code == "probe-speed")
    assert speed.level == "info" and "x1.50" in speed.message
    assert "health-took" in codes(found, "info")
    slower = probe_findings(
        [
            (members[0], Probe(8, 8.0, 2.5, 10.0, 0.01)),
            (members[1], Probe(8, 8.0, None, 20.0, 0.01, errors=2)),
        ]
    )
    assert set(codes(slower, "warning")) == {"probe-speed", "probe-errors"}
