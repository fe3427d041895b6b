"""Which mode an engine runs in, from what each engine reports, and the pool check over it
(``router.health.mode`` over ``router.health.info``'s reading of the answers, shaped as in
docs/engines.md section 13). In process."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.health.info import METRICS, MODELS, SERVER_INFO, SLOTS, Reply, engine_info
from router.health.mode import ModeReading, engine_mode, mode_mismatch
from router.pools import BASELINE, SPECULATIVE


def ok(doc: Any) -> Reply:
    return Reply(200, doc if isinstance(doc, bytes) else json.dumps(doc).encode())


def read(**replies: Reply) -> ModeReading:
    paths = {"models": MODELS, "server_info": SERVER_INFO, "slots": SLOTS, "metrics": METRICS}
    return engine_mode(engine_info("http://e", {paths[k]: v for k, v in replies.items()}))


VLLM_LOAD = b'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
VLLM_SPEC = VLLM_LOAD + b'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 0.0\n'
LLAMA_SPEC = b"llamacpp:requests_processing 0\nllamacpp:spec_decode_num_drafts_total 0\n"


@pytest.mark.parametrize(
    ("replies", "mode", "evidence"),
    [
        (
            {"server_info": ok({"speculative_algorithm": "EAGLE3", "model_path": "m"})},
            SPECULATIVE,
            "/server_info speculative_algorithm=EAGLE3",
        ),
        (
            {"server_info": ok({"speculative_algorithm": None})},
            BASELINE,
            "/server_info speculative_algorithm=null",
        ),
        (
            {"slots": ok([{"id": 0, "speculative": False}, {"id": 1, "speculative": True}])},
            SPECULATIVE,
            "/slots speculative=true",
        ),
        ({"slots": ok([{"id": 0, "speculative": False}])}, BASELINE, "/slots speculative=false"),
        (
            {"metrics": ok(VLLM_SPEC)},
            SPECULATIVE,
            "/metrics vllm:spec_decode_* counters present",
        ),
        ({"metrics": ok(VLLM_LOAD)}, BASELINE, "/metrics vllm:spec_decode_* counters absent"),
    ],
)
def test_each_engine_says_its_mode(replies: dict[str, Reply], mode: str, evidence: str) -> None:
    assert read(**replies) == ModeReading(mode, evidence)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "replies",
    [
        {},
        # llama.cpp's spec counters are there at 0 either way: they do not tell
        {"models": ok({"data": [{"id": "m", "owned_by": "llamacpp"}]}), "metrics": ok(LLAMA_SPEC)},
        # SGLang's info without the field (not SGLang's, then)
        {"server_info": ok({"version": "x"})},
        {"slots": ok([])},
    ],
)
def test_an_engine_that_does_not_say_is_no_mismatch(replies: dict[str, Reply]) -> None:
    reading = read(**replies)
    assert reading.mode is None
    assert mode_mismatch(SPECULATIVE, reading) is None
    assert mode_mismatch(BASELINE, reading) is None


def test_the_pool_check() -> None:
    spec = read(server_info=ok({"speculative_algorithm": "EAGLE3"}))
    base = read(server_info=ok({"speculative_algorithm": None}))
    assert mode_mismatch(SPECULATIVE, spec) is None
    assert mode_mismatch(BASELINE, base) is None
    wrong = mode_mismatch(BASELINE, spec)
    assert wrong == (
        "in the baseline pool but runs speculative decoding "
        "(/server_info speculative_algorithm=EAGLE3)"
    )
    assert mode_mismatch(SPECULATIVE, base) == (
        "in the speculative pool but runs without speculative decoding "
        "(/server_info speculative_algorithm=null)"
    )
