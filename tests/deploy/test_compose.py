"""deploy/docker-compose.yml and deploy/Dockerfile: schema and structure (the `sim` profile run:
test_compose_e2e.py)."""

from __future__ import annotations

import copy
import json
import re
from importlib import resources
from typing import Any

import jsonschema
import pytest
import yaml

from router.serving import uvicorn_config
from tests.deploy.queries import DEPLOY, PROMETHEUS_YML, ROOT
from tests.deploy.stack import (
    COMPOSE,
    healthcheck_code,
    host_names,
    load_compose,
    services_in_profile,
)

DOCKERFILE = DEPLOY / "Dockerfile"
SPEC_FLAGS = {
    "--speculative-algorithm": "EAGLE3",
    "--speculative-num-steps": "3",
    "--speculative-eagle-topk": "1",
    "--speculative-num-draft-tokens": "4",
}


def compose_schema() -> dict[str, Any]:
    """The Compose Specification's JSON schema, as vendored by check-jsonschema."""
    pytest.importorskip("check_jsonschema", reason="needs check-jsonschema (dev extra)")
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    schema: dict[str, Any] = json.loads(vendor.joinpath("compose-spec.json").read_text())
    return schema


def option(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def test_compose_file_validates_against_the_compose_spec() -> None:
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    data = yaml.safe_load(COMPOSE.read_text())
    errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(data)]
    assert not errors, "\n".join(errors)
    # The schema has teeth: a misspelt key is rejected.
    broken = copy.deepcopy(data)
    broken["services"]["spec-router"]["enviroment"] = {}
    assert list(validator.iter_errors(broken))


def test_gpu_profile_runs_one_model_with_and_without_eagle3() -> None:
    gpu = services_in_profile(load_compose(), "gpu")
    spec, base = gpu["sglang-eagle3"]["command"], gpu["sglang-baseline"]["command"]
    for cmd in (spec, base):
        assert cmd[:3] == ["python3", "-m", "sglang.launch_server"]
        assert option(cmd, "--host") == "0.0.0.0"
        assert "--enable-metrics" in cmd  # the router's engine signals and the engine panels
        assert option(cmd, "--decode-log-interval") == "10"  # fresher load gauges than 40
    for flag in ("--model-path", "--served-model-name", "--tp", "--port"):
        assert option(spec, flag) == option(base, flag), flag
    for flag, value in SPEC_FLAGS.items():
        assert option(spec, flag) == value, flag
    assert option(spec, "--speculative-draft-model-path")
    assert not [a for a in base if a.startswith("--speculative")]
    for name in ("sglang-eagle3", "sglang-baseline"):
        # a cheap /health (no generation per probe), and a healthcheck on /ready
        assert gpu[name]["environment"]["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] == "0"
        assert "/ready" in " ".join(gpu[name]["healthcheck"]["test"])
        (device,) = gpu[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
    assert "sim-eagle3" not in gpu and "spec-router" in gpu


def test_both_profiles_answer_under_the_names_the_router_and_prometheus_use() -> None:
    compose = load_compose()
    router_env = compose["services"]["spec-router"]["environment"]
    wanted = {
        m.group(1) + ":" + m.group(2)
        for key in ("SPEC_ROUTER_SPECULATIVE_URLS", "SPEC_ROUTER_BASELINE_URLS")
        for m in re.finditer(r"http://([^:/,]+):(\d+)", router_env[key])
    }
    prom = yaml.safe_load(PROMETHEUS_YML.read_text())
    targets = {
        t for job in prom["scrape_configs"] for s in job["static_configs"] for t in s["targets"]
    }
    for profile in ("gpu", "sim"):
        provided = set()
        for name, svc in services_in_profile(compose, profile).items():
            port = option(svc.get("command") or [], "--port") or {
                "spec-router": "8000",
                "prometheus": "9090",
                "grafana": "3000",
            }.get(name)
            provided |= {f"{host}:{port}" for host in host_names(name, svc)}
        assert wanted <= provided, (profile, wanted - provided)
        assert targets <= provided, (profile, targets - provided)


def test_router_service_settings() -> None:
    router = load_compose()["services"]["spec-router"]
    assert router["command"] == ["spec-router", "serve", "--host", "0.0.0.0", "--port", "8000"]
    assert all(k.startswith("SPEC_ROUTER_") for k in router["environment"])
    grace = float(router["stop_grace_period"].removesuffix("s"))
    shutdown = uvicorn_config(None).timeout_graceful_shutdown
    assert shutdown is not None and grace > shutdown
    # The learned crossover table outlives the container: it is on a volume the image declares.
    table = router["environment"]["SPEC_ROUTER_TABLE_PATH"]
    targets = [v.split(":")[1] for v in router["volumes"]]
    assert any(table.startswith(t + "/") for t in targets)
    declared = re.findall(r"^VOLUME (\S+)$", DOCKERFILE.read_text(), re.M)
    assert any(table.startswith(t + "/") for t in declared)


def test_dockerfile() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    # the wheel, with the C relay (setup.py), is built in a stage with a compiler
    build = re.search(r"^FROM python:3\.11-slim AS (\w+)$(.*?)^FROM ", text, re.M | re.S)
    assert build
    steps = [line for line in build.group(2).splitlines() if not line.lstrip().startswith("#")]
    assert any("apt-get install" in line and "gcc" in line for line in steps)
    assert any("assert RELAY_BUILT" in line for line in steps)
    assert re.search(rf"^COPY --from={build.group(1)} /wheels /wheels$", text, re.M)
    # the wheel, with the extras named by --build-arg EXTRAS (none by default; epp for
    # deploy/k8s/gateway)
    assert re.search(
        r'^RUN pip install "\$\(echo /wheels/\*\.whl\)\$\{EXTRAS:\+\[\$EXTRAS\]\}"', text, re.M
    )
    assert re.search(r'^ARG EXTRAS=""$', text, re.M)
    user = re.findall(r"^USER (\S+)$", text, re.M)
    assert user and user[-1] not in ("root", "0"), "must run as a non-root user"
    cmd = re.search(r"^CMD (\[.*\])$", text, re.M)
    assert cmd and json.loads(cmd.group(1)) == [
        "spec-router", "serve", "--host", "0.0.0.0", "--port", "8000"
    ]  # fmt: skip
    assert "/health" in healthcheck_code(text)
    for src in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M):
        for path in src.split():
            assert (ROOT / path).exists(), f"COPY {path}: missing"
    # Every file the package needs is in the build context the .dockerignore leaves.
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text()
    for needed in ("!router/**", "!pyproject.toml", "!setup.py", "!README.md", "**/*.so"):
        assert needed in ignore
