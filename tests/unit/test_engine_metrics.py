"""Reading engine load from Prometheus text of SGLang and vLLM."""

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
