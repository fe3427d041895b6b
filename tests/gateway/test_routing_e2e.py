"""Through a real Envoy asking ``spec-router epp``: routing below and above the crossover, the
bytes of a stream, the subset hint, refusals where the proxy refuses, and every lease released
when Envoy reports the request's end (``/router/status``: in flight 0 after each)."""

from __future__ import annotations

import asyncio
import socket
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest

from router.decide import table as tables
from router.sim.model import EAGLE3
from tests.conftest import TIME_SCALE
from tests.gateway.conftest import GatewayFactory, chat, endpoint, served_by
from tests.support.bulk_upstream import BulkUpstream
from tests.support.envoy import ORIGINAL_DST, subset_from_header
from tests.support.http import metric_value, sim_held, sim_idle, wait_for
from tests.support.processes import Proc
from tests.support.raw_http import check_error_shape
from tests.support.tables import model_table

pytestmark = [pytest.mark.anyio, pytest.mark.gateway]

SPILLOVER = {"policy": "spillover", "crossover": "2", "learn": "false", "explore_share": "0"}


async def test_four_long_streams_two_on_each_pool(start_gateway: GatewayFactory) -> None:
    """Crossover 2, spillover: the first two streams go to the speculative engine, the next two
    (while those run) to the baseline; Envoy carries each to the engine the EPP named."""
    gateway = start_gateway(**SPILLOVER)
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=30))
        streams = []
        for _ in range(4):
            response = await stack.enter_async_context(
                client.stream("POST", f"{gateway.url}/v1/chat/completions", json=chat(400, True))
            )
            assert response.status_code == 200
            streams.append(response)
        pools = [r.headers["x-spec-router-pool"] for r in streams]
        assert pools == ["speculative", "speculative", "baseline", "baseline"]
        assert [served_by(r) for r in streams] == ["eagle3", "eagle3", "baseline", "baseline"]
        reasons = [r.headers["x-spec-router-reason"] for r in streams]
        assert reasons == ["below_crossover"] * 2 + ["above_crossover"] * 2
        status = gateway.status()
        assert status["in_flight"] == {"speculative": 2, "baseline": 2, "total": 4}
        bodies = await asyncio.gather(*(r.aread() for r in streams))
        assert all(body.rstrip().endswith(b"data: [DONE]") for body in bodies)
    gateway.idle()
    # one record each, every one matched to its lease
    metrics = httpx.get(f"{gateway.epp.url}/metrics").text
    assert metric_value(metrics, "spec_router_epp_access_log_records_total", lease="released") == 4
    assert metric_value(metrics, "spec_router_requests_total", pool="baseline", code="200") == 2
    # below the crossover again: the speculative engine
    again = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat(4), timeout=30)
    assert again.headers["x-spec-router-pool"] == "speculative" and served_by(again) == "eagle3"
    gateway.idle()


def test_a_stream_arrives_byte_for_byte(start_gateway: GatewayFactory) -> None:
    """What the engine wrote is what the client reads: Envoy relays it, the EPP never sees it
    (300 events, ~270 KB, unpaced)."""
    spec, base = BulkUpstream(size=900, events=300), BulkUpstream(size=900, events=300)
    with spec.running(), base.running():
        gateway = start_gateway(spec_url=spec.url, base_url=base.url, **SPILLOVER)
        with httpx.stream(
            "POST", f"{gateway.url}/v1/chat/completions", json=chat(8, True), timeout=30
        ) as response:
            assert response.status_code == 200
            assert response.headers["x-spec-router-pool"] == "speculative"
            got = b"".join(response.iter_raw())
        assert spec.posts == 1 and base.posts == 0
        assert got == spec.body and len(got) > 250_000
        gateway.idle()


