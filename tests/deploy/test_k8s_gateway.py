"""deploy/k8s/gateway/: every manifest against a published schema where a package ships one.

- Deployment, Service, ConfigMap: the Kubernetes 1.30 schemas kubernetes-validate bundles
  (PyPI), strict (unknown fields refused).
- Gateway, HTTPRoute: the Gateway API's schemas, compiled into the npm package
  @kubernetes-models/gateway-api (scripts/ensure-gateway-api-models.sh installs it; run by the
  machine's node). Types, required fields, enums and patterns are checked; unknown fields are
  not (CRD schemas allow them: the API server prunes them), so the fields are also checked here.
- InferencePool: no package on PyPI or npm ships the Inference Extension's schema, so it is
  checked by hand against its v1 CRD (gateway-api-inference-extension,
  config/crd/bases/inference.networking.k8s.io_inferencepools.yaml).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.gateway.endpoints import EndpointError, check_configured
from router.gateway.messages import EXT_PROC_SERVICE
from router.origin import Origin
from router.pools import BASELINE, POOLS, SPECULATIVE, Pool
from router.settings import CONFIG_ENV, load_settings
from tests.deploy.queries import DEPLOY

ROOT = Path(__file__).resolve().parents[2]

GATEWAY = DEPLOY / "k8s" / "gateway"
KUBERNETES_VERSION = "1.30"
CORE_KINDS = {"Deployment", "Service", "ConfigMap"}


def manifests() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(GATEWAY.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in manifests() if d["kind"] == kind]


def test_core_kinds_validate_against_kubernetes_schemas() -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="needs kubernetes-validate (dev extra)")
    seen = set()
    for doc in manifests():
        if doc["kind"] in CORE_KINDS:
            kv.validate(doc, KUBERNETES_VERSION, strict=True)
            seen.add(doc["kind"])
    assert seen == CORE_KINDS


@functools.cache
def gateway_api_models() -> str:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ensure-gateway-api-models.sh")],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    return done.stdout.strip().splitlines()[-1]


def gateway_api_errors(docs: list[dict[str, Any]]) -> list[str | None]:
    """Each object's schema violations (None: valid), from the npm package's validators."""
    done = subprocess.run(
        ["node", str(Path(__file__).with_name("validate_gateway_api.mjs")), gateway_api_models()],
        input=json.dumps(docs), capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return [r["error"] for r in json.loads(done.stdout)]


def test_gateway_and_route_validate_against_the_gateway_api_schemas() -> None:
    docs = of_kind("Gateway") + of_kind("HTTPRoute")
    assert [d["kind"] for d in docs] == ["Gateway", "HTTPRoute"]
    assert gateway_api_errors(docs) == [None, None]
    # (so that the check can fail) a port that is not a number, a backend weight that is not
    # one, a timeout that is not a duration, a parent with no name
    gateway, route = json.loads(json.dumps(docs))
    gateway["spec"]["listeners"][0]["port"] = "80"
    wrong_weight, wrong_timeout, no_parent = (json.loads(json.dumps(route)) for _ in range(3))
    wrong_weight["spec"]["rules"][0]["backendRefs"][0]["weight"] = "one"
    wrong_timeout["spec"]["rules"][0]["timeouts"]["request"] = "forever"
    no_parent["spec"]["parentRefs"] = [{}]
    errors = gateway_api_errors([gateway, wrong_weight, wrong_timeout, no_parent])
    assert all(errors), errors
    assert "port" in str(errors[0]) and "weight" in str(errors[1])


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((GATEWAY / "kustomization.yaml").read_text())
    files = {p.name for p in GATEWAY.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_the_epp_listens_where_the_inference_pools_look() -> None:
    (deployment,) = of_kind("Deployment")
    (service,) = of_kind("Service")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    command = container["command"]
    assert command[:2] == ["spec-router", "epp"]
    assert command[command.index("--grpc-port") + 1] == str(ports["grpc"])
    assert command[command.index("--port") + 1] == str(ports["http"])
    assert container["readinessProbe"]["grpc"] == {
        "port": ports["grpc"],
        "service": EXT_PROC_SERVICE,
    }
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    grpc = next(p for p in service["spec"]["ports"] if p["targetPort"] == "grpc")
    assert grpc["appProtocol"] == "kubernetes.io/h2c"  # ext_proc is gRPC: HTTP/2
    pools = of_kind("InferencePool")
    assert len(pools) == 2
    for pool in pools:
        assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
        spec = pool["spec"]
        assert set(spec) <= {"selector", "targetPorts", "endpointPickerRef"}
        assert spec["selector"]["matchLabels"]
        assert len(spec["targetPorts"]) == 1 and 1 <= spec["targetPorts"][0]["number"] <= 65535
        ref = spec["endpointPickerRef"]
        assert set(ref) <= {"group", "kind", "name", "port", "failureMode"}
        assert ref["kind"] == "Service" and ref["name"] == service["metadata"]["name"]
        assert ref["port"] == {"number": grpc["port"]}
        assert ref["failureMode"] in {"FailOpen", "FailClose"}


def test_the_route_sends_the_api_to_both_pools_through_the_gateway() -> None:
    (gateway,) = of_kind("Gateway")
    (route,) = of_kind("HTTPRoute")
    for doc in (gateway, route):
        assert doc["apiVersion"] == "gateway.networking.k8s.io/v1"
    listeners = gateway["spec"]["listeners"]
    assert gateway["spec"]["gatewayClassName"] and listeners
    assert all({"name", "protocol", "port"} <= set(listener) for listener in listeners)
    (parent,) = route["spec"]["parentRefs"]
    assert parent["name"] == gateway["metadata"]["name"]
    (rule,) = route["spec"]["rules"]
    assert set(rule) <= {"matches", "backendRefs", "timeouts", "filters"}
    pools = {p["metadata"]["name"] for p in of_kind("InferencePool")}
    refs = rule["backendRefs"]
    assert {r["name"] for r in refs} == pools
    assert all(
        r["group"] == "inference.networking.k8s.io" and r["kind"] == "InferencePool" for r in refs
    )
    assert rule["timeouts"]["request"] == "0s"


def test_the_config_map_is_a_router_configuration_for_several_replicas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (config_map,) = of_kind("ConfigMap")
    (deployment,) = of_kind("Deployment")
    toml = config_map["data"]["config.toml"]
    tomllib.loads(toml)
    (tmp_path / "config.toml").write_text(toml)
    for key in [k for k in os.environ if k.startswith("SPEC_ROUTER_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "config.toml"))
    settings = load_settings()
    # ALS records may all reach one replica: several replicas route on the engines' gauges
    assert deployment["spec"]["replicas"] > 1 and settings.load_signal == "engine"
    assert not settings.speculative_model_map and not settings.baseline_model_map
    # the EPP starts on these names: it resolves them (as the EPP's start-up checks)
    urls: dict[Pool, list[str]] = {
        SPECULATIVE: settings.speculative_urls,
        BASELINE: settings.baseline_urls,
    }
    assert settings.discovery == "dns"
    check_configured(urls, settings.discovery)
    with pytest.raises(EndpointError, match="SPEC_ROUTER_DISCOVERY=dns"):
        check_configured(urls, "static")


def test_the_epp_and_the_gateway_see_the_same_engine_pods() -> None:
    """Each pool's URL names the headless Service of deploy/k8s/sglang-*.yaml whose pods its
    InferencePool selects, at the port the pool targets: the EPP names only pods the gateway
    routes to."""
    (config_map,) = of_kind("ConfigMap")
    config = tomllib.loads(config_map["data"]["config.toml"])["spec_router"]
    pools = {p["metadata"]["name"]: p["spec"] for p in of_kind("InferencePool")}
    engines = [
        d
        for name in ("sglang-eagle3.yaml", "sglang-baseline.yaml")
        for d in yaml.safe_load_all((DEPLOY / "k8s" / name).read_text())
        if d
    ]
    services = {d["metadata"]["name"]: d for d in engines if d["kind"] == "Service"}
    pods = [
        d["spec"]["template"]["metadata"]["labels"] for d in engines if d["kind"] == "Deployment"
    ]
    for pool in POOLS:
        (url,) = config[f"{pool}_urls"]
        origin = Origin.parse(url)
        service = services[origin.host]
        assert service["spec"]["clusterIP"] == "None"  # headless: one address per pod
        spec = pools[f"spec-router-{pool}"]
        assert spec["targetPorts"] == [{"number": origin.port}]
        assert [p["port"] for p in service["spec"]["ports"]] == [origin.port]

        def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
            return all(labels.get(k) == v for k, v in selector.items())

        by_service = [labels for labels in pods if selects(service["spec"]["selector"], labels)]
        by_pool = [labels for labels in pods if selects(spec["selector"]["matchLabels"], labels)]
        assert by_service == by_pool and len(by_pool) == 1
        assert by_pool[0]["pool"] == pool
