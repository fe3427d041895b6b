"""``spec-router replay``'s requests: each prompt starts with a nonce of the run (against real
routers and sims: test_replay_e2e.py)."""

from __future__ import annotations

from router.tools import traffic
from router.tools.replay import request_body


def test_prompts_start_with_a_per_run_nonce() -> None:
    """A second run must not find the first one's prompts in an engine's prefix cache."""
    a = traffic.Arrival(0.0, 4, 8)
    first = request_body(a, 3, "chat", "m", "n1")["messages"][0]["content"].split()
    assert first == ["n1r3", "hello", "hello", "hello"]
    assert request_body(a, 3, "chat", "m", "n2")["messages"][0]["content"].split()[0] == "n2r3"
    ids = request_body(a, 3, "completions", "m", "n1")["prompt"]
    assert ids == request_body(a, 3, "completions", "m", "n1")["prompt"]
    assert ids != request_body(a, 3, "completions", "m", "n2")["prompt"]
