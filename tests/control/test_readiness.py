"""/ready and the pools' status in /router/status: a pool that never came up is not "ok".

The router's own app in process (no lifespan, so no poller: probes are folded in by hand).
"""

from __future__ import annotations

import httpx
import pytest

from router.app import RouterApp
from router.settings import Settings

pytestmark = pytest.mark.anyio

S1, S2, B1 = "http://127.0.0.1:30011", "http://127.0.0.1:30012", "http://127.0.0.1:30021"


def app() -> RouterApp:
    return RouterApp(Settings(speculative_urls=[S1, S2], baseline_urls=[B1]))


async def ready(router: RouterApp) -> httpx.Response:
    transport = httpx.ASGITransport(app=router)
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
        return await client.get("/ready")


async def test_nothing_healthy_yet_is_down_and_503() -> None:
    router = app()
    r = await ready(router)
    assert r.status_code == 503
    body = r.json()
    assert (body["ready"], body["status"]) == (False, "down")
    assert body["problems"] == [
        f"speculative pool: no usable backend (never healthy: {S1}, {S2})",
        f"baseline pool: no usable backend (never healthy: {B1})",
    ]


async def test_a_pool_that_never_came_up_is_degraded_but_ready() -> None:
    router = app()
    now = router.clock()
    router.health.probe(B1, True, now)
    router.health.probe(S1, True, now)
    router.health.probe(S2, False, now, "cannot connect")
    r = await ready(router)
    assert r.status_code == 200  # the baseline and S1 serve: a readiness probe must pass
    body = r.json()
    assert (body["ready"], body["status"]) == (True, "degraded")
    assert body["pools"] == {"speculative": True, "baseline": True}
    assert body["problems"] == [
        f"speculative pool: 1 of 2 backends not usable (never healthy: {S2})"
    ]
    status = router.status()
    assert status["status"] == "degraded"
    spec = status["pools"]["speculative"]
    assert (spec["status"], spec["problem"]) == ("degraded", body["problems"][0])
    assert status["pools"]["baseline"]["status"] == "ok"
    assert [b["ever_healthy"] for b in spec["backends"]] == [True, False]


async def test_the_whole_speculative_pool_never_healthy_is_degraded_not_ok() -> None:
    router = app()
    router.health.probe(B1, True, router.clock())
    body = (await ready(router)).json()
    assert (body["ready"], body["status"], body["pools"]["speculative"]) == (
        True,
        "degraded",
        False,
    )
    assert "speculative pool: no usable backend (never healthy" in body["problems"][0]


async def test_all_whole_is_ok_and_warnings_are_listed() -> None:
    router = app()
    now = router.clock()
    for url in (S1, S2, B1):
        router.health.probe(url, True, now)
    router.notices.raise_("check:x", "speculative", "the pools serve different models", now)
    body = (await ready(router)).json()
    assert (body["status"], body["problems"]) == ("ok", [])
    assert body["warnings"] == ["the pools serve different models"]
    assert router.status()["warnings"][0]["message"] == "the pools serve different models"


async def test_a_pool_without_backends_is_down_not_ok() -> None:
    # (say its DNS name never resolved: router.members.discovery)
    router = RouterApp(Settings(speculative_urls=[S1], baseline_urls=[B1]))
    router.health.probe(S1, True, router.clock())
    router.pools["baseline"].clear()
    router.health.remove(B1)
    body = (await ready(router)).json()
    assert (body["ready"], body["status"], body["pools"]) == (
        True,
        "degraded",
        {"speculative": True, "baseline": False},
    )
    assert body["problems"] == ["baseline pool: no backend"]
    router.pools["speculative"].clear()
    r = await ready(router)
    assert (r.status_code, r.json()["status"]) == (503, "down")


async def test_the_pools_checks_join_the_warnings_everywhere() -> None:
    # (router.health.pool_check: the pools against what their engines say) beside a backend
    # that cannot be reached, in /router/status, /ready and the live page's list
    from router.control.live import live_document
    from router.health.info import EngineInfo

    router = app()
    now = router.clock()
    for url in (S1, S2, B1):
        router.health.probe(url, True, now)
    router.notices.raise_(f"backend:{S2}", S2, f"backend {S2} has failed every probe", now)
    router.pool_check.update(EngineInfo(S1, "sglang", "0.5.23", served_model="m", speculative=True))
    router.pool_check.update(
        EngineInfo(B1, "sglang", "0.5.23", served_model="other", speculative=False)
    )
    codes = [f.code for f in router.pool_check.findings]
    assert "different-model-names" in codes
    warnings = router.status()["warnings"]
    assert [w["kind"] for w in warnings] == ["backend"] + ["pools"] * len(codes)
    assert [w.get("code") for w in warnings[1:]] == codes
    body = (await ready(router)).json()
    assert body["warnings"] == [w["message"] for w in warnings]
    shown = live_document(router.status(), router.keeper.curves(), router.recent.series())
    assert shown["warnings"] == [w["message"] for w in warnings]
