"""Simulated engines as real subprocesses on ephemeral loopback ports."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.processes import Proc, running, sim_args

# Fast enough for tests, slow enough that an iteration (>= 1 ms) is above timer resolution.
SCALE = "0.05"


@pytest.fixture(scope="session")
def eagle3() -> Iterator[Proc]:
    with running(sim_args("eagle3", "--time-scale", SCALE, "--seed", "1")) as proc:
        yield proc


@pytest.fixture(scope="session")
def baseline() -> Iterator[Proc]:
    with running(sim_args("baseline", "--time-scale", SCALE, "--seed", "1")) as proc:
        yield proc


@pytest.fixture(scope="session")
def vllm_eagle3() -> Iterator[Proc]:
    with running(sim_args("eagle3", "--time-scale", SCALE, "--seed", "1", "--engine", "vllm")) as p:
        yield p


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
