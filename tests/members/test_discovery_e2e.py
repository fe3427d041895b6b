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
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import TIME_SCALE, router_env
from tests.support.dns_server import DnsServer
from tests.support.http import await_for, metric_value, router_ready, router_status, wait_for
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
    base: str, n: int, stack: contextlib.AsyncExitStack, tokens: int = LONG
) -> list[Stream]:
    streams = []
    body = {**short(tokens), "stream": True}
    for _ in range(n):
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=base, timeout=60))
        response = await stack.enter_async_context(
            client.stream("POST", "/v1/chat/completions", json=body)
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


def start_router(procs: list[Proc], spec: str, base: str, *serve: str, **settings: str) -> Proc:
    env = router_env(
        spec,
        base,
        health_interval="0.1",
        ramp_seconds="0",
        policy="spillover",
        crossover="100",  # everything to the speculative pool: the pool that changes here
        admin_token=TOKEN,
        drain_timeout="30",
        **settings,
    )
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
    wait_for(lambda: router_ready(router.url))
    first = backends(router)
    assert list(first) == [url(A, port)]
    assert (first[url(A, port)]["source"], first[url(A, port)]["name"]) == ("dns", SPEC_NAME)
    (name,) = [
        n for n in router_status(router.url)["membership"]["names"] if n["pool"] == "speculative"
    ]
    assert (name["state"], name["addresses"]) == ("resolved", [A])

    async with contextlib.AsyncExitStack() as stack:
        on_a = await open_streams(router.url, 2, stack)
        # B's record appears before its engine listens: it joins as "starting" and takes
        # nothing (no request tried there, none failed)
        dns.set(SPEC_NAME, [A, B])
        joined = wait_for(lambda: backends(router).get(url(B, port)))
        assert joined["state"] == "starting" and not joined["usable"]
        for _ in range(4):
            assert httpx.post(f"{router.url}/v1/chat/completions", json=short()).status_code == 200
        assert errors_of(router, url(B, port)) == 0
        assert backends(router)[url(B, port)]["in_flight"] == 0
        # its engine comes up: healthy, and new streams go there (A is busy, B is not)
        b = sim("eagle3", B, port)
        procs.append(b)
        wait_for(lambda: backends(router)[url(B, port)]["usable"])
        on_b = await open_streams(router.url, 2, stack)
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
