"""The EPP killed under traffic, and back: Envoy fails open to plain balancing over both pools
once its health check (or outlier detection) has the EPP out, and routes by the EPP again once
it serves again. Streams already past their request phase are not touched."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx
import pytest

from tests.gateway.conftest import GatewayFactory, chat
from tests.support.http import wait_for

pytestmark = pytest.mark.gateway


@dataclass(frozen=True)
class Sent:
    at: float
    status: int  # 0: no answer at all
    pool: str | None  # x-spec-router-pool: routed by the EPP (None: Envoy's fallback)
    engine: str | None


class Traffic:
    """Short requests one after another on a thread, each noted with when it started."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sent: list[Sent] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set():
                at = time.monotonic()
                try:
                    r = client.post(f"{self.url}/v1/chat/completions", json=chat(3))
                except httpx.HTTPError:
                    self.sent.append(Sent(at, 0, None, None))
                    continue
                pool, engine = r.headers.get("x-spec-router-pool"), r.headers.get("x-sim-preset")
                self.sent.append(Sent(at, r.status_code, pool, engine))

    def since(self, t: float, until: float = float("inf")) -> list[Sent]:
        return [s for s in self.sent if t <= s.at < until]

    def wait(self, count: int, since: float) -> None:
        wait_for(lambda: len(self.since(since)) >= count, timeout=30)


def test_the_epp_killed_mid_traffic_and_restarted(start_gateway: GatewayFactory) -> None:
    gateway = start_gateway(policy="spillover", crossover="2", learn="false", explore_share="0")
    envoy = gateway.envoy
    with (
        httpx.Client(timeout=30) as long_client,
        long_client.stream(  # a long stream, routed before the kill
            "POST", f"{gateway.url}/v1/chat/completions", json=chat(1500, True)
        ) as long_stream,
        Traffic(gateway.url) as traffic,
    ):
        assert long_stream.headers["x-spec-router-pool"] == "speculative"
        traffic.wait(10, since=0.0)
        assert all(s.status == 200 and s.pool for s in traffic.sent)

        killed = time.monotonic()
        gateway.epp.kill()
        wait_for(envoy.epp_unhealthy, timeout=15)
        out = time.monotonic()
        traffic.wait(10, since=out)
        restarted = time.monotonic()
        gateway.restart_epp()
        wait_for(envoy.epp_healthy, timeout=15)
        healthy = time.monotonic()
        # routed by the EPP again (once the outlier ejection of the dead one has run out)
        wait_for(lambda: any(s.pool for s in traffic.since(healthy)), timeout=15)
        back = min(s.at for s in traffic.since(healthy) if s.pool)
        traffic.wait(10, since=back)

        # the long stream, past its request phase at the kill, ends whole
        body = long_stream.read()
        assert body.rstrip().endswith(b"data: [DONE]")

    during = traffic.since(killed, out)
    failed_at_kill = [s for s in during if s.status != 200]
    # Envoy knew the EPP was out: every request succeeds, balanced over both pools
    fallback = traffic.since(out, restarted)
    assert fallback and all(s.status == 200 and s.pool is None for s in fallback), fallback
    assert {s.engine for s in fallback} == {"eagle3", "baseline"}
    # the EPP back: every request succeeds, and from its first pick on, each is the EPP's
    after = traffic.since(restarted)
    assert all(s.status == 200 for s in after), [s for s in after if s.status != 200]
    assert all(s.pool == "speculative" for s in traffic.since(back))
    gateway.idle()
    print(
        f"EPP out {out - killed:.2f} s after the kill ({len(during)} requests then, "
        f"{len(failed_at_kill)} failed: {[s.status for s in failed_at_kill]}); "
        f"{len(fallback)} by fallback; routed again {back - restarted:.2f} s after the restart"
    )


@pytest.mark.slow
def test_a_stopping_epp_drains_before_it_closes(start_gateway: GatewayFactory) -> None:
    """SIGTERM (a rolling update): the EPP reports NOT_SERVING and serves on for its drain, so
    Envoy's health check takes it out before the port closes: no request fails."""
    gateway = start_gateway(drain=3.0, policy="spillover", crossover="2", learn="false")
    with Traffic(gateway.url) as traffic:
        traffic.wait(10, since=0.0)
        stopping = time.monotonic()
        gateway.epp.stop()  # SIGTERM; returns once it has exited
        stopped = time.monotonic()
        traffic.wait(10, since=stopped)
    since = traffic.since(stopping)
    assert all(s.status == 200 for s in since), [s for s in since if s.status != 200]
    # routed by the EPP while it drained, then by the fallback once it was out
    assert any(s.pool for s in since) and all(s.pool is None for s in traffic.since(stopped))
    assert stopped - stopping >= 3.0
