"""An engine with a full queue refuses a stream (issue 12 item 6): SGLang 0.5.23 with 200, an
error event (code 503) and ``[DONE]``; SGLang 0.5.3 with 200 and a closed connection; vLLM 0.34
with a real 503. Before anything reached the client each is a refusal: retried elsewhere and
counted as such, and when nothing else can take it the client gets a real 503.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from tests.conftest import TIME_SCALE, RouterFactory
from tests.support.http import metric_value, router_status, wait_for
from tests.support.processes import Proc, running, sim_args

VERSIONS = {
    "sglang-0.5.23": (["--engine", "sglang"], "http_503"),
    "sglang-0.5.3": (["--engine", "sglang", "--engine-version", "0.5.3"], "reset"),
    "vllm": (["--engine", "vllm", "--model", "sim"], "http_503"),
}
BODY = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def hold(url: str) -> socket.socket:
    """A long stream straight to the engine, left running (its answer never read)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({**BODY, "max_tokens": 100_000}).encode()
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    return sock


def live(url: str) -> tuple[int, int]:
    engine = httpx.get(f"{url}/sim/config").json()["engine"]
    return int(engine["running"]), int(engine["queued"])


def fill(url: str, stack: ExitStack) -> None:
    """One request running, one queued: the queue (--max-queued 1) is full. One after the
    other, as a request that finds one waiting is refused."""
    stack.enter_context(hold(url))
    wait_for(lambda: live(url) == (1, 0))
    stack.enter_context(hold(url))
    wait_for(lambda: live(url) == (1, 1))


@pytest.fixture(params=sorted(VERSIONS))
def full(request: pytest.FixtureRequest) -> Iterator[tuple[dict[str, Proc], str, str]]:
    """(the sims, the retries' kind label, the version): the speculative sim is full."""
    engine, kind = VERSIONS[request.param]
    args = ["--time-scale", TIME_SCALE, "--max-running", "1", "--max-queued", "1", *engine]
    with (
        running(sim_args("eagle3", *args)) as spec,
        running(sim_args("baseline", *args)) as base,
        ExitStack() as stack,
    ):
        fill(spec.url, stack)
        yield {"speculative": spec, "baseline": base}, kind, request.param


def test_a_refused_stream_is_retried_or_a_503(
    start_router: RouterFactory, full: tuple[dict[str, Proc], str, str]
) -> None:
    sims, kind, version = full
    router = start_router(sims["speculative"].url, sims["baseline"].url, policy="spillover")
    url = f"{router.url}/v1/chat/completions"
    r = httpx.post(url, json={**BODY, "max_tokens": 5})
    assert r.status_code == 200
    assert (r.headers["x-spec-router-pool"], r.headers["x-spec-router-reason"]) == (
        "baseline",
        "failover",
    )
    assert b'"error"' not in r.content and r.content.endswith(b"data: [DONE]\n\n")
    text = httpx.get(f"{router.url}/metrics").text
    assert metric_value(text, "spec_router_retries_total", pool="speculative", kind=kind) == 1

    # now both are full: nothing else can take it
    with ExitStack() as stack:
        fill(sims["baseline"].url, stack)
        r = httpx.post(url, json={**BODY, "max_tokens": 5})
        assert r.status_code == 503
        if version == "vllm":
            assert r.json()["error"]["code"] == 503  # vLLM's own 503 passes through
        else:  # the router's, not a 200 with an error event inside
            assert r.json()["error"]["code"] == "no_backend_available"
            assert "retry-after" in r.headers
        text = httpx.get(f"{router.url}/metrics").text
        assert metric_value(text, "spec_router_requests_total", code="503") == 1
        assert router_status(router.url)["in_flight"]["total"] == 0
