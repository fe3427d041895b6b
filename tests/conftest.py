"""Shared fixtures: simulated engines and routers as real processes on loopback ports."""

from __future__ import annotations

import functools
import importlib
import os
import ssl
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from router.settings import sim_time_env
from tests.support.http import every_worker_ready, router_ready, wait_for
from tests.support.processes import Proc, running, sim_args, spawn, stop_all


def _one_tls_context_per_setting() -> None:
    """httpx builds a TLS context, loading the whole CA bundle, for every client it makes, even
    one that only ever talks plain HTTP to 127.0.0.1: each ``httpx.get``, each ``OpenAI()``.
    That costs about 60 ms on a slow 2-core host, and the tests make thousands of clients, so
    it was minutes of ``make test``. An ``SSLContext`` is meant to be shared: the tests' clients
    share one per setting. (A private module of httpx: if it moves, this does nothing.)"""
    try:
        httpx_transports = importlib.import_module("httpx._transports.default")
    except ImportError:
        return
    create: Callable[..., ssl.SSLContext] | None = getattr(
        httpx_transports, "create_ssl_context", None
    )
    if create is None or hasattr(create, "cache_info"):
        return
    cached = functools.lru_cache(maxsize=8)(create)

    def shared(
        verify: ssl.SSLContext | str | bool = True, cert: Any = None, trust_env: bool = True
    ) -> ssl.SSLContext:
        if isinstance(verify, bool) and cert is None:
            return cached(verify=verify, cert=None, trust_env=trust_env)
        return create(verify=verify, cert=cert, trust_env=trust_env)

    shared.cache_info = cached.cache_info  # type: ignore[attr-defined]
    setattr(httpx_transports, "create_ssl_context", shared)  # noqa: B010 (not exported)


_one_tls_context_per_setting()

# Simulated time runs 10x faster than the presets' real time in tests.
TIME_SCALE = "0.1"
# The engines whose behaviour the sims copy (router/sim/behaviour.py): the health, load-signal,
# retry and cancellation tests run against both.
ENGINES = ("sglang", "vllm")


def sim_pair(engine: str = "sglang", seeds: tuple[str, ...] = ()) -> dict[str, Proc]:
    """An eagle3 and a baseline sim copying ``engine``. vLLM refuses model names it does not
    serve, so its pair serves the name the tests send, ``sim``."""
    common = ["--time-scale", TIME_SCALE, "--engine", engine]
    if engine == "vllm":
        common += ["--model", "sim"]
    spec = spawn(sim_args("eagle3", *common, *(["--seed", seeds[0]] if seeds else [])))
    try:
        base = spawn(sim_args("baseline", *common, *(["--seed", seeds[1]] if seeds else [])))
    except BaseException:
        spec.stop()
        raise
    return {"speculative": spec, "baseline": base}


