"""Which mode an engine runs in, from what it reports, and whether that fits its pool. Pure.

Each engine says it its own way (read in their source: /work/notes/engine-facts.md):
- SGLang: ``/server_info`` (``/get_server_info`` before 0.5.6) has ``speculative_algorithm``,
  ``null`` without speculation (e.g. ``"EAGLE3"`` with it);
- vLLM: the spec-decode counters (``vllm:spec_decode_num_drafts_total``...) exist only with a
  speculative config, while its load gauges exist whenever stats are on;
- llama.cpp: each of ``/slots``' entries has ``speculative``, true iff a draft context was set
  up (its ``/metrics`` spec counters are there, at 0, either way).

``engine_mode`` reads these facts into a ``ModeReading``; ``mode_mismatch`` says when a pool has
an engine of the other mode (a speculative engine in the baseline pool, or the reverse). The
poller gathers the facts; ``spec-router doctor`` and start-up pool checks can use the same two
functions on facts they read themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from router.pools import BASELINE, SPECULATIVE, Pool

Mode = Literal["speculative", "baseline"]


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """What an engine reported that tells its mode (None: not read, or not there)."""

    server_info: Mapping[str, Any] | None = None  # SGLang /server_info
    slots: Sequence[Mapping[str, Any]] | None = None  # llama.cpp /slots
    flavor: str | None = None  # from /metrics: "sglang", "vllm", "llamacpp"
    spec_counters: bool | None = None  # /metrics has spec-decode counters


@dataclass(frozen=True, slots=True)
class ModeReading:
    mode: Mode | None  # None: the engine does not say
    evidence: str  # what said so, for status and logs


def engine_mode(facts: EngineFacts) -> ModeReading:
    """The engine's mode, from the most direct of its reports."""
    info = facts.server_info
    if info is not None and "speculative_algorithm" in info:
        algorithm = info["speculative_algorithm"]
        mode: Mode = SPECULATIVE if algorithm else BASELINE
        shown = "null" if algorithm is None else str(algorithm)
        return ModeReading(mode, f"/server_info speculative_algorithm={shown}")
    if facts.slots:
        flags = [bool(slot.get("speculative")) for slot in facts.slots]
        mode = SPECULATIVE if any(flags) else BASELINE
        return ModeReading(mode, f"/slots speculative={str(any(flags)).lower()}")
    if facts.flavor == "vllm" and facts.spec_counters is not None:
        mode = SPECULATIVE if facts.spec_counters else BASELINE
        there = "present" if facts.spec_counters else "absent"
        return ModeReading(mode, f"/metrics vllm:spec_decode_* counters {there}")
    return ModeReading(None, "the engine does not report its mode")


def mode_mismatch(pool: Pool, reading: ModeReading) -> str | None:
    """Why an engine with ``reading`` does not belong in ``pool`` (None: it does, or it does
    not say)."""
    if reading.mode is None or reading.mode == pool:
        return None
    if pool == SPECULATIVE:
        return f"in the speculative pool but runs without speculative decoding ({reading.evidence})"
    return f"in the baseline pool but runs speculative decoding ({reading.evidence})"
