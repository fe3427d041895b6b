"""The pools checked against what the engines say, by a router process in front of sims: at
the engines' first answer (not before: start-up does not wait) and again when one rejoins.
Findings are in ``/router/status`` ``warnings`` and in the router's log."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import TIME_SCALE, RouterFactory
from tests.support.http import router_status, wait_for
from tests.support.processes import Proc, free_port, sim_args, sim_on, spawn


@pytest.fixture(scope="module")
def chain() -> Iterator[Proc]:
    with_seed = spawn(sim_args("eagle3-chain", "--time-scale", TIME_SCALE, "--seed", "1"))
    yield with_seed
    with_seed.stop()


@pytest.fixture(scope="module")
def plain() -> Iterator[Proc]:
    proc = spawn(sim_args("baseline", "--time-scale", TIME_SCALE, "--seed", "2"))
    yield proc
    proc.stop()


def all_reported(status: dict[str, Any]) -> bool:
    return all(b["reports"] is not None for p in status["pools"].values() for b in p["backends"])


def warnings(url: str, count: int = 1) -> list[dict[str, Any]]:
    """The status's warnings once every backend has described itself (the engines answer
    after start-up, one at a time: before both have, a finding about one pool alone is right)
    and there are ``count``."""

    def enough() -> list[dict[str, Any]] | None:
        status = router_status(url)
        found: list[dict[str, Any]] = status["warnings"]
        return found if all_reported(status) and len(found) >= count else None

    result = wait_for(enough)
    assert result is not None
    return result


def logged(router: Proc, text: str) -> bool:
    return any(text in line for line in router.output)


def test_swapped_pools_are_an_error_in_status_and_log(
    start_router: RouterFactory, chain: Proc, plain: Proc
) -> None:
    router = start_router(plain.url, chain.url)  # the baseline sim as speculative
    (found,) = warnings(router.url)
    assert (found["kind"], found["code"], found["level"]) == ("pools", "pools-swapped", "error")
    assert "SPECULATIVE_URLS and BASELINE_URLS" in found["fix"]
    assert set(found["urls"]) == {plain.url, chain.url}
    wait_for(lambda: logged(router, "ERROR spec_router.health: pools: pools-swapped"))
    status = router_status(router.url)
    reports = status["pools"]["speculative"]["backends"][0]["reports"]
    assert reports["speculative"] is False and reports["flavor"] == "sglang"
    # the router still serves: a finding does not take a pool away
    assert status["pools"]["speculative"]["usable"] and status["pools"]["baseline"]["usable"]


def test_one_engine_as_localhost_and_127_0_0_1(
    start_router: RouterFactory, chain: Proc, plain: Proc
) -> None:
    twice = f"{chain.url},{chain.url.replace('127.0.0.1', 'localhost')}"
    router = start_router(twice, plain.url)
    (found,) = warnings(router.url)
    assert (found["code"], found["level"]) == ("same-engine", "warning")
    assert "sglang.random_seed" in found["message"]
    wait_for(lambda: logged(router, "WARNING spec_router.health: pools: same-engine"))


def test_a_healthy_pair_has_no_warnings(
    start_router: RouterFactory, chain: Proc, plain: Proc
) -> None:
    router = start_router(chain.url, plain.url)
    wait_for(lambda: all_reported(router_status(router.url)))
    assert router_status(router.url)["warnings"] == []
    assert not logged(router, "pools:")


def test_different_models_and_rechecked_when_the_engine_rejoins(
    start_router: RouterFactory, chain: Proc
) -> None:
    port = free_port()
    scale = ["--time-scale", TIME_SCALE]
    other = spawn(sim_on("baseline", port, *scale, "--model", "qwen", "--model-path", "Qwen3-8B"))
    try:
        router = start_router(chain.url, other.url, health_interval="0.1", log_level="info")
        found = warnings(router.url, 2)
        assert {f["code"] for f in found} == {"different-models", "different-model-names"}
        assert all(f["level"] == "error" for f in found)
        other.stop()
        # it comes back serving the right model: once it has rejoined, no more findings
        other = spawn(sim_on("baseline", port, *scale))
        wait_for(lambda: router_status(router.url)["warnings"] == [], timeout=20)
        assert logged(router, "pools: resolved: different-models")
    finally:
        other.stop()
