"""Pools that change while traffic flows, end to end: a real DNS server on loopback whose
records the test changes (``tests.support.dns_server``), sims bound to 127.0.0.x addresses
on one port (a headless Service's pods), the router as a process reading them
(``SPEC_ROUTER_DISCOVERY=dns``), and the same through the admin API and under ``--workers 2``.

What each shows: an address that joins is ``starting`` and takes no traffic until healthy,
then takes its share; one that leaves gets no new request after the resolution that dropped
it, its streams run to their end, and it disappears from /router/status and /metrics; at the
end nothing is in flight. A failed resolution and an empty answer do not empty a pool at
once; a name that never resolves is a clear line at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import TIME_SCALE, router_env
from tests.support.dns_server import DnsServer
from tests.support.http import (
    HOLD,
    await_for,
    every_worker_ready,
    metric_value,
    router_ready,
    router_status,
    sim_held,
    sim_release,
    wait_for,
)
from tests.support.processes import Proc, sim_on, spawn

pytestmark = pytest.mark.anyio

TOKEN = "admin-s3cret"
ADMIN = {"authorization": f"Bearer {TOKEN}"}
SPEC_NAME, BASE_NAME = "eagle3.engines.test", "baseline.engines.test"
A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"
# a stream of this many tokens runs for a few seconds on a sim at TIME_SCALE
LONG = 2500


def short(n: int = 8) -> dict[str, Any]:
    return {
        "model": "sim",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": n,
        "stream": False,
    }


def shared_port(hosts: list[str]) -> int:
    """A port free on every one of ``hosts`` (the pods of a Service listen on one port)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind((hosts[0], 0))
            port = int(first.getsockname()[1])
            try:
                for host in hosts[1:]:
                    with socket.socket() as other:
                        other.bind((host, port))
            except OSError:
                continue
        return port
    raise AssertionError("no port free on every address")


def sim(preset: str, host: str, port: int) -> Proc:
    return spawn(sim_on(preset, port, "--time-scale", TIME_SCALE, "--host", host))


def url(host: str, port: int) -> str:
    return f"http://{host}:{port}"


def received(proc: Proc) -> int:
    """Requests the sim has received (its /sim/config)."""
    n: int = httpx.get(f"{proc.url}/sim/config", timeout=5).json()["received"]
    return n


def backends(router: Proc, pool: str = "speculative") -> dict[str, dict[str, Any]]:
    pools = router_status(router.url)["pools"]
    return {b["url"]: b for b in pools[pool]["backends"]}


def errors_of(router: Proc, backend: str) -> float:
    text = httpx.get(f"{router.url}/metrics", timeout=5).text
    return metric_value(text, "spec_router_upstream_errors_total", backend=backend)