# End-to-end tests start servers -- sims and routers as processes, or servers on sockets of
# their own -- and live in modules named *_e2e.py (tests/real, the llama.cpp tier, is all end to
# end); each of their tests carries the ``e2e`` marker, so ``pytest -m "not e2e"`` runs the rest,
# in process. A test elsewhere that asks for one of these server fixtures is refused.
E2E_MODULE_SUFFIX = "_e2e.py"
SERVER_FIXTURES = frozenset(
    {"sims", "vllm_sims", "engine_sims", "engine_pair", "own_sims", "start_router"}
    | {"eagle3", "baseline", "vllm_eagle3"}
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced = []
    for item in items:
        real = item.path.parent.name == "real"
        if real or item.path.name.endswith(E2E_MODULE_SUFFIX):
            item.add_marker(pytest.mark.e2e)
        elif SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            misplaced.append(item.nodeid)
    if misplaced:
        raise pytest.UsageError(
            "tests that start servers belong in a *_e2e.py module: " + ", ".join(misplaced)
        )
    slow_first(items)


def slow_first(items: list[pytest.Item]) -> None:
    """Modules with a test marked ``slow`` run first, each module's tests still together and in
    order: pytest-xdist hands out the rest as workers free up, so a long test at the end of
    the list leaves the other worker idle while it runs."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)  # (stable: the order is kept otherwise)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def sims() -> Iterator[dict[str, Proc]]:
    """One eagle3 and one baseline SGLang-mode sim for the whole session (faults are set per
    request)."""
    procs = sim_pair("sglang", ("1", "2"))
    try:
        yield procs
    finally:
        stop_all(procs.values())


@pytest.fixture(scope="session")
def vllm_sims() -> Iterator[dict[str, Proc]]:
    """The same pair copying vLLM, started when a test first asks for it."""
    procs = sim_pair("vllm", ("1", "2"))
    try:
        yield procs
    finally:
        stop_all(procs.values())


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """Which engine the sims of an ``engine_sims`` / ``engine_pair`` test copy."""
    name: str = request.param
    return name


@pytest.fixture
def engine_sims(engine: str, request: pytest.FixtureRequest) -> dict[str, Proc]:
    """The session's pair copying ``engine`` (both engines, one test each)."""
    procs: dict[str, Proc] = request.getfixturevalue("sims" if engine == "sglang" else "vllm_sims")
    return procs


@pytest.fixture
def engine_pair(engine: str) -> Iterator[dict[str, Proc]]:
    """A fresh pair copying ``engine``, for tests that kill or reconfigure them."""
    procs = sim_pair(engine)
    try:
        yield procs
    finally:
        stop_all(procs.values())


@pytest.fixture
def own_sims() -> Iterator[dict[str, Proc]]:
    """A fresh SGLang-mode pair, for tests that kill or reconfigure them."""
    procs = sim_pair("sglang")
    try:
        yield procs
    finally:
        stop_all(procs.values())


# The single sims below (tests/sim, the load generator's tests): fast enough for tests, slow
# enough that an iteration (>= 1 ms) is above timer resolution.
SIM_SCALE = "0.05"


@pytest.fixture(scope="session")
def eagle3() -> Iterator[Proc]:
    with running(sim_args("eagle3", "--time-scale", SIM_SCALE, "--seed", "1")) as proc:
        yield proc


@pytest.fixture(scope="session")
def baseline() -> Iterator[Proc]:
    with running(sim_args("baseline", "--time-scale", SIM_SCALE, "--seed", "1")) as proc:
        yield proc


@pytest.fixture(scope="session")
def vllm_eagle3() -> Iterator[Proc]:
    with running(
        sim_args("eagle3", "--time-scale", SIM_SCALE, "--seed", "1", "--engine", "vllm")
    ) as p:
        yield p


def router_env(spec_url: str, base_url: str, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_ROUTER_")}
    env.update(
        {
            "SPEC_ROUTER_SPECULATIVE_URLS": spec_url,
            "SPEC_ROUTER_BASELINE_URLS": base_url,
            "SPEC_ROUTER_HEALTH_INTERVAL": "0.2",
            # SGLang-mode sims abort a request 2 model s after its client left: 0.2 s here
            "SPEC_ROUTER_ENGINE_ABORT_LAG": sim_time_env(float(TIME_SCALE))[
                "SPEC_ROUTER_ENGINE_ABORT_LAG"
            ],
            "SPEC_ROUTER_LOG_LEVEL": "warning",
        }
    )
    env.update({f"SPEC_ROUTER_{k.upper()}": v for k, v in settings.items()})
    return env


RouterFactory = Callable[..., Proc]


@pytest.fixture
def start_router(sims: dict[str, Proc]) -> Iterator[RouterFactory]:
    """Start a router process in front of the session's sims (or other URLs); waits until both
    pools are usable (``one_pool=True``: until ``/ready``, one pool; ``ready=False``: not at
    all), under ``--workers`` in every worker. (``/ready`` alone let a test start while the
    other pool's first probe, or another worker's, was still out, and a request there then
    found nothing usable: a 503.)"""
    started: list[Proc] = []

    def start(
        spec_url: str | None = None,
        base_url: str | None = None,
        ready: bool = True,
        serve_args: tuple[str, ...] = (),
        one_pool: bool = False,
        **settings: str,
    ) -> Proc:
        env = router_env(
            spec_url or sims["speculative"].url, base_url or sims["baseline"].url, **settings
        )
        proc = spawn(["-m", "router", "serve", "--port", "0", *serve_args], env=env)
        started.append(proc)
        if ready:
            wait_for(lambda: router_ready(proc.url, every_pool=not one_pool))
            if "--workers" in serve_args:  # (each worker polls the pools itself)
                wait_for(every_worker_ready(proc.url, every_pool=not one_pool))
        return proc

    yield start
    stop_all(started)