def test_subset_hint_is_kept(start_gateway: GatewayFactory, sims: dict[str, Proc]) -> None:
    """The data plane's subset hint (``envoy.lb.subset_hint``, here from a header): only its
    endpoints are picked; none of ours in it -> 503 in the OpenAI shape, with Retry-After."""
    gateway = start_gateway(filters=[subset_from_header()], **SPILLOVER)
    spec, base = endpoint(sims["speculative"].url), endpoint(sims["baseline"].url)
    url = f"{gateway.url}/v1/chat/completions"
    # idle: spillover would pick the speculative engine; the hint allows only the baseline
    only_base = httpx.post(url, json=chat(4), headers={"x-test-subset": base}, timeout=30)
    assert only_base.status_code == 200 and served_by(only_base) == "baseline"
    both = httpx.post(url, json=chat(4), headers={"x-test-subset": f"{base},{spec}"}, timeout=30)
    assert both.status_code == 200 and served_by(both) == "eagle3"
    none = httpx.post(url, json=chat(4), headers={"x-test-subset": "10.9.9.9:1"}, timeout=30)
    assert none.status_code == 503 and int(none.headers["retry-after"]) >= 1
    check_error_shape(none.content)
    assert "x-spec-router-pool" not in none.headers
    gateway.idle()


def test_refusals_where_the_proxy_refuses(start_gateway: GatewayFactory) -> None:
    """Bad JSON 400, an unknown engine-admin path 404, a missing key 401, a body over the
    limit 413: the router's own answers, in the OpenAI shape, and no engine sees them."""
    gateway = start_gateway(api_keys="k1", max_body_bytes="4096", **SPILLOVER)
    url = gateway.url
    key = {"authorization": "Bearer k1"}
    bad = httpx.post(f"{url}/v1/chat/completions", content=b"{nope", headers=key)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    admin = httpx.post(f"{url}/v1/load_lora_adapter", json={}, headers=key)
    assert admin.status_code == 404
    anonymous = httpx.post(f"{url}/v1/chat/completions", json=chat(4))
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Bearer"
    big = chat(4, extra="x" * 10_000)
    too_large = httpx.post(f"{url}/v1/chat/completions", json=big, headers=key)
    assert too_large.status_code == 413
    for r in (bad, admin, anonymous, too_large):
        check_error_shape(r.content)
        assert "x-spec-router-pool" not in r.headers and "x-sim-preset" not in r.headers
    good = httpx.post(f"{url}/v1/chat/completions", json=chat(4), headers=key, timeout=30)
    assert good.status_code == 200 and good.headers["x-spec-router-pool"] == "speculative"
    gateway.idle()
    metrics = httpx.get(f"{gateway.epp.url}/metrics").text
    assert metric_value(metrics, "spec_router_requests_total", code="400") == 1
    # the refusals' records come too, with no lease to end
    wait_for(
        lambda: (
            metric_value(
                httpx.get(f"{gateway.epp.url}/metrics").text,
                "spec_router_epp_access_log_records_total",
                lease="unknown",
            )
            == 4
        )
    )


# At time scale 0.1 a lone greedy request decodes at ~1.24 ms per token on the speculative sim,
# two at ~1.50 ms, on the baseline at 2 ms: a 0.65 ms target (1.3 ms relaxed) is met by an idle
# speculative engine alone, so a second such request overflows while one decodes there.
TIGHT = {"x-slo-tpot-ms": "0.65"}
IMPOSSIBLE = {"x-slo-tpot-ms": "0.01"}


