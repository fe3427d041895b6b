"""Which mode an engine runs in, from what each engine reports, and the pool check over it
(``router.health.mode``; the facts' shapes as in /work/notes/engine-facts.md). In process."""

from __future__ import annotations

import pytest

from router.health.mode import EngineFacts, ModeReading, engine_mode, mode_mismatch
from router.pools import BASELINE, SPECULATIVE


@pytest.mark.parametrize(
    ("facts", "mode", "evidence"),
    [
        (
            EngineFacts(server_info={"speculative_algorithm": "EAGLE3", "model_path": "m"}),
            SPECULATIVE,
            "/server_info speculative_algorithm=EAGLE3",
        ),
        (
            EngineFacts(server_info={"speculative_algorithm": None}, flavor="sglang"),
            BASELINE,
            "/server_info speculative_algorithm=null",
        ),
        (
            EngineFacts(slots=[{"id": 0, "speculative": False}, {"id": 1, "speculative": True}]),
            SPECULATIVE,
            "/slots speculative=true",
        ),
        (
            EngineFacts(slots=[{"id": 0, "speculative": False}]),
            BASELINE,
            "/slots speculative=false",
        ),
        (
            EngineFacts(flavor="vllm", spec_counters=True),
            SPECULATIVE,
            "/metrics vllm:spec_decode_* counters present",
        ),
        (
            EngineFacts(flavor="vllm", spec_counters=False),
            BASELINE,
            "/metrics vllm:spec_decode_* counters absent",
        ),
    ],
)
def test_each_engine_says_its_mode(facts: EngineFacts, mode: str, evidence: str) -> None:
    assert engine_mode(facts) == ModeReading(mode, evidence)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "facts",
    [
        EngineFacts(),
        # llama.cpp's spec counters are there at 0 either way: they do not tell
        EngineFacts(flavor="llamacpp", spec_counters=True),
        # SGLang's info without the field (not SGLang's, then)
        EngineFacts(server_info={"version": "x"}),
        EngineFacts(slots=[]),
    ],
)
def test_an_engine_that_does_not_say_is_no_mismatch(facts: EngineFacts) -> None:
    reading = engine_mode(facts)
    assert reading.mode is None
    assert mode_mismatch(SPECULATIVE, reading) is None
    assert mode_mismatch(BASELINE, reading) is None


def test_the_pool_check() -> None:
    spec = engine_mode(EngineFacts(server_info={"speculative_algorithm": "EAGLE3"}))
    base = engine_mode(EngineFacts(server_info={"speculative_algorithm": None}))
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
