"""Pools that change under a real Envoy asking a real ``spec-router epp``: engines behind DNS
names (a real DNS server on loopback whose records the test changes, sims on 127.0.0.x at one
port, as a headless Service's pods), and the admin API on the EPP.

With ``SPEC_ROUTER_DISCOVERY=dns`` the EPP resolves the names into members and names their
``ip:port``; the recommended Envoy file's engines' cluster resolves the same names (a DNS
cluster, as docs/gateway.md shows), so Envoy has every host the EPP may name. An address that
joins is picked once healthy; one that leaves gets no new pick, its streams run to their end
through Envoy, their access-log records release their leases, and it is gone; nothing is in
flight at the end. Backends added through the admin API are addresses no Envoy cluster lists:
the llm-d wiring (ORIGINAL_DST, by the EPP's header) reaches them.

A drain that times out lets go of the leases still held there: the gateway carries those
streams on to their end (their late records find no lease). A gateway that goes away
mid-stream sends no record of what it carried: its connection's access-log stream ends, and
the EPP lets go of the leases that connection asked for, on a leaving member and the others
alike, long before a drain deadline or the lease max age; a new gateway is counted as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import start_epp
from tests.members.test_discovery_e2e import (
    LONG,
    Stream,
    open_streams,
    received,
    shared_port,
    short,
    sim,
    url,
)
from tests.support.dns_server import DnsServer
from tests.support.envoy import (
    ORIGINAL_DST,
    RECOMMENDED,
    Envoy,
    configured,
    engines_by_dns,
    start_envoy,
)
from tests.support.http import (
    HOLD,
    await_for,
    metric_value,
    router_status,
    sim_held,
    sim_release,
    wait_for,
)
from tests.support.processes import Proc, free_port

pytestmark = [pytest.mark.anyio, pytest.mark.gateway]

TOKEN = "admin-s3cret"
ADMIN = {"authorization": f"Bearer {TOKEN}"}
SPEC_NAME, BASE_NAME = "eagle3.engines.test", "baseline.engines.test"
A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"
SETTINGS = {
    "health_interval": "0.1",
    "ramp_seconds": "0",
    "policy": "spillover",
    "crossover": "100",  # everything to the speculative pool: the pool that changes here
    "learn": "false",
    "explore_share": "0",
    "admin_token": TOKEN,
    "drain_timeout": "30",
}


@pytest.fixture
def dns() -> Iterator[DnsServer]:
    with DnsServer("127.0.0.1") as server:
        yield server


@pytest.fixture
def procs() -> Iterator[list[Proc | Envoy]]:
    started: list[Proc | Envoy] = []
    yield started
    for proc in reversed(started):
        proc.stop()


async def until(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    """``wait_for`` off the event loop, so that the streams' readers keep reading meanwhile."""
    return await await_for(lambda: asyncio.to_thread(check), timeout=timeout)


def backends(epp: Proc) -> dict[str, dict[str, Any]]:
    return {b["url"]: b for b in router_status(epp.url)["pools"]["speculative"]["backends"]}


def envoy_hosts(envoy: Envoy) -> set[str]:
    return {
        f"{h['address']['socket_address']['address']}:{h['address']['socket_address']['port_value']}"
        for h in envoy.cluster_hosts("engines")
    }


def idle(epp: Proc) -> bool:
    status = router_status(epp.url)
    return bool(status["in_flight"]["total"] == 0 and status["gateway"]["leases"] == 0)


async def ended(streams: list[Stream]) -> None:
    async def done() -> bool:
        return all(s.fate is not None for s in streams)

    await await_for(done, timeout=30)
    assert all(s.fate == "ended" and s.tail.rstrip().endswith(b"data: [DONE]") for s in streams)


