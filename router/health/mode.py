"""Which mode an engine runs in, from what it reports, and whether that fits its pool. Pure.

Each engine says it its own way (read in their source: docs/engines.md, section 13), and
``router.health.info`` reads it into ``EngineInfo.speculative`` with the evidence:
- SGLang: ``/server_info`` (``/get_server_info`` before 0.5.6) has ``speculative_algorithm``,
  ``null`` without speculation (e.g. ``"EAGLE3"`` with it);
- vLLM: the spec-decode counters (``vllm:spec_decode_num_drafts_total``...) exist only with a
  speculative config, while its load gauges exist whenever stats are on;
- llama.cpp: each of ``/slots``' entries has ``speculative``, true iff a draft context was set
  up (its ``/metrics`` spec counters are there, at 0, either way).

``engine_mode`` turns that into a ``ModeReading``; ``mode_mismatch`` says when a pool has an
engine of the other mode (a speculative engine in the baseline pool, or the reverse). The poller
reads each engine once per start; ``router.health.checks`` (the pool checks, ``spec-router
doctor``) reads the same ``EngineInfo``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from router.health.info import EngineInfo
from router.pools import BASELINE, SPECULATIVE, Pool

Mode = Literal["speculative", "baseline"]


@dataclass(frozen=True, slots=True)
class ModeReading:
    mode: Mode | None  # None: the engine does not say
    evidence: str  # what said so, for status and logs


def engine_mode(info: EngineInfo) -> ModeReading:
    """The engine's mode, as its description says it."""
    if info.speculative is None:
        return ModeReading(None, "the engine does not report its mode")
    mode: Mode = SPECULATIVE if info.speculative else BASELINE
    return ModeReading(mode, info.spec_evidence or "")


def mode_mismatch(pool: Pool, reading: ModeReading) -> str | None:
    """Why an engine with ``reading`` does not belong in ``pool`` (None: it does, or it does
    not say)."""
    if reading.mode is None or reading.mode == pool:
        return None
    if pool == SPECULATIVE:
        return f"in the speculative pool but runs without speculative decoding ({reading.evidence})"
    return f"in the baseline pool but runs speculative decoding ({reading.evidence})"
