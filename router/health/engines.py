"""Reading an engine's Prometheus text: the few numbers routing cares about. Pure.

SGLang exposes ``sglang:num_running_reqs``, ``sglang:num_queue_reqs`` and (with speculative
decoding) ``sglang:spec_accept_length``; vLLM exposes ``vllm:num_requests_running``,
``vllm:num_requests_waiting`` and counters ``vllm:spec_decode_num_accepted_tokens_total`` /
``vllm:spec_decode_num_drafts_total``, from which the mean acceptance length over an interval
is 1 + accepted/drafts. llama.cpp's ``llama-server --metrics`` exposes
``llamacpp:requests_processing`` (requests in its slots), ``llamacpp:requests_deferred``
(waiting for a slot) and, with a draft model, ``llamacpp:spec_decode_num_drafts_total`` and
``llamacpp:spec_decode_num_accepted_tokens_total``, read as vLLM's (one draft = one
verification step). Which engine it is, is detected from the names present.
"""

from __future__ import annotations

from dataclasses import dataclass

_WANTED = {
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "queued",
    "sglang:spec_accept_length": "accept",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "queued",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted",
    "vllm:spec_decode_num_drafts_total": "drafts",
    "llamacpp:requests_processing": "running",
    "llamacpp:requests_deferred": "queued",
    "llamacpp:spec_decode_num_accepted_tokens_total": "accepted",
    "llamacpp:spec_decode_num_drafts_total": "drafts",
}


@dataclass(frozen=True, slots=True)
class EngineSample:
    flavor: str  # "sglang", "vllm", "llamacpp" or "unknown"
    running: float
    queued: float
    accept_length: float | None  # SGLang's gauge; None for vLLM and llama.cpp (counters)
    accepted_total: float | None = None  # vLLM / llama.cpp counters, for interval acceptance
    drafts_total: float | None = None


def parse(text: str) -> EngineSample:
    """Sum each wanted metric over its label sets (several models or DP ranks add up)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    flavor = "unknown"
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        end = brace if 0 <= brace < space or (brace >= 0 and space < 0) else space
        if end <= 0:
            continue
        key = _WANTED.get(line[:end])
        if key is None:
            continue
        if flavor == "unknown":
            flavor = line.split(":", 1)[0]
        value_text = line[line.rfind("}") + 1 :] if brace >= 0 else line[space:]
        parts = value_text.split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        sums[key] = sums.get(key, 0.0) + value
        counts[key] = counts.get(key, 0) + 1
    accept = sums["accept"] / counts["accept"] if counts.get("accept") else None
    return EngineSample(
        flavor=flavor,
        running=sums.get("running", 0.0),
        queued=sums.get("queued", 0.0),
        accept_length=accept,
        accepted_total=sums.get("accepted"),
        drafts_total=sums.get("drafts"),
    )


def interval_accept_length(prev: EngineSample | None, cur: EngineSample) -> float | None:
    """Acceptance length for the interval between two samples (vLLM, llama.cpp), else the
    gauge; None when no draft was verified in between (an idle engine) or a counter went back
    (the engine restarted)."""
    if cur.accept_length is not None:
        return cur.accept_length
    if prev is None or cur.accepted_total is None or cur.drafts_total is None:
        return None
    if prev.accepted_total is None or prev.drafts_total is None:
        return None
    drafts = cur.drafts_total - prev.drafts_total
    accepted = cur.accepted_total - prev.accepted_total
    if drafts <= 0 or accepted < 0:
        return None
    return 1.0 + accepted / drafts
