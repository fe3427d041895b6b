"""What engines say about themselves, read from answers shaped as each engine's source writes
them (docs/engines.md, "Configuration and identity"): pure, no sockets."""

from __future__ import annotations

import json
from typing import Any

from router.health.info import (
    GET_SERVER_INFO,
    METRICS,
    MODELS,
    PROPS,
    READY,
    SERVER_INFO,
    SLOTS,
    VERSION,
    EngineInfo,
    Reply,
    engine_info,
    paths_for,
    same_engine,
)

URL = "http://10.0.0.1:30000"


def ok(doc: Any, headers: dict[str, str] | None = None) -> Reply:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return Reply(200, body, headers or {})


def models(owner: str, name: str = "llama", **card: Any) -> Reply:
    return ok(
        {
            "object": "list",
            "data": [{"id": name, "object": "model", "created": 1, "owned_by": owner, **card}],
        }
    )


# SGLang 0.5.3's /get_server_info (no /server_info, no /ready), trimmed: the keys are real
SGLANG_053 = {
    "model_path": "meta-llama/Llama-3.1-8B-Instruct",
    "tokenizer_path": "meta-llama/Llama-3.1-8B-Instruct",
    "served_model_name": "meta-llama/Llama-3.1-8B-Instruct",
    "context_length": None,
    "max_running_requests": 48,
    "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 5,
    "speculative_eagle_topk": 4,
    "speculative_num_draft_tokens": 8,
    "cuda_graph_max_bs": 256,
    "cuda_graph_bs": [1, 2, 3, 4, 5, 6, 7, 8, 10, 12],
    "disable_overlap_schedule": True,
    "enable_metrics": False,
    "random_seed": 734019283,
    "status": "ready",
    "max_total_num_tokens": 412000,
    "max_req_input_len": 131066,
    "internal_states": [{"attention_backend": "fa3", "avg_spec_accept_length": 3.1}],
    "version": "0.5.3",
}


def test_sglang_053_from_get_server_info() -> None:
    replies = {
        MODELS: models("sglang", "meta-llama/Llama-3.1-8B-Instruct", max_model_len=131072),
        SERVER_INFO: Reply(404, b'{"detail":"Not Found"}'),
        GET_SERVER_INFO: ok(SGLANG_053),
        METRICS: Reply(404, b'{"detail":"Not Found"}'),
        READY: Reply(404, b""),
    }
    info = engine_info(URL, replies)
    assert (info.flavor, info.version) == ("sglang", "0.5.3")
    assert info.served_model == info.model_path == "meta-llama/Llama-3.1-8B-Instruct"
    assert info.context_length == 131072  # /v1/models: server_info's context_length is None
    assert info.speculative and info.spec_algorithm == "EAGLE3"
    assert (info.spec_steps, info.spec_topk, info.spec_draft_tokens) == (5, 4, 8)
    assert (info.running_cap, info.cuda_graph_max_bs, info.overlap_disabled) == (48, 256, True)
    assert info.metrics is False  # 404: no --enable-metrics
    assert (info.has_ready, info.health_generates) == (False, True)
    assert info.identity == (("sglang.random_seed", "734019283"),)
    assert info.notes == ()


def test_sglang_0523_resolved_graph_limit_and_effective_cap() -> None:
    doc = {
        **SGLANG_053,
        "version": "0.5.23",
        "cuda_graph_max_bs_decode": None,
        "cuda_graph_config": {"decode": {"backend": "full", "max_bs": 8, "bs": [1, 2, 4, 8]}},
        "disable_overlap_schedule": False,
        "max_running_requests": None,
        "startup_time": {"tokenizer_e2e": 44.91234},
        "internal_states": [
            {"effective_max_running_requests_per_dp": 48},
            {"effective_max_running_requests_per_dp": 48},
        ],
    }
    del doc["cuda_graph_max_bs"]
    metrics = b'sglang:num_running_reqs{model_name="x"} 0.0\n'
    info = engine_info(
        URL,
        {
            MODELS: models("sglang"),
            SERVER_INFO: ok(doc),
            METRICS: ok(metrics),
            READY: Reply(200, b""),
        },
    )
    assert (info.cuda_graph_max_bs, info.cuda_graphs_disabled) == (8, False)
    assert info.running_cap == 96  # two DP ranks of 48
    assert info.overlap_disabled is False and info.metrics is True and info.has_ready is True
    assert dict(info.identity)["sglang.startup_time"] == '{"tokenizer_e2e": 44.91234}'
    disabled = {**doc, "cuda_graph_config": {"decode": {"backend": "disabled", "max_bs": 8}}}
    assert engine_info(URL, {SERVER_INFO: ok(disabled)}).cuda_graphs_disabled


