"""What an engine says about itself: its identity, model and configuration, as ``EngineInfo``.

Pure: ``engine_info`` reads the answers to a few GETs (``Replies``, fetched by
``router.health.introspect``) and keeps what the doctor (``spec-router doctor``), the start-up
pool checks and a joining backend's check compare. What each engine exposes, by version
(docs/engines.md, "Configuration and identity"):

- **SGLang**: ``/server_info`` (0.5.6+; ``/get_server_info`` on every version) holds the
  resolved server arguments -- ``model_path``, ``tokenizer_path``, ``served_model_name``,
  ``speculative_*``, ``max_running_requests`` (48 when speculative and not given), the CUDA-graph
  limit (``cuda_graph_max_bs`` up to 0.5.12, ``cuda_graph_config.decode.max_bs`` on 0.5.23),
  ``disable_overlap_schedule`` (resolved), ``enable_metrics``, ``random_seed`` (random per
  launch unless given) and, on 0.5.23, ``startup_time`` -- and ``version``. It needs the API key.
  ``/ready`` exists from 0.5.23 only; ``/health`` generates.
- **vLLM**: no configuration endpoint outside dev mode: ``/v1/models`` (``id`` the served name,
  ``root`` the model path, ``max_model_len``), ``/metrics`` (``process_start_time_seconds`` with
  one API server, the spec-decode counters -- present only when speculating, one
  ``position`` per draft token from start-up -- and nothing at all under
  ``--disable-log-stats``), ``/version``.
- **llama.cpp**: ``/props`` (``model_path``, ``total_slots``, ``build_info``), ``/slots``
  (``speculative`` per slot), ``/v1/models`` (``meta.n_ctx``, ``n_vocab``), ``/metrics`` only with
  ``--metrics`` (501 otherwise), whose ``Process-Start-Time-Unix`` header changes per launch.

``/v1/models`` ``created`` is the time of the call on every engine: never an identity.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

Flavor = Literal["sglang", "vllm", "llamacpp", "unknown"]

# the paths ``router.health.introspect`` GETs, in this order (which ones depends on the flavor
# /v1/models names: see ``paths_for``)
MODELS = "/v1/models"
SERVER_INFO = "/server_info"
GET_SERVER_INFO = "/get_server_info"
METRICS = "/metrics"
READY = "/ready"
PROPS = "/props"
SLOTS = "/slots"
VERSION = "/version"


class Reply(NamedTuple):
    """One GET's answer: status, body, and headers (lower-case names)."""

    status: int
    body: bytes
    headers: Mapping[str, str] = {}


# path -> its reply; None: no answer (refused, timed out)
Replies = Mapping[str, Reply | None]


def paths_for(flavor: Flavor) -> tuple[str, ...]:
    """What to GET after ``/v1/models`` once its ``owned_by`` names the engine."""
    if flavor == "sglang":
        return (SERVER_INFO, GET_SERVER_INFO, METRICS, READY)
    if flavor == "vllm":
        return (METRICS, VERSION)
    if flavor == "llamacpp":
        return (PROPS, SLOTS, METRICS)
    return (SERVER_INFO, GET_SERVER_INFO, METRICS, READY, PROPS, SLOTS, VERSION)


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """One engine as it describes itself; None wherever it does not say."""

    url: str
    flavor: Flavor = "unknown"
    version: str | None = None
    served_model: str | None = None  # the name /v1/models lists first
    model_path: str | None = None  # the weights: SGLang model_path, vLLM root, llama.cpp's
    tokenizer: str | None = None  # SGLang tokenizer_path; llama.cpp vocab type and size
    context_length: int | None = None  # max_model_len (llama.cpp: a slot's n_ctx)
    speculative: bool | None = None  # None: cannot tell
    spec_evidence: str | None = None  # what said so ("/server_info speculative_algorithm=...")
    spec_algorithm: str | None = None
    spec_steps: int | None = None  # draft depth (vLLM: its K)
    spec_topk: int | None = None  # >1: a draft tree
    spec_draft_tokens: int | None = None  # tokens verified per request and step
    running_cap: int | None = None  # most requests it runs at once, as configured
    cuda_graph_max_bs: int | None = None  # largest decode batch with a CUDA graph
    cuda_graphs_disabled: bool = False
    overlap_disabled: bool | None = None  # SGLang's resolved disable_overlap_schedule
    # /metrics: True serves load (and, speculating, acceptance); False: off or empty
    metrics: bool | None = None
    has_ready: bool | None = None  # SGLang 0.5.23's /ready (a flag check)
    health_generates: bool | None = None  # /health runs a generation (SGLang)
    # what tells this process apart from any other (same engine behind two URLs)
    identity: tuple[tuple[str, str], ...] = ()
    # what could not be read, and why ("/server_info: HTTP 401" ...)
    notes: tuple[str, ...] = field(default=())

    @property
    def label(self) -> str:
        return self.flavor + (f" {self.version}" if self.version else "")


