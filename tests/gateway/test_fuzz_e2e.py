"""Generated bodies through a real Envoy and ``spec-router epp`` (hypothesis, as
tests/forward/test_fuzz_e2e.py does for the proxy): every body gets an answer; none is a 5xx
of the EPP's own or of a failed ext_proc stream (Envoy answers 500 then); the EPP's refusals
are in the OpenAI shape; after every example nothing is in flight and no lease is held."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from tests.gateway.conftest import Gateway, endpoint, start_epp
from tests.support.envoy import RECOMMENDED, configured, start_envoy
from tests.support.hostile import BODIES
from tests.support.http import wait_for
from tests.support.processes import free_port, sim_args, spawn
from tests.support.raw_http import check_answer

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=150,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
PATHS = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
CONTENT_TYPES = st.sampled_from([None, "application/json", "text/plain"])

pytestmark = pytest.mark.gateway


@pytest.fixture(scope="module")
def gateway() -> Iterator[Gateway]:
    """Fast, short sims (a 64-token context), an EPP with a 256 KiB body limit, an Envoy."""
    fast = ("--time-scale", "0.01", "--context-length", "64", "--default-max-tokens", "4")
    spec = spawn(sim_args("eagle3", *fast))
    base = spawn(sim_args("baseline", *fast))
    grpc_port = free_port()
    settings_ = {"max_body_bytes": "262144", "policy": "spillover", "crossover": "2"}
    epp = start_epp(spec.url, base.url, grpc_port, settings_)
    envoy = start_envoy(
        configured(RECOMMENDED, f"127.0.0.1:{grpc_port}", [endpoint(spec.url), endpoint(base.url)])
    )
    rig = Gateway(spec.url, base.url, grpc_port, settings_, 0.0, epp, envoy)
    try:
        wait_for(envoy.epp_healthy, timeout=15)
        yield rig
        assert epp.popen.poll() is None, "the EPP died"
    finally:
        rig.stop()
        spec.stop()
        base.stop()


@FUZZ
@given(body=BODIES, path=PATHS, content_type=CONTENT_TYPES)
@example(body=b"[" * 100_000 + b"]" * 100_000, path="/v1/chat/completions", content_type=None)
@example(
    body=b'{"model":"sim","prompt":"' + b"a" * 200_000 + b'"}',  # four chunks back to Envoy
    path="/v1/completions",
    content_type="application/json",
)
def test_fuzzed_bodies_through_the_gateway(
    gateway: Gateway, body: bytes, path: str, content_type: str | None
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    response = httpx.post(f"{gateway.url}{path}", content=body, headers=headers, timeout=10)
    routed = "x-spec-router-pool" in response.headers
    event(f"{'engine' if routed else 'EPP'} {response.status_code}")
    check_answer(response.status_code, routed, response.content)
    gateway.idle()
