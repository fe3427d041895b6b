"""Reading an engine's Prometheus text: the few numbers routing cares about. Pure.

SGLang exposes ``sglang:num_running_reqs``, ``sglang:num_queue_reqs`` and (with speculative
decoding) ``sglang:spec_accept_length``; vLLM exposes ``vllm:num_requests_running``,
``vllm:num_requests_waiting`` and counters ``vllm:spec_decode_num_accepted_tokens_total`` /
``vllm:spec_decode_num_drafts_total``, from which the mean acceptance length over an interval
is 1 + accepted/drafts. SGLang 0.5.23 also counts ``sglang:generation_tokens_total`` and
``sglang:spec_verify_calls_total`` (per finished request), whose ratio over an interval is its
acceptance length. llama.cpp's ``llama-server --metrics`` exposes
``llamacpp:requests_processing`` (requests in its slots), ``llamacpp:requests_deferred``
(waiting for a slot) and, with a draft model, ``llamacpp:spec_decode_num_drafts_total`` and
``llamacpp:spec_decode_num_accepted_tokens_total``, read as vLLM's (one draft = one
verification step). Which engine it is, is detected from the names present.

A metric's series are not simply added up (``combine``; docs/engines.md, section 2):

- with priority scheduling SGLang writes the total under ``priority=""`` and a breakdown under
  ``priority="<n>"``: only the total counts (a series without the label is a total too);
- with ``--enable-metrics-for-all-schedulers`` every TP rank of one scheduler writes the same
  values, told apart by ``tp_rank`` (and ``pp_rank``, ``moe_ep_rank``): one value is taken over
  those ranks;
- what remains is one series per scheduler (``dp_rank``) or engine (vLLM's ``engine``), or per
  model: those add up. The acceptance length is averaged over them instead, weighted by each
  one's running requests, and ``0.0`` -- SGLang's value before a rank's first 40-step decode
  window, or without speculation -- means "no data yet", not "nothing accepted".

Counters are summed over every series: SGLang's tokenizer-side counters carry the request's
own priority and no rank, vLLM's one series per engine (``vllm:request_success_total`` one per
finish reason). The request and token totals (SGLang's ``num_requests_total``,
``prompt_tokens_total``, ``generation_tokens_total``; vLLM's ``request_success_total``,
``prompt_tokens_total``, ``generation_tokens_total``; llama.cpp's ``prompt_tokens_total``,
``tokens_predicted_total``) are what the fleet planner reads the traffic from.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# metric name -> (field, how its series combine)
_WANTED = {
    "sglang:num_running_reqs": ("running", "gauge"),
    "sglang:num_queue_reqs": ("queued", "gauge"),
    "sglang:spec_accept_length": ("accept", "gauge"),
    "sglang:generation_tokens_total": ("generated", "counter"),
    "sglang:spec_verify_calls_total": ("verifies", "counter"),
    "sglang:num_requests_total": ("requests", "counter"),
    "sglang:prompt_tokens_total": ("prompt", "counter"),
    "vllm:num_requests_running": ("running", "gauge"),
    "vllm:num_requests_waiting": ("queued", "gauge"),
    "vllm:spec_decode_num_accepted_tokens_total": ("accepted", "counter"),
    "vllm:spec_decode_num_drafts_total": ("drafts", "counter"),
    "vllm:request_success_total": ("requests", "counter"),
    "vllm:prompt_tokens_total": ("prompt", "counter"),
    "vllm:generation_tokens_total": ("generated", "counter"),
    "llamacpp:requests_processing": ("running", "gauge"),
    "llamacpp:requests_deferred": ("queued", "gauge"),
    "llamacpp:spec_decode_num_accepted_tokens_total": ("accepted", "counter"),
    "llamacpp:spec_decode_num_drafts_total": ("drafts", "counter"),
    "llamacpp:prompt_tokens_total": ("prompt", "counter"),
    "llamacpp:tokens_predicted_total": ("generated", "counter"),
}
# The labels that tell apart the ranks of one scheduler: their series repeat its values.
RANK_LABELS = frozenset({"tp_rank", "pp_rank", "moe_ep_rank"})

Labels = dict[str, str]
Series = list[tuple[Labels, float]]


@dataclass(frozen=True, slots=True)
class EngineSample:
    flavor: str  # "sglang", "vllm", "llamacpp" or "unknown"
    running: float
    queued: float
    accept_length: float | None  # SGLang's gauge (None: no data yet); None for vLLM, llama.cpp
    accepted_total: float | None = None  # vLLM / llama.cpp counters, for interval acceptance
    drafts_total: float | None = None
    # output tokens generated: SGLang's (for interval acceptance with ``verifies_total``, 0.5.23),
    # vLLM's and llama.cpp's counters
    generated_total: float | None = None
    verifies_total: float | None = None
    # requests finished and prompt tokens taken in (SGLang, vLLM; llama.cpp counts no
    # requests): the arrival rate and lengths every router replica reads alike (the planner)
    requests_total: float | None = None
    prompt_total: float | None = None


def _labels(text: str) -> Labels:
    """``a="x",b="y"`` (the inside of the braces) as a dict; handles escaped quotes."""
    out: Labels = {}
    i, n = 0, len(text)
    while i < n:
        eq = text.find("=", i)
        if eq < 0:
            break
        name = text[i:eq].strip().lstrip(",").strip()
        j = text.find('"', eq) + 1
        value = []
        while j < n and text[j] != '"':
            if text[j] == "\\" and j + 1 < n:
                j += 1
                value.append({"n": "\n"}.get(text[j], text[j]))
            else:
                value.append(text[j])
            j += 1
        out[name] = "".join(value)
        i = j + 1
    return out


def _scheduler_key(labels: Labels) -> frozenset[tuple[str, str]]:
    return frozenset((k, v) for k, v in labels.items() if k not in RANK_LABELS)


def per_scheduler(
    series: Iterable[tuple[Labels, float]],
) -> dict[frozenset[tuple[str, str]], float]:
    """A gauge's value per scheduler: totals only (``priority`` absent or ``""``), one value
    over the TP/PP ranks that repeat it (the largest)."""
    out: dict[frozenset[tuple[str, str]], float] = {}
    for labels, value in series:
        if labels.get("priority", "") != "":
            continue  # a per-priority breakdown of the total beside it
        key = _scheduler_key(labels)
        out[key] = max(out[key], value) if key in out else value
    return out


def combine(series: Series, kind: str, weights: Series | None = None) -> float | None:
    """One number from a metric's series (see the module docstring); None without any.

    ``kind``: ``gauge`` (schedulers add up), ``mean`` (the acceptance length: averaged over
    the schedulers that have data, weighted by their ``weights`` series when those are known),
    ``counter`` (every series adds up)."""
    if not series:
        return None
    if kind == "counter":
        return sum(value for _, value in series)
    values = per_scheduler(series)
    if kind == "gauge":
        return sum(values.values())
    known = {k: v for k, v in values.items() if v > 0}
    if not known:
        return None
    load = per_scheduler(weights or [])
    # a scheduler's weight: its running requests; 1 each when none runs anything
    w = {k: load.get(k, 0.0) for k in known}
    if not any(w.values()):
        w = dict.fromkeys(known, 1.0)
    total = sum(w.values())
    return sum(known[k] * w[k] for k in known) / total


def _series(text: str) -> dict[str, Series]:
    """The wanted metrics' samples: field -> [(labels, value)]."""
    found: dict[str, Series] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        end = brace if 0 <= brace < space or (brace >= 0 and space < 0) else space
        if end <= 0:
            continue
        wanted = _WANTED.get(line[:end])
        if wanted is None:
            continue
        if brace == end:
            close = line.rfind("}")
            labels, value_text = _labels(line[brace + 1 : close]), line[close + 1 :]
        else:
            labels, value_text = {}, line[space:]
        parts = value_text.split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        found.setdefault(line[:end], []).append((labels, value))
    return found