def _json(reply: Reply | None) -> Any:
    if reply is None or reply.status != 200:
        return None
    try:
        return json.loads(reply.body)
    except ValueError:
        return None


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _why(path: str, reply: Reply | None) -> str:
    return f"{path}: " + ("no answer" if reply is None else f"HTTP {reply.status}")


def flavor_of(models: Any) -> Flavor:
    """The engine a ``/v1/models`` document names (``owned_by``)."""
    try:
        owner = str(models["data"][0].get("owned_by", ""))
    except (KeyError, IndexError, TypeError, AttributeError):
        return "unknown"
    if owner in ("sglang", "vllm", "llamacpp"):
        return owner  # type: ignore[return-value]
    return "unknown"


def _models(doc: Any) -> dict[str, Any]:
    """``/v1/models``: the served name, the path (vLLM's ``root``), context, llama.cpp's meta."""
    try:
        card = doc["data"][0]
    except (KeyError, IndexError, TypeError):
        return {}
    if not isinstance(card, Mapping):
        return {}
    out: dict[str, Any] = {"served_model": _str(card.get("id"))}
    if card.get("owned_by") == "vllm":
        out["model_path"] = _str(card.get("root"))
    context = _int(card.get("max_model_len"))
    meta = card.get("meta")
    if isinstance(meta, Mapping):  # llama.cpp
        context = context or _int(meta.get("n_ctx"))
        if meta.get("n_vocab") is not None:
            out["tokenizer"] = f"{meta.get('vocab_type', 'vocab')}:{meta.get('n_vocab')}"
    out["context_length"] = context
    return out


def _graph_limit(doc: Mapping[str, Any]) -> tuple[int | None, bool]:
    """The CUDA-graph decode limit and whether graphs are off, in each version's shape."""
    config = doc.get("cuda_graph_config")
    if isinstance(config, Mapping) and isinstance(config.get("decode"), Mapping):
        decode = config["decode"]
        return _int(decode.get("max_bs")), decode.get("backend") == "disabled"
    disabled = bool(doc.get("disable_cuda_graph"))
    return _int(doc.get("cuda_graph_max_bs")), disabled


