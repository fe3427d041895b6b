"""Reading engine load from Prometheus text of SGLang, vLLM and llama.cpp."""

from __future__ import annotations

from router.health.engines import interval_accept_length, parse

SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",engine_type="unified",tp_rank="0"} 5.0
sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0"} 2.0
sglang:spec_accept_length{model_name="m",engine_type="unified",tp_rank="0"} 2.75
sglang:num_running_reqs_offline_batch{model_name="m"} 7.0
"""

VLLM = """\
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 150.0
"""

# What llama-server --metrics (llama.cpp 0c1e570, from llama-cpp-python 0.3.36) answered with a
# draft model loaded, 3 requests in its slots and 2 waiting for one; abridged.
LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 21
llamacpp:tokens_predicted_total 24
# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 4553
llamacpp:spec_decode_num_accepted_tokens_total 3295
# HELP llamacpp:spec_decode_num_drafts_total Speculative: Total speculative decoding steps
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 1157
llamacpp:predicted_tokens_seconds 84.0294
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 3
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
llamacpp:n_busy_slots_per_decode 1
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 995
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 888
"""

# A baseline llama-server (no draft model) still exports the counters, at 0.
LLAMACPP_BASELINE = """\
llamacpp:spec_decode_num_accepted_tokens_total 0
llamacpp:spec_decode_num_drafts_total 0
llamacpp:requests_processing 16
llamacpp:requests_deferred 0
"""


def test_sglang() -> None:
    s = parse(SGLANG)
    assert (s.flavor, s.running, s.queued, s.accept_length) == ("sglang", 5.0, 2.0, 2.75)


def test_vllm_sums_engines_and_derives_interval_acceptance() -> None:
    first = parse(VLLM)
    assert (first.flavor, first.running, first.queued) == ("vllm", 7.0, 1.0)
    assert interval_accept_length(None, first) is None
    later = parse(VLLM.replace("100.0", "200.0").replace("150.0", "230.0"))
    assert interval_accept_length(first, later) == 1.8


def test_unknown_engine() -> None:
    assert parse("up 1\n").flavor == "unknown"


def test_llamacpp_load_and_interval_acceptance() -> None:
    first = parse(LLAMACPP)
    assert (first.flavor, first.running, first.queued) == ("llamacpp", 3.0, 2.0)
    assert (first.accepted_total, first.drafts_total) == (3295.0, 1157.0)
    # no gauge: the acceptance is over an interval, from two scrapes
    assert first.accept_length is None
    assert interval_accept_length(None, first) is None
    later = parse(LLAMACPP.replace(" 3295\n", " 3595\n").replace(" 1157\n", " 1257\n"))
    # 100 verification steps accepted 300 draft tokens: 1 + 3 tokens per step
    assert interval_accept_length(first, later) == 4.0
    # the per-position counters are not the totals
    assert later.accepted_total == 3595.0


def test_llamacpp_idle_or_restarted_gives_no_acceptance() -> None:
    first = parse(LLAMACPP)
    assert interval_accept_length(first, first) is None  # no step in between: idle
    restarted = parse(LLAMACPP.replace(" 3295\n", " 30\n").replace(" 1157\n", " 1167\n"))
    assert interval_accept_length(first, restarted) is None  # a counter went back


def test_llamacpp_baseline_reports_load_and_no_acceptance() -> None:
    first = parse(LLAMACPP_BASELINE)
    assert (first.flavor, first.running, first.queued) == ("llamacpp", 16.0, 0.0)
    assert interval_accept_length(first, parse(LLAMACPP_BASELINE)) is None
