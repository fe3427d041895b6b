"""The sims' tests: each preset in turn (``sim``; the session's sims are tests/conftest.py's),
and helpers to read their answers and metrics."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import Proc


@pytest.fixture(params=["eagle3", "baseline"])
def sim(request: pytest.FixtureRequest) -> Proc:
    proc: Proc = request.getfixturevalue(request.param)
    return proc


def metrics(url: str) -> dict[str, float]:
    """Samples of /metrics by name, summed over label sets (a sim without DP, TP or priority
    options has one per gauge; counters split by is_streaming)."""
    text = httpx.get(url + "/metrics").text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name
            if "le" in sample.labels:
                key += "{le=" + sample.labels["le"] + "}"
            out[key] = out.get(key, 0.0) + sample.value
    return out


def engine_error(body: object) -> dict[str, object]:
    """The error object of an engine's answer: vLLM nests it, SGLang's is the body itself."""
    assert isinstance(body, dict)
    inner = body.get("error")
    if isinstance(inner, dict):
        return inner
    assert body.get("object") == "error", body
    return body


def chat_body(max_tokens: int = 8, **extra: object) -> dict[str, object]:
    body: dict[str, object] = {
        "messages": [{"role": "user", "content": "tell me a story"}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    body.update(extra)
    return body
