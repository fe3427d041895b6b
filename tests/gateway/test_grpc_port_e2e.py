"""A second EPP given a gRPC port another EPP listens on is refused, with the reason.

gRPC servers set SO_REUSEPORT unless told not to: the second bound the same port, and the
kernel spread the gateway's connections over both processes (each saw a share of the leases
and access-log records; seen as a test's released count jumping by another test's records
when two tests were handed the same free port)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import router_env
from tests.gateway.conftest import start_epp
from tests.support.processes import Proc, free_port

SETTINGS = {"health_interval": "0.1", "ramp_seconds": "0", "learn": "false"}


def test_a_second_epp_on_the_same_grpc_port_exits_saying_why(sims: dict[str, Proc]) -> None:
    spec, base = sims["speculative"].url, sims["baseline"].url
    port = free_port()
    first = start_epp(spec, base, port, SETTINGS)
    try:
        second = subprocess.Popen(
            [sys.executable, "-m", "router", "epp", "--port", "0", "--grpc-port", str(port)],
            env=router_env(spec, base, **SETTINGS),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            # (it exits once its start-up fails; with the port shared it would serve on)
            output, _ = second.communicate(timeout=60)
        finally:
            if second.poll() is None:
                second.kill()
                second.communicate()
        assert second.returncode != 0
        assert f"cannot listen on 127.0.0.1:{port} for gRPC" in output
        assert first.popen.poll() is None  # the first serves on
    finally:
        first.stop()
