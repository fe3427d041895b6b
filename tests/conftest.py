"""Shared fixtures: simulated engines and routers as real processes on loopback ports."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from tests.support.http import router_ready, wait_for
from tests.support.processes import Proc, sim_args, spawn

# Simulated time runs 10x faster than the presets' real time in tests.
TIME_SCALE = "0.1"


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def sims() -> Iterator[dict[str, Proc]]:
    """One eagle3 and one baseline sim for the whole session (faults are set per request)."""
    spec = spawn(sim_args("eagle3", "--time-scale", TIME_SCALE, "--seed", "1"))
    try:
        base = spawn(sim_args("baseline", "--time-scale", TIME_SCALE, "--seed", "2"))
    except BaseException:
        spec.stop()
        raise
    try:
        yield {"speculative": spec, "baseline": base}
    finally:
        spec.stop()
        base.stop()


@pytest.fixture
def own_sims() -> Iterator[dict[str, Proc]]:
    """A fresh pair, for tests that kill or reconfigure them."""
    procs = {"speculative": spawn(sim_args("eagle3", "--time-scale", TIME_SCALE))}
    try:
        procs["baseline"] = spawn(sim_args("baseline", "--time-scale", TIME_SCALE))
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


def router_env(spec_url: str, base_url: str, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_ROUTER_")}
    env.update(
        {
            "SPEC_ROUTER_SPECULATIVE_URLS": spec_url,
            "SPEC_ROUTER_BASELINE_URLS": base_url,
            "SPEC_ROUTER_HEALTH_INTERVAL": "0.2",
            "SPEC_ROUTER_LOG_LEVEL": "warning",
        }
    )
    env.update({f"SPEC_ROUTER_{k.upper()}": v for k, v in settings.items()})
    return env


RouterFactory = Callable[..., Proc]


@pytest.fixture
def start_router(sims: dict[str, Proc]) -> Iterator[RouterFactory]:
    """Start a router process in front of the session's sims (or other URLs); waits for /ready."""
    started: list[Proc] = []

    def start(
        spec_url: str | None = None,
        base_url: str | None = None,
        ready: bool = True,
        serve_args: tuple[str, ...] = (),
        **settings: str,
    ) -> Proc:
        env = router_env(
            spec_url or sims["speculative"].url, base_url or sims["baseline"].url, **settings
        )
        proc = spawn(["-m", "router", "serve", "--port", "0", *serve_args], env=env)
        started.append(proc)
        if ready:
            wait_for(lambda: router_ready(proc.url))
        return proc

    yield start
    for proc in started:
        proc.stop()
