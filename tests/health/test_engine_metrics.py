"""Reading engine load from Prometheus text of SGLang, vLLM and llama.cpp."""

from __future__ import annotations

import pytest

from router.health.engines import counted_accept_length, interval_accept_length, parse

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


# SGLang 0.5.23, priority scheduling on, DP 2 x TP 2 with --enable-metrics-for-all-schedulers:
# every TP rank repeats its scheduler's values; the total is under priority="", the breakdown
# beside it (real prometheus_client 0.26 multiprocess output has this shape; docs/engines.md).
L = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0"'
T = 'engine_type="unified",model_name="m"'  # the tokenizer's counters: no rank
_LINES = [
    ("num_running_reqs", "0", "", 7.0),
    ("num_running_reqs", "0", "0", 5.0),
    ("num_running_reqs", "0", "1", 2.0),
    ("num_running_reqs", "1", "", 1.0),
    ("num_running_reqs", "1", "None", 1.0),
    ("num_queue_reqs", "0", "", 3.0),
    ("num_queue_reqs", "0", "0", 3.0),
    ("num_queue_reqs", "1", "", 0.0),
    ("spec_accept_length", "0", "", 3.0),
    ("spec_accept_length", "1", "", 2.0),
]
RANKS = "".join(
    f'sglang:{name}{{dp_rank="{dp}",{L},priority="{p}",tp_rank="{tp}"}} {value}\n'
    for name, dp, p, value in _LINES
    for tp in "01"
) + (
    f'sglang:generation_tokens_total{{{T},is_streaming="true",priority="0"}} 1000.0\n'
    f'sglang:generation_tokens_total{{{T},is_streaming="false",priority="1"}} 234.0\n'
    f'sglang:spec_verify_calls_total{{{T},priority="0"}} 400.0\n'
    f'sglang:spec_verify_calls_total{{{T},priority="1"}} 33.0\n'
)


def test_totals_once_per_scheduler_summed_over_dp_ranks() -> None:
    s = parse(RANKS)
    # a sum over every series says 32 running and 9 queued
    assert (s.flavor, s.running, s.queued) == ("sglang", 8.0, 3.0)
    # acceptance: the DP ranks' values weighted by their running requests (7 and 1), not a
    # mean over duplicated TP series
    assert s.accept_length == pytest.approx((3.0 * 7 + 2.0 * 1) / 8)
    # tokenizer counters carry the request's priority and no rank: all of them add up
    assert (s.generated_total, s.verifies_total) == (1234.0, 433.0)


def test_a_rank_before_its_first_decode_window_has_no_acceptance_yet() -> None:
    # SGLang reports 0.0 until a rank's first 40-step decode window: that is no data, not
    # "nothing accepted"; a plain mean would halve the other rank's value
    text = """\
sglang:num_running_reqs{dp_rank="0",model_name="m",tp_rank="0"} 2.0
sglang:num_running_reqs{dp_rank="1",model_name="m",tp_rank="0"} 0.0
sglang:spec_accept_length{dp_rank="0",model_name="m",tp_rank="0"} 2.8
sglang:spec_accept_length{dp_rank="1",model_name="m",tp_rank="0"} 0.0
"""
    assert parse(text).accept_length == 2.8
    idle = text.replace("2.8", "0.0")
    assert parse(idle).accept_length is None
    # an idle engine (nothing running anywhere) averages its ranks' last values
    quiet = """\
sglang:num_running_reqs{dp_rank="0",model_name="m",tp_rank="0"} 0.0
sglang:num_running_reqs{dp_rank="1",model_name="m",tp_rank="0"} 0.0
sglang:spec_accept_length{dp_rank="0",model_name="m",tp_rank="0"} 2.8
sglang:spec_accept_length{dp_rank="1",model_name="m",tp_rank="0"} 2.0
"""
    assert parse(quiet).accept_length == pytest.approx(2.4)


def test_sglang_053_labels_and_escaped_values() -> None:
    text = (
        'sglang:num_running_reqs{engine_type="unified",model_name="a \\"quoted\\" name",'
        'pp_rank="0",tp_rank="0"} 4.0\n'
        'sglang:num_running_reqs{engine_type="unified",model_name="other",pp_rank="0",'
        'tp_rank="0"} 1.0\n'
    )
    assert parse(text).running == 5.0  # two models: two schedulers


def test_counted_acceptance_over_an_interval() -> None:
    first = parse(RANKS)
    later = parse(RANKS.replace("1000.0", "1280.0").replace("400.0", "500.0"))
    assert counted_accept_length(first, later) == pytest.approx(2.8)
    assert counted_accept_length(first, first) is None  # nothing finished in between
    v1, v2 = parse(VLLM), parse(VLLM.replace("100.0", "200.0").replace("150.0", "230.0"))
    assert counted_accept_length(v1, v2) == pytest.approx(1.8)
    assert counted_accept_length(None, v2) is None


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
