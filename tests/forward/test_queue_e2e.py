"""The router-side queue (QUEUE_SIZE): overflowing requests wait, are admitted when a backend
can serve them within their SLO, or get 503 at the deadline and 429 when the queue is full;
every place in the queue is given back on every path, the client leaving included. A request
that would miss its SLO even alone is not held (waiting would not help it), nor one whose
engine the router measured within the relaxed SLO, nor one while an engine is down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.decide import table as tables
from router.sim.model import EAGLE3
from tests.conftest import TIME_SCALE, RouterFactory
from tests.support.http import await_for, metric_value, router_status, wait_for
from tests.support.processes import Proc
from tests.support.tables import model_table

pytestmark = pytest.mark.anyio

# At time scale 0.1 a lone greedy request decodes at ~1.24 ms per token on the speculative
# sim, two at ~1.50 ms; the baseline at 2 ms. A 0.65 ms TPOT target makes its relaxed tier
# 1.3 ms: an idle speculative engine meets it, one already decoding does not, and the baseline
# never does.
TIGHT = {"x-slo-tpot-ms": "0.65"}
IMPOSSIBLE = {"x-slo-tpot-ms": "0.01"}
# The router measures each engine against the SLO of the requests it served. A request with
# an SLO no engine meets even alone is placed, unqueued, on the engine least filled against its
# relaxed capacity: the idle baseline (whose relaxed capacity is the larger); three of them
# leave it measured past the relaxed SLO. An overflowing TIGHT request while the speculative
# engine decodes goes to the baseline too: there the queue holds it.
MEASURED_LATE = IMPOSSIBLE


def chat(max_tokens: int, stream: bool = False) -> dict[str, Any]:
    return {
        "model": "sim",
        "messages": [{"role": "user", "content": "abc abc"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }


def queue_settings(tmp_path: Path) -> dict[str, str]:
    """A queue of one place, over a table saved in ``tmp_path`` (no learning, no exploring)."""
    table = model_table(400, 200, time_scale=float(TIME_SCALE), tau_sampling=EAGLE3.tau_sampling)
    tables.save(table, tmp_path / "t.json")
    return {
        "table_path": str(tmp_path / "t.json"),
        "learn": "false",
        "explore_share": "0",
        "ramp_seconds": "0",
        "queue_size": "1",
        "queue_timeout": "1",
    }


def queue_router(
    sims: dict[str, Proc], start: RouterFactory, tmp_path: Path, **settings: str
) -> Proc:
    """A router with a queue of one place over ``sims``."""
    return start(
        sims["speculative"].url, sims["baseline"].url, **queue_settings(tmp_path), **settings
    )


def strain_the_baseline(router: Proc, url: str) -> None:
    """Three streams the baseline ``url`` serves past their SLO, one at a time (a stream: a
    request answered whole has no TTFT or TPOT to judge)."""
    for _ in range(3):
        r = httpx.post(
            f"{router.url}/v1/chat/completions",
            json=chat(8, stream=True),
            headers=MEASURED_LATE,
            timeout=30,
        )
        assert r.status_code == 200 and r.headers["x-spec-router-pool"] == "baseline"
        wait_for(lambda: router_status(router.url)["in_flight"]["total"] == 0)
    engines = wait_for(lambda: router_status(router.url)["queue"]["engines"])
    assert engines[url]["missed_share"] == 1.0 and engines[url]["strained"] is True


@pytest.fixture
def router(own_sims: dict[str, Proc], start_router: RouterFactory, tmp_path: Path) -> Proc:
    """The baseline engine measured past the relaxed SLO: the queue holds what goes there."""
    proc = queue_router(own_sims, start_router, tmp_path)
    strain_the_baseline(proc, own_sims["baseline"].url)
    return proc


def assert_refusal(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status
    assert int(r.headers["retry-after"]) >= 1
    err = r.json()["error"]
    assert err["code"] == code and err["message"] and err["type"]


async def test_overflow_waits_and_is_admitted_when_a_backend_frees(router: Proc) -> None:
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=router.url, timeout=30))
        # A: the idle speculative engine can serve it
        first = await stack.enter_async_context(
            client.stream("POST", "/v1/chat/completions", json=chat(400, True), headers=TIGHT)
        )
        assert first.headers["x-spec-router-pool"] == "speculative"
        chunks = first.aiter_raw()
        await anext(chunks)
        # B: nowhere within its SLO while A decodes: it waits in the queue
        b = asyncio.ensure_future(client.post("/v1/chat/completions", json=chat(64), headers=TIGHT))
        await await_for(lambda: queued(client, 1))
        # C: the queue (one place) is full
        c = await client.post("/v1/chat/completions", json=chat(64), headers=TIGHT)
        assert_refusal(c, 429, "queue_full")
        # A ends: B is admitted
        async for _ in chunks:
            pass
        r = await b
        assert r.status_code == 200 and r.headers["x-spec-router-pool"] == "speculative"
        doc = await status(client)
        counts = ("queued", "admitted", "timed_out", "refused_full", "sent_fine", "sent_changing")
        assert {k: doc["queue"][k] for k in counts} == {
            "queued": 0,
            "admitted": 1,
            "timed_out": 0,
            "refused_full": 1,
            "sent_fine": 0,
            "sent_changing": 0,
        }
        assert doc["queue"]["size"] == 1 and doc["queue"]["steady"] is True
        assert doc["in_flight"]["total"] == 0
        metrics = (await client.get("/metrics")).text
        assert 'spec_router_queue_outcomes_total{outcome="admitted"} 1.0' in metrics
        assert "spec_router_queued_requests 0.0" in metrics


async def test_the_deadline_answers_503_and_gives_the_place_back(router: Proc) -> None:
    async with an_overflow(router) as (client, r):
        assert_refusal(r, 503, "no_backend_available")
        doc = await status(client)
        assert doc["queue"]["queued"] == 0 and doc["queue"]["timed_out"] == 1
        assert doc["in_flight"]["total"] == 1  # the held stream alone


async def test_a_client_that_leaves_while_queued_gives_its_place_back(router: Proc) -> None:
    async with AsyncExitStack() as stack:
        watcher = await stack.enter_async_context(
            httpx.AsyncClient(base_url=router.url, timeout=30)
        )
        held = await hold_the_speculative_engine(stack, watcher)
        async with httpx.AsyncClient(base_url=router.url, timeout=30) as client:
            task = asyncio.ensure_future(
                client.post("/v1/chat/completions", json=chat(8), headers=TIGHT)
            )
            await await_for(lambda: queued(watcher, 1))
            task.cancel()  # closes its connection
            with pytest.raises(asyncio.CancelledError):
                await task
        await await_for(lambda: queued(watcher, 0))
        doc = await status(watcher)
        assert doc["queue"]["timed_out"] == 0 and doc["in_flight"]["total"] == 1
        del held


async def test_a_request_that_misses_its_slo_even_alone_is_not_held(router: Proc) -> None:
    async with httpx.AsyncClient(base_url=router.url, timeout=30) as client:
        r = await client.post("/v1/chat/completions", json=chat(8), headers=IMPOSSIBLE)
        assert r.status_code == 200
        assert r.headers["x-spec-router-reason"] == "beyond_slo"
        doc = await status(client)
        assert doc["queue"]["queued"] == 0 and doc["queue"]["admitted"] == 0
        assert doc["in_flight"]["total"] == 0


async def test_an_engine_not_measured_past_the_slo_is_never_queued_against(
    own_sims: dict[str, Proc], start_router: RouterFactory, tmp_path: Path
) -> None:
    # the same overflow as above, to an engine the router has not measured past the relaxed SLO
    # (nothing served there yet): the table says it is full, nothing measured says so: the
    # request goes on at once
    router = queue_router(own_sims, start_router, tmp_path)
    async with an_overflow(router) as (client, r):
        assert r.status_code == 200 and r.headers["x-spec-router-reason"] == "overflow"
        doc = (await status(client))["queue"]
        assert doc["sent_fine"] == 1 and doc["sent_changing"] == 0 and doc["steady"] is True
        assert doc["queued"] == doc["admitted"] == doc["timed_out"] == doc["refused_full"] == 0
        metrics = (await client.get("/metrics")).text
        assert metric_value(metrics, "spec_router_queue_sent_on_total", why="measured_fine") == 1


async def test_while_an_engine_is_down_nothing_is_held(
    own_sims: dict[str, Proc], start_router: RouterFactory, tmp_path: Path
) -> None:
    # the baseline measured past the SLO, but a third engine (nothing listens there) is not
    # usable: capacity is not steady (an engine loading or restarting), and the router does not
    # answer 503 for that
    both = f"{own_sims['speculative'].url},http://127.0.0.1:9"
    router = queue_router(own_sims, start_router, tmp_path, speculative_urls=both)
    strain_the_baseline(router, own_sims["baseline"].url)
    async with an_overflow(router) as (client, r):
        assert r.status_code == 200 and r.headers["x-spec-router-reason"] == "overflow"
        doc = (await status(client))["queue"]
        assert doc["steady"] is False
        assert doc["sent_changing"] == 1 and doc["sent_fine"] == 0 and doc["timed_out"] == 0
        metrics = (await client.get("/metrics")).text
        assert (
            metric_value(metrics, "spec_router_queue_sent_on_total", why="capacity_changing") == 1
        )


async def hold_the_speculative_engine(
    stack: AsyncExitStack, client: httpx.AsyncClient
) -> AsyncIterator[bytes]:
    """A long stream on the speculative engine through the router (closed with ``stack``;
    keep what this returns: a dropped iterator would close the stream)."""
    held = await stack.enter_async_context(
        client.stream("POST", "/v1/chat/completions", json=chat(4000, True), headers=TIGHT)
    )
    assert held.headers["x-spec-router-pool"] == "speculative"
    chunks = held.aiter_raw()
    await anext(chunks)  # started
    return chunks


@asynccontextmanager
async def an_overflow(
    router: Proc,
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.Response]]:
    """A short TIGHT request sent while a long stream holds the speculative engine (so no
    engine has room for it within the relaxed SLO): the client and its answer, the stream
    still open inside the block."""
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=router.url, timeout=30))
        held = await hold_the_speculative_engine(stack, client)
        r = await client.post("/v1/chat/completions", json=chat(8), headers=TIGHT)
        yield client, r
        del held


async def status(client: httpx.AsyncClient) -> dict[str, Any]:
    doc: dict[str, Any] = (await client.get("/router/status")).json()
    return doc


async def queued(client: httpx.AsyncClient, n: int) -> bool:
    return bool((await status(client))["queue"]["queued"] == n)