async def test_the_queue_holds_nothing_it_has_not_measured(
    start_gateway: GatewayFactory, own_sims: dict[str, Proc], tmp_path: Path
) -> None:
    """QUEUE_SIZE 1 under the gateway: the router's queue holds an overflowing request only
    while its engine is measured past the relaxed SLO (``router.forward.admission``), and the
    EPP sees no first token to measure (Envoy's record has the response headers' time, which
    vLLM and SGLang 0.5.3 send before queueing): the request goes on at once, counted, even
    after requests that missed their SLO. (A long stream holds the speculative engine
    meanwhile.)"""
    table = model_table(400, 200, time_scale=float(TIME_SCALE), tau_sampling=EAGLE3.tau_sampling)
    tables.save(table, tmp_path / "t.json")
    gateway = start_gateway(
        spec_url=own_sims["speculative"].url,
        base_url=own_sims["baseline"].url,
        table_path=str(tmp_path / "t.json"),
        learn="false",
        explore_share="0",
        ramp_seconds="0",
        queue_size="1",
        queue_timeout="1",
    )
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(
            httpx.AsyncClient(base_url=gateway.url, timeout=30)
        )
        body = chat(64, temperature=0)
        for _ in range(3):  # served past their SLO, one at a time
            r = await client.post(
                "/v1/chat/completions", json=chat(64, True, temperature=0), headers=IMPOSSIBLE
            )
            assert r.status_code == 200
            await asyncio.to_thread(gateway.idle)  # its record came: the engine is idle again
        assert gateway.status()["queue"]["sent_fine"] == 0
        held = await stack.enter_async_context(
            client.stream(
                "POST",
                "/v1/chat/completions",
                json=chat(4000, True, temperature=0),
                headers=TIGHT,
            )
        )
        assert held.headers["x-spec-router-pool"] == "speculative"
        chunks = held.aiter_raw()  # (kept: a dropped iterator would close the stream)
        await anext(chunks)
        r = await client.post("/v1/chat/completions", json=body, headers=TIGHT)
        assert r.status_code == 200
        del chunks
    queue = gateway.status()["queue"]
    assert queue == {**queue, "queued": 0, "admitted": 0, "timed_out": 0, "refused_full": 0}
    assert queue["sent_fine"] == 1 and queue["engines"] == {}
    gateway.idle()


def test_a_client_that_leaves_releases_its_lease(
    start_gateway: GatewayFactory, own_sims: dict[str, Proc]
) -> None:
    """A client gone mid-stream: Envoy resets the engine's stream, and its access-log record
    (flag DC) releases the lease; the engine stops too. (The engine holds the stream after 10
    tokens, ``hold_after``, so it is still running when the client leaves, however slow the
    host.)"""
    gateway = start_gateway(
        spec_url=own_sims["speculative"].url, base_url=own_sims["baseline"].url, **SPILLOVER
    )
    host, port = gateway.url.removeprefix("http://").split(":")
    body = (
        b'{"model":"sim","messages":[{"role":"user","content":"hi"}],'
        b'"max_tokens":4000,"stream":true}'
    )
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"x-sim-fault: hold_after=10\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        wait_for(lambda: gateway.status()["in_flight"]["speculative"] == 1)
        wait_for(lambda: sim_held(own_sims["speculative"].url) == 1)
    gateway.idle()
    wait_for(sim_idle(own_sims["speculative"].url))
    metrics = httpx.get(f"{gateway.epp.url}/metrics").text
    assert metric_value(metrics, "spec_router_client_disconnects_total", pool="speculative") == 1
    # the engine is fine, and the next request goes there
    after = httpx.post(f"{gateway.url}/v1/chat/completions", json=chat(4), timeout=30)
    assert after.status_code == 200 and served_by(after) == "eagle3"
    gateway.idle()


def test_the_llm_d_wiring_routes_by_the_header(
    start_gateway: GatewayFactory, sims: dict[str, Proc]
) -> None:
    """deploy/envoy/envoy-original-dst.yaml: the EPP's header picks the ORIGINAL_DST upstream;
    a client's own destination header is removed before the EPP (or the fallback) sees it."""
    gateway = start_gateway(config=ORIGINAL_DST, **SPILLOVER)
    spoof = {"x-gateway-destination-endpoint": endpoint(sims["baseline"].url)}
    url = f"{gateway.url}/v1/chat/completions"
    r = httpx.post(url, json=chat(4), headers=spoof, timeout=30)
    assert r.status_code == 200 and served_by(r) == "eagle3"
    assert r.headers["x-spec-router-pool"] == "speculative"
    gateway.idle()