class Stream:
    """One stream on its own connection, read to its end by a task of its own."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.chunks = 0
        self.fate: str | None = None  # "ended" (a clean end) or "broken"
        self.tail = b""
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            async for chunk in self.response.aiter_raw():
                self.chunks += 1
                self.tail = (self.tail + chunk)[-400:]
            self.fate = "ended"
        except httpx.TransportError:
            self.fate = "broken"

    async def flowing(self) -> bool:
        seen = self.chunks
        return bool(await await_for(lambda: _more(self, seen)))


async def _more(stream: Stream, seen: int) -> bool:
    return stream.chunks > seen or stream.fate is not None


async def open_streams(
    base: str,
    n: int,
    stack: contextlib.AsyncExitStack,
    tokens: int = LONG,
    headers: dict[str, str] | None = None,
) -> list[Stream]:
    streams = []
    body = {**short(tokens), "stream": True}
    for _ in range(n):
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=base, timeout=60))
        response = await stack.enter_async_context(
            client.stream("POST", "/v1/chat/completions", json=body, headers=headers)
        )
        assert response.status_code == 200
        stream = Stream(response)
        stack.callback(stream.reader.cancel)
        streams.append(stream)
    return streams


@pytest.fixture
def dns() -> Iterator[DnsServer]:
    with DnsServer("127.0.0.1") as server:
        yield server


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in reversed(started):
        proc.stop()


HEALTH_INTERVAL = 0.1


def start_router(procs: list[Proc], spec: str, base: str, *serve: str, **settings: str) -> Proc:
    defaults = {
        "health_interval": str(HEALTH_INTERVAL),
        "ramp_seconds": "0",
        "policy": "spillover",
        "crossover": "100",  # everything to the speculative pool: the pool that changes here
        "admin_token": TOKEN,
        "drain_timeout": "30",
    }
    env = router_env(spec, base, **{**defaults, **settings})
    proc = spawn(["-m", "router", "serve", "--port", "0", *serve], env=env)
    procs.append(proc)
    return proc


def dns_router(procs: list[Proc], dns: DnsServer, port: int, *serve: str, **settings: str) -> Proc:
    return start_router(
        procs,
        url(SPEC_NAME, port),
        url(BASE_NAME, port),
        *serve,
        discovery="dns",
        dns_servers=dns.address,
        discovery_interval="0.2",
        **settings,
    )


async def test_addresses_join_and_leave_while_traffic_flows(
    dns: DnsServer, procs: list[Proc]
) -> None:
    port = shared_port([A, B, C])
    a, c = sim("eagle3", A, port), sim("baseline", C, port)
    procs += [a, c]
    dns.set(SPEC_NAME, [A])
    dns.set(BASE_NAME, [C])
    router = dns_router(procs, dns, port)
    wait_for(lambda: router_ready(router.url, every_pool=True))
    first = backends(router)
    assert list(first) == [url(A, port)]
    assert (first[url(A, port)]["source"], first[url(A, port)]["name"]) == ("dns", SPEC_NAME)
    (name,) = [
        n for n in router_status(router.url)["membership"]["names"] if n["pool"] == "speculative"
    ]
    assert (name["state"], name["addresses"]) == ("resolved", [A])

    async with contextlib.AsyncExitStack() as stack:
        # every stream here holds on its sim until released below: in flight whenever the
        # test looks, however slow the host
        on_a = await open_streams(router.url, 2, stack, headers=HOLD)
        wait_for(lambda: sim_held(a.url) == 2)
        # B's record appears before its engine listens: it joins as "starting" and takes
        # nothing (no request tried there, none failed)
        dns.set(SPEC_NAME, [A, B])
        joined = wait_for(lambda: backends(router).get(url(B, port)))
        assert joined is not None
        assert joined["state"] == "starting" and not joined["usable"]
        for _ in range(4):
            assert httpx.post(f"{router.url}/v1/chat/completions", json=short()).status_code == 200
        assert errors_of(router, url(B, port)) == 0
        assert backends(router)[url(B, port)]["in_flight"] == 0
        # its engine comes up: healthy, and new streams go there (A is busy, B is not)
        b = sim("eagle3", B, port)
        procs.append(b)
        wait_for(lambda: backends(router)[url(B, port)]["usable"])
        on_b = await open_streams(router.url, 2, stack, headers=HOLD)
        wait_for(lambda: sim_held(a.url) + sim_held(b.url) == 4)
        assert received(b) >= 1
        assert backends(router)[url(B, port)]["in_flight"] >= 1

        # A's record goes: at the next resolution it drains
        dns.set(SPEC_NAME, [B])
        wait_for(lambda: backends(router)[url(A, port)]["membership"] == "draining")
        before = received(a)
        for _ in range(6):
            r = httpx.post(f"{router.url}/v1/chat/completions", json=short())
            assert r.status_code == 200
        assert received(a) == before  # no new request after the resolution that dropped it
        assert backends(router)[url(A, port)]["in_flight"] == 2
        sim_release(a.url)
        sim_release(b.url)
        for stream in on_a:  # its streams run on, to their end
            assert await stream.flowing()

        async def ended() -> bool:
            return all(s.fate == "ended" for s in on_a + on_b)

        await await_for(ended, timeout=30)
        assert all(s.tail.rstrip().endswith(b"data: [DONE]") for s in on_a)
    wait_for(lambda: url(A, port) not in backends(router))
    text = httpx.get(f"{router.url}/metrics", timeout=5).text
    assert f'backend="{url(A, port)}"' not in text
    assert f'backend="{url(B, port)}"' in text
    status = router_status(router.url)
    assert status["in_flight"]["total"] == 0
    assert status["membership"]["generation"] > 0


async def test_the_admin_api_adds_and_drains_backends(procs: list[Proc]) -> None:
    port = shared_port([A, B, C])
    a, b, c = sim("eagle3", A, port), sim("eagle3", B, port), sim("baseline", C, port)
    procs += [a, b, c]
    router = start_router(procs, url(A, port), url(C, port))
    wait_for(lambda: router_ready(router.url, every_pool=True))
    api = f"{router.url}/router/pools"
    assert httpx.post(f"{api}/speculative/backends", json={"url": url(B, port)}).status_code == 401
    async with contextlib.AsyncExitStack() as stack:
        # A's two streams hold on the sim until released below: in flight whenever the test
        # looks (a fixed-length stream could end before the drain on a slow host)
        on_a = await open_streams(router.url, 2, stack, headers=HOLD)
        wait_for(lambda: sim_held(a.url) == 2)
        r = httpx.post(f"{api}/speculative/backends", json={"url": url(B, port)}, headers=ADMIN)
        assert r.status_code == 201, r.text
        assert r.json() == {
            "pool": "speculative",
            "url": url(B, port),
            "source": "admin",
            "name": None,
            "membership": "active",
            "in_flight": 0,
            "drain_deadline_in_s": None,
        }
        # the rules: one pool at a time, once
        again = httpx.post(f"{api}/speculative/backends", json={"url": url(B, port)}, headers=ADMIN)
        assert (again.status_code, again.json()["error"]["code"]) == (409, "backend_exists")
        other = httpx.post(f"{api}/baseline/backends", json={"url": url(B, port)}, headers=ADMIN)
        assert (other.status_code, other.json()["error"]["code"]) == (409, "backend_in_other_pool")
        wait_for(lambda: backends(router)[url(B, port)]["usable"])
        await open_streams(router.url, 2, stack)
        assert received(b) >= 1

        # (a health history of its own, to tell a fresh one from)
        wait_for(lambda: backends(router)[url(A, port)]["checks"] >= 3)
        gone = httpx.delete(
            f"{api}/speculative/backends", params={"url": url(A, port)}, headers=ADMIN
        )
        assert gone.status_code == 202, gone.text
        assert gone.json()["membership"] == "draining"
        assert gone.json()["in_flight"] == 2
        assert 0 < gone.json()["drain_deadline_in_s"] <= 30
        listed = httpx.get(f"{api}/speculative/backends").json()["backends"]
        assert [(m["url"], m["membership"]) for m in listed] == [
            (url(A, port), "draining"),
            (url(B, port), "active"),
        ]
        before = received(a)
        for _ in range(6):
            assert httpx.post(f"{router.url}/v1/chat/completions", json=short()).status_code == 200
        assert received(a) == before
        assert backends(router)[url(A, port)]["in_flight"] == 2  # held: they run on
        sim_release(a.url)
        for stream in on_a:
            assert await stream.flowing()

        async def ended() -> bool:
            return all(s.fate == "ended" for s in on_a)

        await await_for(ended, timeout=30)
        assert all(s.tail.rstrip().endswith(b"data: [DONE]") for s in on_a)
        unknown = httpx.delete(
            f"{api}/baseline/backends", params={"url": url(A, port)}, headers=ADMIN
        )
        assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "backend_not_found")
    wait_for(lambda: url(A, port) not in backends(router))
    # once gone, the address may come back (to either pool), and it starts fresh
    asked = time.monotonic()
    back = httpx.post(f"{api}/speculative/backends", json={"url": url(A, port)}, headers=ADMIN)
    assert back.status_code == 201
    fresh = backends(router)[url(A, port)]  # (it joined before the POST answered)
    since = time.monotonic() - asked
    # a new member: its time as a member counted from the POST (the router rounds to the ms)
    # and a new health state, with no more checks than its probes since (one at once, then
    # one per interval -20% at the least: router.health.poller.probe_delay), where a state
    # carried over would show the old one's >= 3 when the host answers in time. Bounds from
    # the test's own clock, not a race against the host's speed (fresh < old raced it: old
    # was read at 3 checks, 0.3 s in)
    assert fresh["member_for_s"] <= since + 0.0005
    assert fresh["checks"] <= 1 + since / (0.8 * HEALTH_INTERVAL)
    assert fresh["source"] == "admin" and fresh["in_flight"] == 0
    wait_for(lambda: router_status(router.url)["in_flight"]["total"] == 0)


def name_state(router: Proc, pool: str = "speculative") -> dict[str, Any]:
    names = router_status(router.url)["membership"]["names"]
    found: dict[str, Any] = next(n for n in names if n["pool"] == pool)
    return found


def pool_of_answer(router: Proc) -> str:
    r = httpx.post(f"{router.url}/v1/chat/completions", json=short())
    assert r.status_code == 200, r.text
    return r.headers["x-spec-router-pool"]


def test_failures_and_empty_answers_do_not_empty_a_pool_at_once(
    dns: DnsServer, procs: list[Proc]
) -> None:
    port = shared_port([A, C])
    procs += [sim("eagle3", A, port), sim("baseline", C, port)]
    dns.set(SPEC_NAME, [A])
    dns.set(BASE_NAME, [C])
    router = dns_router(procs, dns, port, discovery_grace="1.5")
    wait_for(lambda: router_ready(router.url, every_pool=True))
    assert pool_of_answer(router) == "speculative"

    dns.mode = "fail"  # SERVFAIL: the last good set stays, for as long as it lasts
    failing = wait_for(lambda: (s := name_state(router))["state"] == "failing" and s)
    assert failing["addresses"] == [A] and "SERVFAIL" in failing["error"]
    text = httpx.get(f"{router.url}/metrics", timeout=5).text
    assert metric_value(text, "spec_router_discovery_failing", dns_name=SPEC_NAME) == 1
    assert metric_value(text, "spec_router_discovery_resolutions_total", result="failed") >= 1
    rounds = failing["resolutions"]
    wait_for(lambda: name_state(router)["resolutions"] >= rounds + 10, timeout=20)
    assert backends(router)[url(A, port)]["usable"]
    assert pool_of_answer(router) == "speculative"
    said = [line for line in router.output if "cannot resolve" in line and SPEC_NAME in line]
    assert len(said) == 1, said  # said once, not every round

    dns.mode = "answer"
    dns.delete(SPEC_NAME)  # NXDOMAIN: kept for the grace period, then gone
    emptying = wait_for(lambda: (s := name_state(router))["state"] == "emptying" and s)
    assert emptying["addresses"] == [A] and emptying["empty_answer"] == "NXDOMAIN"
    assert 0 < emptying["grace_left_s"] <= 1.5
    assert pool_of_answer(router) == "speculative"
    wait_for(lambda: url(A, port) not in backends(router), timeout=10)
    assert name_state(router)["state"] == "empty"
    assert pool_of_answer(router) == "baseline"  # the pool is empty: the other one serves
    assert any("answered NXDOMAIN: keeping its 1 address(es)" in line for line in router.output)
    assert any("the pool loses it" in line for line in router.output)
    text = httpx.get(f"{router.url}/metrics", timeout=5).text
    assert metric_value(text, "spec_router_backends", pool="speculative") == 0
    assert metric_value(text, "spec_router_discovery_addresses", dns_name=SPEC_NAME) == 0


def test_a_name_that_never_resolves_is_a_clear_line_at_start_up(
    dns: DnsServer, procs: list[Proc]
) -> None:
    port = shared_port([A, C])
    procs += [sim("eagle3", A, port), sim("baseline", C, port)]
    dns.set(BASE_NAME, [C])
    router = dns_router(procs, dns, port)  # the speculative name is not in the zone
    wait_for(lambda: router_ready(router.url))  # it starts, and serves with the other pool
    (line,) = [line for line in router.output if SPEC_NAME in line]
    assert "answers NXDOMAIN: no backend from it until it resolves" in line
    assert backends(router) == {}
    assert name_state(router)["state"] == "empty"
    assert pool_of_answer(router) == "baseline"
    dns.set(SPEC_NAME, [A])  # its pods come up: the pool fills
    wait_for(lambda: url(A, port) in backends(router) and backends(router)[url(A, port)]["usable"])
    assert pool_of_answer(router) == "speculative"

    # no DNS server answers at all: both pools start empty, /ready says so, the log says why
    silent = DnsServer("127.0.0.1")
    silent.mode = "drop"
    try:
        blind = dns_router(procs, silent, port)
        said = [line for line in blind.output if "cannot resolve" in line]
        assert len(said) == 2 and all("no answer from" in line for line in said), said
        r = httpx.get(f"{blind.url}/ready", timeout=5)
        assert r.status_code == 503
        assert r.json()["pools"] == {"speculative": False, "baseline": False}
        assert name_state(blind)["state"] == "failing"
    finally:
        silent.close()


def each_worker(router: Proc, check: Any, workers: int = 2) -> bool:
    """``check(status)`` holds in what every worker answers (a new connection each time, so
    the kernel hands them to either worker)."""
    seen: dict[int, bool] = {}
    for _ in range(40):
        status = router_status(router.url)
        seen[status["workers"]["this"]] = bool(check(status))
        if len(seen) == workers:
            break
    return len(seen) == workers and all(seen.values())


def listed(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["url"]: b for b in status["pools"]["speculative"]["backends"]}


@pytest.mark.slow
async def test_under_two_workers_every_worker_routes_over_the_same_set(
    dns: DnsServer, procs: list[Proc]
) -> None:
    port = shared_port([A, B, C])
    a, b, c = sim("eagle3", A, port), sim("eagle3", B, port), sim("baseline", C, port)
    procs += [a, b, c]
    dns.set(SPEC_NAME, [A])
    dns.set(BASE_NAME, [C])
    router = dns_router(procs, dns, port, "--workers", "2")
    wait_for(every_worker_ready(router.url))
    assert wait_for(lambda: each_worker(router, lambda s: list(listed(s)) == [url(A, port)]))
    async with contextlib.AsyncExitStack() as stack:
        # A's streams hold on the sim until released below: in flight while it drains,
        # however slow the host
        on_a = await open_streams(router.url, 4, stack, headers=HOLD)
        wait_for(lambda: sim_held(a.url) == 4)
        dns.set(SPEC_NAME, [A, B])  # the leader resolves it; both workers take it up
        assert wait_for(
            lambda: each_worker(router, lambda s: listed(s).get(url(B, port), {}).get("usable"))
        )
        on_b = await open_streams(router.url, 4, stack)
        assert received(b) >= 1

        dns.set(SPEC_NAME, [B])
        assert wait_for(
            lambda: each_worker(
                router, lambda s: listed(s)[url(A, port)]["membership"] == "draining"
            )
        )
        before = received(a)
        for _ in range(10):  # one connection each: both workers route some
            r = httpx.post(f"{router.url}/v1/chat/completions", json=short())
            assert r.status_code == 200
        assert received(a) == before
        sim_release(a.url)
        for stream in on_a:
            assert await stream.flowing()

        async def ended() -> bool:
            return all(s.fate == "ended" for s in on_a + on_b)

        await await_for(ended, timeout=40)
        assert all(s.tail.rstrip().endswith(b"data: [DONE]") for s in on_a)
    assert wait_for(lambda: each_worker(router, lambda s: list(listed(s)) == [url(B, port)]))
    status = wait_for(lambda: (s := router_status(router.url))["in_flight"]["total"] == 0 and s)
    generations = {slot["membership_generation"] for slot in status["workers"]["slots"]}
    assert generations == {status["membership"]["generation"]}
    text = httpx.get(f"{router.url}/metrics", timeout=5).text
    assert f'backend="{url(A, port)}"' not in text


async def test_a_drain_that_times_out_ends_its_streams_visibly(procs: list[Proc]) -> None:
    """Through the real server (uvicorn's httptools protocol and the router's fast paths): a
    stream still running when the drain times out ends with an error event."""
    port = shared_port([A, C])
    procs += [sim("eagle3", A, port), sim("baseline", C, port)]
    router = start_router(procs, url(A, port), url(C, port), drain_timeout="1")
    wait_for(lambda: router_ready(router.url, every_pool=True))
    async with contextlib.AsyncExitStack() as stack:
        (stream,) = await open_streams(router.url, 1, stack, tokens=50_000)
        assert await stream.flowing()
        r = httpx.delete(
            f"{router.url}/router/pools/speculative/backends",
            params={"url": url(A, port)},
            headers=ADMIN,
        )
        assert r.status_code == 202

        async def done() -> bool:
            return stream.fate is not None

        await await_for(done, timeout=10)
        assert stream.fate == "ended"  # a clean end of the HTTP response, with the error in it
        assert b'data: {"error"' in stream.tail and b"drain timed out" in stream.tail
    wait_for(lambda: backends(router) == {})
    text = httpx.get(f"{router.url}/metrics", timeout=5).text
    assert metric_value(text, "spec_router_drain_cuts_total", pool="speculative") == 1
    assert router_status(router.url)["in_flight"]["total"] == 0