def test_sglang_server_info_behind_a_key_is_a_note() -> None:
    unauthorized = Reply(401, b'{"error":"Unauthorized"}')
    info = engine_info(
        URL, {MODELS: models("sglang"), SERVER_INFO: unauthorized, GET_SERVER_INFO: unauthorized}
    )
    assert info.flavor == "sglang" and info.speculative is None and info.identity == ()
    assert info.notes == ("/server_info: HTTP 401",)


VLLM_METRICS = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:cache_config_info{block_size="16",engine="0",gpu_memory_utilization="0.9"} 1.0
vllm:num_requests_running{engine="0",model_name="llama"} 4.0
vllm:num_requests_waiting{engine="0",model_name="llama"} 0.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="llama"} 10.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="llama",position="0"} 0.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="llama",position="1"} 0.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="llama",position="2"} 0.0
process_start_time_seconds 1.7652e+09
"""


def test_vllm_from_models_and_metrics() -> None:
    replies = {
        MODELS: models("vllm", "llama", root="/models/Llama-3.1-8B", max_model_len=8192),
        METRICS: ok(VLLM_METRICS),
        VERSION: ok({"version": "0.34.0"}),
    }
    info = engine_info(URL, replies)
    assert (info.flavor, info.version, info.served_model) == ("vllm", "0.34.0", "llama")
    assert (info.model_path, info.context_length) == ("/models/Llama-3.1-8B", 8192)
    assert info.speculative is True and info.spec_steps == 3  # K: one position per draft
    assert info.metrics is True and info.running_cap is None  # max_num_seqs is not shown
    assert info.identity == (("process_start_time_seconds", "1.7652e+09"),)
    assert (info.has_ready, info.health_generates) == (False, False)
    plain = b'vllm:num_requests_running{engine="0",model_name="llama"} 0.0\n'
    assert engine_info(URL, {MODELS: models("vllm"), METRICS: ok(plain)}).speculative is False
    # --disable-log-stats: no vllm: series at all, so speculation cannot be told
    empty = engine_info(
        URL, {MODELS: models("vllm"), METRICS: ok(b"process_start_time_seconds 1.7e9\n")}
    )
    assert empty.metrics is False and empty.speculative is None


LLAMA_PROPS = {
    "default_generation_settings": {"params": {"speculative.types": "none"}, "n_ctx": 4096},
    "total_slots": 4,
    "model_alias": "tiny",
    "model_path": "/models/tiny-q4.gguf",
    "build_info": "b7000-0c1e570",
}


def test_llamacpp_from_props_slots_and_the_metrics_header() -> None:
    card = {"meta": {"vocab_type": 2, "n_vocab": 32000, "n_ctx": 16384, "n_ctx_train": 32768}}
    slots = [
        {"id": i, "n_ctx": 4096, "speculative": True, "is_processing": False} for i in range(4)
    ]
    metrics = b"llamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n"
    replies = {
        MODELS: models("llamacpp", "tiny", **card),
        PROPS: ok(LLAMA_PROPS),
        SLOTS: ok(slots),
        METRICS: ok(metrics, {"process-start-time-unix": "8812345678"}),
    }
    info = engine_info(URL, replies)
    assert (info.flavor, info.version) == ("llamacpp", "b7000-0c1e570")
    assert (info.model_path, info.tokenizer) == ("/models/tiny-q4.gguf", "2:32000")
    assert info.context_length == 16384 and info.running_cap == 4
    assert info.speculative is True and info.metrics is True
    assert info.identity == (("llamacpp.process_start", "8812345678"),)
    # without --metrics: 501, and no identity
    off = engine_info(URL, {**replies, METRICS: Reply(501, b"{}")})
    assert off.metrics is False and off.identity == ()
    plain = engine_info(URL, {**replies, SLOTS: ok([{**s, "speculative": False} for s in slots])})
    assert plain.speculative is False


def test_what_is_asked_depends_on_the_engine() -> None:
    assert paths_for("vllm") == (METRICS, VERSION)
    assert SERVER_INFO in paths_for("sglang") and PROPS in paths_for("llamacpp")
    assert set(paths_for("unknown")) >= {SERVER_INFO, PROPS, METRICS}


def test_same_engine_needs_an_identity_and_ignores_created() -> None:
    a = EngineInfo(
        "http://localhost:1",
        "sglang",
        identity=(("sglang.random_seed", "7"),),
        model_path="m",
        served_model="m",
    )
    b = EngineInfo(
        "http://127.0.0.1:1",
        "sglang",
        identity=(("sglang.random_seed", "7"),),
        model_path="m",
        served_model="m",
    )
    assert same_engine(a, b)
    other = EngineInfo(
        "http://127.0.0.1:2",
        "sglang",
        identity=(("sglang.random_seed", "8"),),
        model_path="m",
        served_model="m",
    )
    assert not same_engine(a, other)
    blind = EngineInfo("http://127.0.0.1:3", "vllm", model_path="m", served_model="m")
    assert not same_engine(blind, blind)  # no identity: nothing says so