def _server_info(doc: Mapping[str, Any]) -> dict[str, Any]:
    """SGLang's ``/server_info``: resolved arguments and the scheduler's states."""
    algorithm = _str(doc.get("speculative_algorithm"))
    graphs, disabled = _graph_limit(doc)
    cap = _int(doc.get("max_running_requests"))
    states = doc.get("internal_states")
    if isinstance(states, list):  # 0.5.10+: the scheduler's real cap, per DP rank
        caps = [_int(s.get("effective_max_running_requests_per_dp")) for s in states if
                isinstance(s, Mapping)]  # fmt: skip
        known = [c for c in caps if c is not None]
        if known:
            cap = sum(known)
    identity: list[tuple[str, str]] = []
    if doc.get("random_seed") is not None:
        identity.append(("sglang.random_seed", str(doc["random_seed"])))
    if doc.get("startup_time") is not None:
        identity.append(("sglang.startup_time", json.dumps(doc["startup_time"], sort_keys=True)))
    said = "speculative_algorithm" in doc
    return {
        "version": _str(doc.get("version")),
        "model_path": _str(doc.get("model_path")),
        "tokenizer": _str(doc.get("tokenizer_path") or doc.get("model_path")),
        "speculative": (algorithm is not None) if said else None,
        "spec_evidence": f"/server_info speculative_algorithm={algorithm or 'null'}"
        if said
        else None,
        "spec_algorithm": algorithm,
        "spec_steps": _int(doc.get("speculative_num_steps")),
        "spec_topk": _int(doc.get("speculative_eagle_topk")),
        "spec_draft_tokens": _int(doc.get("speculative_num_draft_tokens")),
        "running_cap": cap,
        "cuda_graph_max_bs": graphs,
        "cuda_graphs_disabled": disabled,
        "overlap_disabled": None
        if doc.get("disable_overlap_schedule") is None
        else bool(doc["disable_overlap_schedule"]),
        "identity": tuple(identity),
        "context_length": _int(doc.get("context_length")),
    }


def _metric_lines(text: str) -> list[tuple[str, dict[str, str], str]]:
    """(name, labels, value) of every sample line (a small parser: enough for names and
    labels; ``router.health.engines`` reads the load)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        space = line.find(" ")
        if 0 <= brace < space:
            close = line.rfind("}")
            name, inner, value = line[:brace], line[brace + 1 : close], line[close + 1 :]
            labels = {}
            for part in inner.split('",'):
                if "=" in part:
                    k, _, v = part.partition("=")
                    labels[k.strip().lstrip(",")] = v.strip().strip('"')
        elif space > 0:
            name, labels, value = line[:space], {}, line[space:]
        else:
            continue
        out.append((name, labels, value.strip().split(" ")[0]))
    return out


def _metrics(flavor: Flavor, reply: Reply | None) -> dict[str, Any]:
    """What ``/metrics`` shows: whether it serves load at all, speculation, and the
    per-process start time (vLLM's ``process_start_time_seconds``, llama.cpp's header)."""
    if reply is None:
        return {}
    out: dict[str, Any] = {}
    if reply.status != 200:
        # SGLang without --enable-metrics: 404; llama.cpp without --metrics: 501
        out["metrics"] = False if reply.status in (404, 501) else None
        return out
    lines = _metric_lines(reply.body.decode("utf-8", "replace"))
    names = {name for name, _, _ in lines}
    identity: list[tuple[str, str]] = []
    if flavor == "vllm" or any(n.startswith("vllm:") for n in names):
        # --disable-log-stats: no vllm: series at all (the load gauges are gone too)
        out["metrics"] = "vllm:num_requests_running" in names
        positions = {lb.get("position") for n, lb, _ in lines
                     if n == "vllm:spec_decode_num_accepted_tokens_per_pos_total"}  # fmt: skip
        if "vllm:spec_decode_num_drafts_total" in names:
            out["speculative"] = True
            out["spec_evidence"] = "/metrics vllm:spec_decode_* counters present"
            if positions:
                out["spec_steps"] = len(positions)
        elif out["metrics"]:
            out["speculative"] = False  # the counters exist from start-up when speculating
            out["spec_evidence"] = "/metrics vllm:spec_decode_* counters absent"
        for name, _, value in lines:
            if name == "process_start_time_seconds":
                identity.append(("process_start_time_seconds", value))
    elif flavor == "llamacpp" or any(n.startswith("llamacpp:") for n in names):
        out["metrics"] = "llamacpp:requests_processing" in names
        start = reply.headers.get("process-start-time-unix")
        if start:
            identity.append(("llamacpp.process_start", start))
    else:
        out["metrics"] = any(n.startswith("sglang:num_running_reqs") for n in names)
    if identity:
        out["identity"] = tuple(identity)
    return out


def _props(doc: Mapping[str, Any]) -> dict[str, Any]:
    """llama.cpp's ``/props``."""
    settings = doc.get("default_generation_settings")
    context = _int(settings.get("n_ctx")) if isinstance(settings, Mapping) else None
    return {
        "model_path": _str(doc.get("model_path")),
        "running_cap": _int(doc.get("total_slots")),
        "version": _str(doc.get("build_info")),
        "context_length": context,
    }