async def test_engines_join_and_leave_by_dns_through_envoy(
    dns: DnsServer, procs: list[Proc | Envoy]
) -> None:
    port = shared_port([A, B, C])
    a, c = sim("eagle3", A, port), sim("baseline", C, port)
    procs += [a, c]
    dns.set(SPEC_NAME, [A])
    dns.set(BASE_NAME, [C])
    grpc_port = free_port()
    epp = start_epp(
        url(SPEC_NAME, port),
        url(BASE_NAME, port),
        grpc_port,
        {
            **SETTINGS,
            "discovery": "dns",
            "dns_servers": dns.address,
            "discovery_interval": "0.2",
        },
    )
    procs.append(epp)
    envoy = gateway_to(
        procs,
        engines_by_dns(
            configured(RECOMMENDED, f"127.0.0.1:{grpc_port}", []),
            [SPEC_NAME, BASE_NAME],
            port,
            dns.address,
        ),
    )
    gateway = envoy.url()
    assert router_status(epp.url)["gateway"]["endpoints"] == {
        url(A, port): f"{A}:{port}",
        url(C, port): f"{C}:{port}",
    }

    async with contextlib.AsyncExitStack() as stack:
        # every stream here holds on its sim until released below: in flight whenever the
        # test looks, however slow the host
        on_a = await open_streams(gateway, 2, stack, headers=HOLD)
        assert received(a) == 2
        await until(lambda: sim_held(a.url) == 2)
        # B's record appears before its engine listens: a member, "starting", never picked
        dns.set(SPEC_NAME, [A, B])
        joined = await until(lambda: backends(epp).get(url(B, port)))
        assert joined["state"] == "starting" and not joined["usable"]
        assert router_status(epp.url)["gateway"]["endpoints"][url(B, port)] == f"{B}:{port}"
        await until(lambda: f"{B}:{port}" in envoy_hosts(envoy))
        for _ in range(3):
            r = await asyncio.to_thread(httpx.post, f"{gateway}/v1/chat/completions", json=short())
            assert r.status_code == 200 and r.headers["x-spec-router-pool"] == "speculative"
        # its engine comes up: healthy, then picked (A is busy, B is not), through Envoy
        b = sim("eagle3", B, port)
        procs.append(b)
        await until(lambda: backends(epp)[url(B, port)]["usable"])
        on_b = await open_streams(gateway, 2, stack, headers=HOLD)
        assert received(b) == 2
        await until(lambda: sim_held(b.url) == 2)
        assert backends(epp)[url(B, port)]["in_flight"] == 2

        # A's record goes: it drains at the EPP's next resolution, and gets no new pick
        dns.set(SPEC_NAME, [B])
        await until(lambda: backends(epp)[url(A, port)]["membership"] == "draining")
        before = received(a)
        for _ in range(6):
            r = await asyncio.to_thread(httpx.post, f"{gateway}/v1/chat/completions", json=short())
            assert r.status_code == 200
        assert received(a) == before
        assert backends(epp)[url(A, port)]["in_flight"] == 2
        sim_release(a.url)
        sim_release(b.url)
        for stream in on_a:  # its streams run on through Envoy, to their end
            assert await stream.flowing()
        await ended(on_a + on_b)
    # their records released their leases; then A was removed, endpoint and all
    await until(lambda: url(A, port) not in backends(epp))
    await until(lambda: idle(epp))
    endpoints = router_status(epp.url)["gateway"]["endpoints"]
    assert endpoints == {url(B, port): f"{B}:{port}", url(C, port): f"{C}:{port}"}
    metrics = httpx.get(f"{epp.url}/metrics").text
    assert f'backend="{url(A, port)}"' not in metrics


