"""Engine settings under SGLang's flag names: how ``spec-router sim`` resolves them, what
``/server_info`` reports, and that the sims run at the speed the model gives them."""

from __future__ import annotations

import pytest

from router.sim.cli import build_parser, main, preset_from_args
from router.sim.model import Preset


def resolved(*argv: str) -> Preset:
    return preset_from_args(build_parser().parse_args(["--preset", *argv]))


def test_flags_resolve_as_sglang_resolves_them() -> None:
    # --cuda-graph-max-bs when not given: 256 below TP 4, else 512; 0.5.23 caps the default at
    # the running cap (SGLang's 48 for speculation), 0.5.3 does not
    assert resolved("eagle3").cuda_graph_max_bs == 48
    assert resolved("eagle3", "--engine-version", "0.5.3").cuda_graph_max_bs == 256
    assert resolved("baseline", "--tp-size", "4").cuda_graph_max_bs == 256  # capped at 256 running
    assert resolved("baseline", "--tp-size", "4", "--max-running", "600").cuda_graph_max_bs == 512
    assert resolved("eagle3", "--cuda-graph-max-bs", "8").cuda_graph_max_bs == 8
    assert resolved("eagle3", "--cuda-graph-max-bs-decode", "8").cuda_graph_max_bs == 8
    assert resolved("eagle3", "--engine", "vllm").cuda_graph_max_bs is None  # not SGLang's
    # SGLang's names for the running cap and the draft depth, the old ones still work
    assert resolved("eagle3", "--max-running-requests", "256").max_running == 256
    assert resolved("eagle3", "--max-running", "64").max_running == 64
    assert resolved("eagle3", "--speculative-num-steps", "5").spec_k == 5
    tree = resolved("eagle3-tree", "--speculative-eagle-topk", "8")
    assert (tree.eagle_topk, tree.draft_tokens) == (8, 22)
    assert resolved("baseline", "--disable-overlap-schedule").disable_overlap_schedule
    assert not resolved("baseline").disable_overlap_schedule


def test_bad_settings_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["--preset", "baseline", "--engine", "vllm", "--disable-metrics"],
        ["--preset", "eagle3", "--speculative-num-draft-tokens", "2"],
        ["--preset", "eagle3", "--cuda-graph-max-bs", "0"],
        ["--preset", "eagle3", "--enable-metrics", "--disable-metrics"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2, argv
    err = capsys.readouterr().err
    assert "vLLM always serves /metrics" in err and "num_draft_tokens" in err
