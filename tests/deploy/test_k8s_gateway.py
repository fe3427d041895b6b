"""deploy/k8s/gateway/: the EPP's Deployment, Service and ConfigMap against the Kubernetes
schemas that kubernetes-validate bundles (strict); the Gateway API and Inference Extension
kinds (Gateway, HTTPRoute, InferencePool) are CRDs with no schema in any PyPI package here, so
they are checked by hand against their v1 fields (InferencePool: the CRD
inference.networking.k8s.io_inferencepools.yaml of gateway-api-inference-extension)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.gateway.messages import EXT_PROC_SERVICE
from router.settings import CONFIG_ENV, load_settings
from tests.deploy.queries import DEPLOY

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
