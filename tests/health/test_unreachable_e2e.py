"""A backend that cannot be reached says so in the router's log, rate-limited, and /ready and
/router/status call its pool degraded (issue 34): a real router process in front of the
session's baseline sim and a speculative URL that cannot work, reading the router's own output.
"""

from __future__ import annotations

import httpx

from router.health.trouble import WARN_AFTER
from tests.conftest import RouterFactory
from tests.support.http import router_status, wait_for
from tests.support.processes import Background, Proc, refused_port, sim_on


def warnings_about(router: Proc, url: str) -> list[str]:
    return [line for line in router.output if f"backend {url} has failed every" in line]


def check_warned_once(router: Proc, url: str, says: list[str]) -> None:
    """The router warns about ``url`` after a few failed probes, naming the cause, and does
    not repeat itself probe after probe; /ready is 200 (the baseline serves) but degraded."""
    lines = wait_for(lambda: warnings_about(router, url), timeout=20)
    assert "WARNING" in lines[0]
    for part in says:
        assert part in lines[0]
    # many more failed probes later, still the one line
    checks = router_status(router.url)["pools"]["speculative"]["backends"][0]["checks"]
    wait_for(
        lambda: (
            router_status(router.url)["pools"]["speculative"]["backends"][0]["checks"]
            >= checks + 2 * WARN_AFTER
        ),
        timeout=20,
    )
    assert len(warnings_about(router, url)) == 1

    ready = httpx.get(f"{router.url}/ready", timeout=5)
    assert ready.status_code == 200
    body = ready.json()
    assert (body["status"], body["pools"]) == (
        "degraded",
        {"speculative": False, "baseline": True},
    )
    assert body["problems"] == [f"speculative pool: no usable backend (never healthy: {url})"]
    assert any(f"backend {url} has failed" in w for w in body["warnings"])
    status = router_status(router.url)
    assert status["status"] == "degraded"
    assert status["pools"]["speculative"]["status"] == "down"
    assert [w["subject"] for w in status["warnings"]] == [url]


def test_a_wrong_port_is_warned_about(sims: dict[str, Proc], start_router: RouterFactory) -> None:
    # (a port merely free when asked was, under load, taken by another test's server: "down
    # or ejected" instead of "never healthy")
    with refused_port() as port:
        url = f"http://127.0.0.1:{port}"
        router = start_router(url, sims["baseline"].url, one_pool=True)
        check_warned_once(
            router, url, ["Connection refused", f"nothing accepts connections on {url[7:]}"]
        )


def test_a_host_that_does_not_resolve_is_warned_about(
    sims: dict[str, Proc], start_router: RouterFactory
) -> None:
    url = "http://spec-router-no-such-host.invalid:30000"  # (.invalid never resolves: RFC 2606)
    router = start_router(url, sims["baseline"].url, one_pool=True)
    check_warned_once(
        router, url, ["its host 'spec-router-no-such-host.invalid' does not resolve", "typo"]
    )


def test_a_health_path_answering_404_is_warned_about(
    sims: dict[str, Proc], start_router: RouterFactory
) -> None:
    # a real engine, under a path it does not serve: /engine/ready and /engine/health are 404
    url = f"{sims['speculative'].url}/engine"
    router = start_router(url, sims["baseline"].url, one_pool=True)
    check_warned_once(
        router,
        url,
        [
            "GET /engine/health answers 404 (HTTP Not Found)",
            "the URL's path /engine is put before every path the router asks for",
        ],
    )


def test_a_backend_that_comes_up_clears_its_warning(
    sims: dict[str, Proc], start_router: RouterFactory
) -> None:
    # bound here until its engine starts: no other test's server takes it meanwhile
    with refused_port() as port:
        url = f"http://127.0.0.1:{port}"
        router = start_router(url, sims["baseline"].url, one_pool=True)
        wait_for(lambda: warnings_about(router, url), timeout=20)
    late = Background(sim_on("eagle3", port, "--time-scale", "0.1"))
    try:
        late.proc()
        wait_for(lambda: router_status(router.url)["status"] == "ok", timeout=20)
        assert router_status(router.url)["warnings"] == []
        assert httpx.get(f"{router.url}/ready", timeout=5).json()["warnings"] == []
    finally:
        late.stop()


def test_a_backend_added_at_run_time_is_warned_about_until_it_leaves(
    start_router: RouterFactory,
) -> None:
    # the admin API (or DNS discovery) adds a backend that cannot be reached: the same warning;
    # once it has left the pool, its warning goes with it
    router = start_router(admin_token="s3cret")
    admin = {"authorization": "Bearer s3cret"}
    backends = f"{router.url}/router/pools/speculative/backends"
    with refused_port() as port:
        url = f"http://127.0.0.1:{port}"
        r = httpx.post(backends, json={"url": url}, headers=admin, timeout=5)
        assert r.status_code == 201
        lines = wait_for(lambda: warnings_about(router, url), timeout=20)
        assert "nothing accepts connections" in lines[0]
    assert [w["subject"] for w in router_status(router.url)["warnings"]] == [url]
    r = httpx.delete(backends, params={"url": url}, headers=admin, timeout=5)
    assert r.status_code == 202
    wait_for(
        lambda: all(
            b["url"] != url for b in router_status(router.url)["pools"]["speculative"]["backends"]
        )
    )
    assert router_status(router.url)["warnings"] == []
    assert httpx.get(f"{router.url}/ready", timeout=5).json()["warnings"] == []
