"""Property-based fuzzing of everything a client controls, against the real router.

The router runs under uvicorn (httptools, the default) on loopback in front of two sims; bodies
go over HTTP, requests no client library would send over raw sockets. After every example: no
5xx from the router itself (an engine's own answer, which carries ``x-spec-router-pool``, may be
anything), its errors in the OpenAI shape, nothing in flight, no upstream connection busy, and
the router still answers. Checklist cases 6, 8, 10 and 14 (see tests/README.md).

The examples are derandomized and the database off, so ``make test`` runs the same ones every
time, in well under a minute; ``SPEC_ROUTER_FUZZ_PROFILE=long`` (``make bench``) runs many
more, freshly random. Anything found stays here as an ``@example``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from tests.conftest import router_env
from tests.support.hostile import BODIES, raw_request
from tests.support.http import router_ready, wait_for
from tests.support.processes import Proc, sim_args, spawn
from tests.support.raw_http import check_answer, check_clean, exchange

PROFILE = os.environ.get("SPEC_ROUTER_FUZZ_PROFILE", "ci")
LONG = PROFILE == "long"
SCALE = int(os.environ.get("SPEC_ROUTER_FUZZ_SCALE", "20")) if LONG else 1

FUZZ = settings(
    derandomize=not LONG,
    database=None,
    deadline=None,
    print_blob=LONG,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)

CONTENT_TYPES = st.sampled_from(
    [None, "application/json", "text/plain", "application/x-ndjson", "multipart/form-data"]
)
PATHS = st.sampled_from(
    ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/whatever"]
)


@pytest.fixture(scope="module")
def router() -> Iterator[Proc]:
    """A router before two sims that answer fast and short (a 64-token context), with a short
    request deadline so that requests whose framing promises more than they send end soon."""
    fast = ("--time-scale", "0.01", "--context-length", "64", "--default-max-tokens", "4")
    procs = [spawn(sim_args("eagle3", *fast))]
    try:
        procs.append(spawn(sim_args("baseline", *fast)))
        env = router_env(procs[0].url, procs[1].url, request_timeout="0.5", max_body_bytes="262144")
        proc = spawn(["-m", "router", "serve", "--port", "0"], env=env)
        procs.append(proc)
        wait_for(lambda: router_ready(proc.url))
        yield proc
        assert proc.popen.poll() is None, "the router died"
        chat = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        assert httpx.post(f"{proc.url}/v1/chat/completions", json=chat).status_code == 200
    finally:
        for p in reversed(procs):
            p.stop()


def still_serves(url: str) -> None:
    check_clean(url)
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200


@settings(FUZZ, max_examples=150 * SCALE)
@given(body=BODIES, path=PATHS, content_type=CONTENT_TYPES, stream_header=st.booleans())
@example(  # the case: 100,000 nested arrays was a 500
    body=b"[" * 100_000 + b"]" * 100_000,
    path="/v1/chat/completions",
    content_type="application/json",
    stream_header=False,
)
@example(  # a lone surrogate in a body the router re-encodes was a 500
    body=b'{"model":"sim","stream":true,"stream_options":1,"messages":"\\ud800"}',
    path="/v1/chat/completions",
    content_type=None,
    stream_header=False,
)
@example(  # a temperature beyond float was a 500
    body=b'{"model":"sim","temperature":1' + b"0" * 400 + b',"messages":[]}',
    path="/v1/chat/completions",
    content_type="application/json",
    stream_header=False,
)
@example(  # a body that came in one read with its head was counted as head: a 431
    body=b'{"model":"sim","prompt":"' + b"a" * 70_000 + b'"}',
    path="/v1/completions",
    content_type="application/json",
    stream_header=False,
)
def test_fuzzed_bodies(
    router: Proc, body: bytes, path: str, content_type: str | None, stream_header: bool
) -> None:
    """Checklist cases 6 and 8: any body gets an answer, never a router 5xx."""
    headers = {"content-type": content_type} if content_type else {}
    if stream_header:
        headers["accept"] = "text/event-stream"
    response = httpx.post(f"{router.url}{path}", content=body, headers=headers, timeout=10)
    routed = "x-spec-router-pool" in response.headers
    event(f"{'engine' if routed else 'router'} {response.status_code}")
    check_answer(response.status_code, routed, response.content)
    assert response.status_code != 431  # (the head is small, whatever the body)
    still_serves(router.url)


@settings(FUZZ, max_examples=250 * SCALE)
@given(request=raw_request())
@example(request=b"GET /health HTTP/1.1\r\nhost: x\r\nx-a: b\x00c\r\n\r\n")
@example(request=b"GET /health HTTP/1.1\r\nhost: x\r\n" + b"x-a: b\r\n" * 200 + b"\r\n")
def test_fuzzed_raw_requests(router: Proc, request: bytes) -> None:
    """Checklist cases 10 and 14, and request framing: whatever the bytes, the router answers
    in the OpenAI shape (or closes), never with a 5xx of its own, and never lets a path reach an
    engine's internal endpoints."""
    response = exchange(router.url, request)
    event("closed" if response is None else f"{response.status}")
    if response is not None:
        routed = b"x-spec-router-pool" in response.headers
        head = request.split(b"\r\n", 1)[0]
        if not head.startswith(b"HEAD ") and response.status not in (204, 304):
            check_answer(response.status, routed, response.body)
        elif not routed:
            assert response.status < 500, response
        # an engine's internal endpoint never answers through the router
        assert not response.body.startswith((b'{"preset"', b'{"model_path"')), response.body[:200]
    still_serves(router.url)