async def test_the_admin_api_on_the_epp(procs: list[Proc | Envoy]) -> None:
    port = shared_port([A, B, C])
    a, b, c = sim("eagle3", A, port), sim("eagle3", B, port), sim("baseline", C, port)
    procs += [a, b, c]
    grpc_port = free_port()
    epp = start_epp(url(A, port), url(C, port), grpc_port, SETTINGS)
    procs.append(epp)
    envoy = gateway_to(
        procs, configured(ORIGINAL_DST, f"127.0.0.1:{grpc_port}", [f"{A}:{port}", f"{C}:{port}"])
    )
    gateway, api = envoy.url(), f"{epp.url}/router/pools"
    new = {"url": url(B, port)}
    assert httpx.post(f"{api}/speculative/backends", json=new).status_code == 401
    named = httpx.post(
        f"{api}/speculative/backends", json={"url": "http://engine.test:1"}, headers=ADMIN
    )
    assert (named.status_code, named.json()["error"]["code"]) == (400, "invalid_url")

    async with contextlib.AsyncExitStack() as stack:
        # A's streams hold on the sim until released below: in flight at its drain
        on_a = await open_streams(gateway, 2, stack, headers=HOLD)
        await until(lambda: sim_held(a.url) == 2)
        added = httpx.post(f"{api}/speculative/backends", json=new, headers=ADMIN)
        assert added.status_code == 201, added.text
        await until(lambda: backends(epp)[url(B, port)]["usable"])
        await open_streams(gateway, 2, stack, tokens=LONG // 4)
        assert received(b) == 2

        gone = httpx.delete(
            f"{api}/speculative/backends", params={"url": url(A, port)}, headers=ADMIN
        )
        assert gone.status_code == 202 and gone.json()["in_flight"] == 2
        listed = httpx.get(f"{api}/speculative/backends").json()["backends"]
        assert [(m["url"], m["membership"]) for m in listed] == [
            (url(A, port), "draining"),
            (url(B, port), "active"),
        ]
        before = received(a)
        for _ in range(4):
            r = await asyncio.to_thread(httpx.post, f"{gateway}/v1/chat/completions", json=short())
            assert r.status_code == 200
        assert received(a) == before
        sim_release(a.url)
        await ended(on_a)
    await until(lambda: url(A, port) not in backends(epp))
    await until(lambda: idle(epp))


def metric(epp: Proc, name: str, **labels: str) -> float:
    return metric_value(httpx.get(f"{epp.url}/metrics").text, name, **labels)


def in_flight(epp: Proc) -> dict[str, int]:
    """Each member's in-flight count, both pools."""
    pools = router_status(epp.url)["pools"]
    return {b["url"]: b["in_flight"] for p in pools.values() for b in p["backends"]}


def gateway_to(procs: list[Proc | Envoy], config: dict[str, Any]) -> Envoy:
    """Envoy on ``config``, stopped with the test's processes, once the EPP answers its
    health checks."""
    envoy = start_envoy(config)
    procs.append(envoy)
    wait_for(envoy.epp_healthy, timeout=15)
    return envoy


def engine_running(engine: Proc) -> int:
    n: int = httpx.get(f"{engine.url}/sim/config", timeout=5).json()["engine"]["running"]
    return n


async def test_a_drain_that_times_out_lets_go_while_envoy_carries_on(
    procs: list[Proc | Envoy],
) -> None:
    port = shared_port([A, C])
    a, c = sim("eagle3", A, port), sim("baseline", C, port)
    procs += [a, c]
    grpc_port = free_port()
    epp = start_epp(url(A, port), url(C, port), grpc_port, {**SETTINGS, "drain_timeout": "1"})
    procs.append(epp)
    envoy = gateway_to(
        procs, configured(RECOMMENDED, f"127.0.0.1:{grpc_port}", [f"{A}:{port}", f"{C}:{port}"])
    )
    api = f"{epp.url}/router/pools/speculative/backends"

    async with contextlib.AsyncExitStack() as stack:
        # streams that outlive the drain timeout: they hold on the sim until released below
        on_a = await open_streams(envoy.url(), 2, stack, headers=HOLD)
        assert received(a) == 2
        await until(lambda: sim_held(a.url) == 2)
        gone = httpx.delete(api, params={"url": url(A, port)}, headers=ADMIN)
        assert gone.status_code == 202 and gone.json()["in_flight"] == 2
        # the deadline lets go of both leases and A is removed, while its streams still run:
        # the EPP carries no bytes, so it cuts nothing; Envoy carries them on
        await until(lambda: url(A, port) not in backends(epp))
        assert idle(epp)
        assert metric(epp, "spec_router_drain_cuts_total", pool="speculative") == 2
        assert all(s.fate is None for s in on_a)
        # (read while they hold: no record of theirs can have come yet)
        unknown = metric(epp, "spec_router_epp_access_log_records_total", lease="unknown")
        sim_release(a.url)
        for stream in on_a:
            assert await stream.flowing()
        await ended(on_a)
    # their records came after all, for leases that are no longer held: counted, nothing
    # released twice
    await until(
        lambda: (
            metric(epp, "spec_router_epp_access_log_records_total", lease="unknown") == unknown + 2
        )
    )
    status = router_status(epp.url)
    assert status["in_flight"] == {"speculative": 0, "baseline": 0, "total": 0}
    assert status["gateway"]["leases"] == 0 and in_flight(epp) == {url(C, port): 0}
    r = await asyncio.to_thread(httpx.post, f"{envoy.url()}/v1/chat/completions", json=short())
    assert r.status_code == 200 and r.headers["x-spec-router-pool"] == "baseline"
    await until(lambda: idle(epp))


async def test_leases_are_let_go_when_envoy_goes_away_mid_stream(
    procs: list[Proc | Envoy],
) -> None:
    port = shared_port([A, C])
    a, c = sim("eagle3", A, port), sim("baseline", C, port)
    procs += [a, c]
    grpc_port = free_port()
    # (the drain timeout and the lease max age far beyond the test: neither is what ends them)
    epp = start_epp(url(A, port), url(C, port), grpc_port, {**SETTINGS, "crossover": "2"})
    procs.append(epp)

    def gateway() -> Envoy:
        config = configured(RECOMMENDED, f"127.0.0.1:{grpc_port}", [f"{A}:{port}", f"{C}:{port}"])
        return gateway_to(procs, config)

    envoy = gateway()
    # one request to the end first: Envoy's access-log stream to the EPP is open
    r = await asyncio.to_thread(httpx.post, f"{envoy.url()}/v1/chat/completions", json=short())
    assert r.status_code == 200
    await until(lambda: router_status(epp.url)["gateway"]["log_streams"] == 1)
    await until(lambda: idle(epp))
    released = metric(epp, "spec_router_epp_access_log_records_total", lease="released")
    on_a, on_c = received(a), received(c)

    async with contextlib.AsyncExitStack() as stack:
        # (held on the sims: still running when the gateway goes)
        streams = await open_streams(envoy.url(), 4, stack, headers=HOLD)
        assert (received(a), received(c)) == (on_a + 2, on_c + 2)
        await until(lambda: sim_held(a.url) == 2 and sim_held(c.url) == 2)
        assert in_flight(epp) == {url(A, port): 2, url(C, port): 2}
        # A leaves (a drain of 30 s), and the gateway is gone mid-stream: no access-log
        # record of the four will come
        gone = httpx.delete(
            f"{epp.url}/router/pools/speculative/backends",
            params={"url": url(A, port)},
            headers=ADMIN,
        )
        assert gone.status_code == 202 and gone.json()["in_flight"] == 2
        envoy.kill()

        async def broken() -> bool:
            return all(s.fate == "broken" for s in streams)

        await await_for(broken)
    await until(lambda: engine_running(a) == 0 and engine_running(c) == 0)
    # its connection's access-log stream ended and nothing came back on it: the EPP lets go
    # of the four (not at A's drain deadline, nor at the lease max age), and A, drained, goes
    await until(lambda: idle(epp))
    assert metric(epp, "spec_router_epp_leases_orphaned_total") == 4
    assert metric(epp, "spec_router_epp_leases_expired_total") == 0
    assert metric(epp, "spec_router_drain_cuts_total", pool="speculative") == 0
    assert metric(epp, "spec_router_epp_access_log_records_total", lease="released") == released
    await until(lambda: url(A, port) not in backends(epp))
    assert in_flight(epp) == {url(C, port): 0}

    # a new gateway: routed and counted as before
    envoy = gateway()
    async with contextlib.AsyncExitStack() as stack:
        again = await open_streams(envoy.url(), 2, stack, headers=HOLD)
        assert received(c) == on_c + 4
        await until(lambda: sim_held(c.url) == 2)
        assert in_flight(epp) == {url(C, port): 2}
        sim_release(c.url)
        await ended(again)
    await until(lambda: idle(epp))
    assert metric(epp, "spec_router_epp_access_log_records_total", lease="released") == (
        released + 2
    )
