"""A real Envoy from deploy/envoy/ in front of engines, asking a real ``spec-router epp``.

``gateway`` starts the EPP (a process, its gRPC port chosen here so that a restarted EPP comes
back where Envoy looks for it) and an Envoy on the shipped configuration, pointed at them; it
returns once Envoy's health check sees the EPP serving. Everything is stopped by PID.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import router_env
from tests.support.envoy import RECOMMENDED, Envoy, configured, start_envoy
from tests.support.http import router_ready, router_status, wait_for
from tests.support.processes import Proc, free_port, spawn


def endpoint(url: str) -> str:
    return url.removeprefix("http://")


def start_epp(
    spec_url: str,
    base_url: str,
    grpc_port: int,
    settings: Mapping[str, str],
    drain: float = 0.0,
    lease_max_age: float | None = None,
) -> Proc:
    """``settings``: the router's (``router_env``); ``drain``: seconds it serves on,
    NOT_SERVING, once told to stop (0: tests stop at once; the default of ``spec-router epp``
    is 3); ``lease_max_age``: its ``--lease-max-age`` (None: the default)."""
    env = router_env(spec_url, base_url, **settings)
    args = ["-m", "router", "epp", "--port", "0", "--grpc-port", str(grpc_port)]
    args += ["--drain", str(drain)]
    if lease_max_age is not None:
        args += ["--lease-max-age", str(lease_max_age)]
    proc = spawn(args, env=env)
    try:
        # both pools usable: /ready is 200 on one, and a test's first request (or, after
        # restart_epp, the traffic already running) would then be routed to the other pool
        wait_for(lambda: router_ready(proc.url, every_pool=True))
    except BaseException:
        proc.stop()
        raise
    return proc


@dataclass
class Gateway:
    """An EPP and the Envoy that asks it, before two engines."""

    spec_url: str
    base_url: str
    grpc_port: int
    settings: dict[str, str]
    drain: float
    epp: Proc
    envoy: Envoy
    stopped: list[Proc] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.envoy.url()

    def status(self) -> dict[str, Any]:
        return router_status(self.epp.url)

    def idle(self) -> None:
        """Nothing in flight and no lease held: every request's end was reported."""

        def clean() -> bool:
            status = self.status()
            return bool(status["in_flight"]["total"] == 0 and status["gateway"]["leases"] == 0)

        wait_for(clean, timeout=10)

    def restart_epp(self) -> None:
        """The EPP again, on the same gRPC port (Envoy's EPP cluster is static)."""
        self.stopped.append(self.epp)
        self.epp = start_epp(
            self.spec_url, self.base_url, self.grpc_port, self.settings, self.drain
        )

    def stop(self) -> None:
        self.envoy.stop()
        self.epp.stop()
        for proc in self.stopped:
            proc.stop()


GatewayFactory = Callable[..., Gateway]


@pytest.fixture
def start_gateway(sims: dict[str, Proc]) -> Iterator[GatewayFactory]:
    started: list[Gateway] = []

    def start(
        config: Path = RECOMMENDED,
        spec_url: str | None = None,
        base_url: str | None = None,
        filters: list[dict[str, Any]] | None = None,
        drain: float = 0.0,
        **settings: str,
    ) -> Gateway:
        spec = spec_url or sims["speculative"].url
        base = base_url or sims["baseline"].url
        grpc_port = free_port()
        epp = start_epp(spec, base, grpc_port, settings, drain)
        try:
            envoy = start_envoy(
                configured(
                    config,
                    f"127.0.0.1:{grpc_port}",
                    [endpoint(spec), endpoint(base)],
                    filters or [],
                )
            )
        except BaseException:
            epp.stop()
            raise
        gateway = Gateway(spec, base, grpc_port, settings, drain, epp, envoy)
        started.append(gateway)
        wait_for(envoy.epp_healthy, timeout=15)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()


def chat(max_tokens: int, stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {
        "model": "sim",
        "messages": [{"role": "user", "content": "abc abc"}],
        "max_tokens": max_tokens,
        "stream": stream,
        **extra,
    }


def served_by(response: httpx.Response) -> str:
    """Which sim answered (its own header: the bytes did go there)."""
    return response.headers["x-sim-preset"]