def parse(text: str) -> EngineSample:
    """The load and acceptance an engine's /metrics text reports."""
    by_name = _series(text)
    flavor = "unknown"
    for name in by_name:
        if _WANTED[name][1] == "gauge":
            flavor = name.split(":", 1)[0]
            break
    fields: dict[str, float | None] = {}
    for name, series in by_name.items():
        field, kind = _WANTED[name]
        if field == "accept":
            running = by_name.get("sglang:num_running_reqs")
            fields[field] = combine(series, "mean", running)
        else:
            fields[field] = combine(series, kind)
    return EngineSample(
        flavor=flavor,
        running=fields.get("running") or 0.0,
        queued=fields.get("queued") or 0.0,
        accept_length=fields.get("accept"),
        accepted_total=fields.get("accepted"),
        drafts_total=fields.get("drafts"),
        generated_total=fields.get("generated"),
        verifies_total=fields.get("verifies"),
        requests_total=fields.get("requests"),
        prompt_total=fields.get("prompt"),
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


def counted_accept_length(prev: EngineSample | None, cur: EngineSample) -> float | None:
    """The acceptance length from the engine's counters over the interval between two samples:
    vLLM's 1 + accepted / drafts, SGLang's generated tokens / verify calls (0.5.23; counted
    as requests end). None without such counters or without a step in between."""
    if prev is None:
        return None
    pairs = (
        (cur.accepted_total, prev.accepted_total, cur.drafts_total, prev.drafts_total, 1.0),
        (cur.generated_total, prev.generated_total, cur.verifies_total, prev.verifies_total, 0.0),
    )
    for top, top0, steps, steps0, plus in pairs:
        if None in (top, top0, steps, steps0):
            continue
        assert top is not None and top0 is not None and steps is not None and steps0 is not None
        if steps - steps0 > 0 and top >= top0:
            return plus + (top - top0) / (steps - steps0)
    return None
