"""deploy/docker-compose.yml's `sim` profile, run: Docker cannot run here, so its services' own
commands start as local processes (tests/deploy/stack.py) and a client routes through them."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
from openai import OpenAI

from tests.deploy.load import drive
from tests.deploy.queries import DEPLOY
from tests.deploy.stack import healthcheck_code, load_compose, start_sim_profile
from tests.support.http import router_ready, wait_for

DOCKERFILE = DEPLOY / "Dockerfile"


def test_sim_profile_serves_through_both_simulated_engines() -> None:
    """The `sim` profile's commands, started as they are, make a working stack."""
    with start_sim_profile({"SIM_TIME_SCALE": "0.1"}) as stack:
        router = stack.router.url
        # both pools (the drive below asserts both served; /ready is 200 on one, and the
        # stack probes every second)
        wait_for(lambda: router_ready(router, every_pool=True), timeout=15)
        spec = stack.engine("sglang-eagle3").url
        base = stack.engine("sglang-baseline").url

        status = httpx.get(f"{router}/router/status").json()
        assert [b["url"] for b in status["pools"]["speculative"]["backends"]] == [spec]
        assert [b["url"] for b in status["pools"]["baseline"]["backends"]] == [base]
        wait_for(
            lambda: all(
                b["engine"] and b["engine"]["flavor"] == "sglang"
                for p in httpx.get(f"{router}/router/status").json()["pools"].values()
                for b in p["backends"]
            )
        )

        # A client speaks OpenAI to the router; both answers come from the engines.
        with OpenAI(base_url=f"{router}/v1", api_key="unused", max_retries=0) as client:
            assert [m.id for m in client.models.list()] == ["default"]
            whole = client.chat.completions.create(
                model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=8
            )
            assert whole.choices[0].message.content and whole.usage
            pieces = client.chat.completions.create(
                model="default",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=8,
                stream=True,
            )
            text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
            assert text

        # Past the crossover (7 per speculative engine), requests spill to the baseline.
        result = asyncio.run(drive(router, seconds=1.5, workers=12, trouble=False))
        assert set(result.codes) == {200}, result
        assert result.pools["speculative"] and result.pools["baseline"], result

        # The images' health checks work against these processes.
        checks = [(healthcheck_code(DOCKERFILE.read_text()), "127.0.0.1:8000", router)]
        compose = load_compose()
        for name in ("sim-eagle3", "sim-baseline"):
            test = compose["services"][name]["healthcheck"]["test"]
            assert test[:3] == ["CMD", "python", "-c"]
            checks.append((test[3], "127.0.0.1:30000", stack.procs[name].url))
        for code, address, url in checks:
            code = code.replace(address, url.removeprefix("http://"))
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=10)
            assert done.returncode == 0, (url, done.stderr)