def _slots(doc: Any) -> dict[str, Any]:
    """llama.cpp's ``/slots``: ``speculative`` is true iff a draft context was set up."""
    if not isinstance(doc, list) or not doc:
        return {}
    flags = [s.get("speculative") for s in doc if isinstance(s, Mapping)]
    if not flags or any(not isinstance(f, bool) for f in flags):
        return {}
    return {
        "speculative": any(flags),
        "spec_evidence": f"/slots speculative={str(any(flags)).lower()}",
        "running_cap": len(doc),
    }


def engine_info(url: str, replies: Replies) -> EngineInfo:
    """Everything ``replies`` (path -> answer) says about the engine at ``url``."""
    models = _json(replies.get(MODELS))
    flavor = flavor_of(models)
    fields: dict[str, Any] = dict(_models(models))
    notes: list[str] = []
    if models is None:
        notes.append(_why(MODELS, replies.get(MODELS)))
    info_doc = None
    for path in (SERVER_INFO, GET_SERVER_INFO):
        if path in replies:
            info_doc = _json(replies[path])
            if isinstance(info_doc, Mapping):
                break
    if isinstance(info_doc, Mapping):
        flavor = "sglang" if flavor == "unknown" else flavor
        known = {k: v for k, v in _server_info(info_doc).items() if v is not None}
        # /v1/models has the effective context; server_info's context_length is None unless
        # given: only fill it in
        if fields.get("context_length") is not None:
            known.pop("context_length", None)
        fields.update(known)
    elif flavor == "sglang":
        notes.append(_why(SERVER_INFO, replies.get(SERVER_INFO) or replies.get(GET_SERVER_INFO)))
    props = _json(replies.get(PROPS))
    if isinstance(props, Mapping):
        flavor = "llamacpp" if flavor == "unknown" else flavor
        fields.update({k: v for k, v in _props(props).items() if v is not None and
                       fields.get(k) is None})  # fmt: skip
    fields.update(_slots(_json(replies.get(SLOTS))))
    version = _json(replies.get(VERSION))
    if isinstance(version, Mapping) and version.get("version") is not None:
        fields["version"] = str(version["version"])
    metrics = _metrics(flavor, replies.get(METRICS))
    identity = tuple(fields.pop("identity", ())) + tuple(metrics.pop("identity", ()))
    for key, value in metrics.items():
        if fields.get(key) is None or key == "metrics":
            fields[key] = value
    if flavor == "sglang":
        ready = replies.get(READY)
        if ready is not None:
            fields["has_ready"] = ready.status != 404
        # /health generates on every version (0.5.23 unless told not to by an environment
        # variable no endpoint shows)
        fields["health_generates"] = True
    elif flavor in ("vllm", "llamacpp"):
        fields["has_ready"] = False
        fields["health_generates"] = False
    return EngineInfo(url=url, flavor=flavor, identity=identity, notes=tuple(notes), **fields)


def same_engine(a: EngineInfo, b: EngineInfo) -> bool:
    """Whether two URLs reach one engine process: the same per-process identity, model and
    flavor (False when either shows none: nothing says so)."""
    return (
        bool(a.identity)
        and a.flavor == b.flavor
        and a.identity == b.identity
        and a.model_path == b.model_path
        and a.served_model == b.served_model
    )
