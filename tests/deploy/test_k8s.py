"""deploy/k8s: schema validation where offline schemas exist, and how the pieces fit together.

Core kinds (Deployment, Service, ConfigMap, PodDisruptionBudget) are validated, strictly
(unknown fields rejected), against the Kubernetes JSON schemas that the `kubernetes-validate`
package bundles. ServiceMonitor and PrometheusRule are Prometheus Operator CRDs, and the
Kustomization is kustomize's own: no offline schema ships for them here, so their structure is
checked by hand below.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.serving import uvicorn_config
from router.settings import CONFIG_ENV, load_settings
from tests.deploy.queries import DEPLOY

K8S = DEPLOY / "k8s"
KUBERNETES_VERSION = "1.30"
CORE_KINDS = {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget"}


def manifests() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def one(kind: str, name: str = "spec-router") -> dict[str, Any]:
    (doc,) = [d for d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def container() -> dict[str, Any]:
    c: dict[str, Any]
    (c,) = one("Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def test_core_manifests_validate_against_kubernetes_schemas() -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="needs kubernetes-validate (dev extra)")
    kinds = set()
    for doc in manifests():
        if doc["kind"] in CORE_KINDS:
            kv.validate(doc, KUBERNETES_VERSION, strict=True)
            kinds.add(doc["kind"])
    assert kinds == CORE_KINDS
    # Strict means strict: a misspelt field fails.
    broken = copy.deepcopy(one("Deployment"))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_probes_shutdown_and_resources() -> None:
    pod = one("Deployment")["spec"]["template"]["spec"]
    c = container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["command"] == [
        "spec-router",
        "serve",
        "--host",
        "0.0.0.0",
        "--port",
        str(ports["http"]),
    ]
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    # SIGKILL must come after the preStop pause and the router's own graceful shutdown.
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    window = uvicorn_config(None).timeout_graceful_shutdown
    assert window is not None
    assert pod["terminationGracePeriodSeconds"] > float(pre_stop[1]) + window
    assert {"cpu", "memory"} <= set(c["resources"]["requests"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True


def test_selectors_and_ports_line_up() -> None:
    deployment, service, pdb = one("Deployment"), one("Service"), one("PodDisruptionBudget")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]

    def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in selector.items())

    assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    assert selects(service["spec"]["selector"], pod_labels)
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in container()["ports"]}
    # The Operator names the job after the Service; alerts.yml expects job="spec-router".
    assert service["metadata"]["name"] == "spec-router"


def test_service_monitors() -> None:
    """Structural checks (no offline CRD schema): the fields the Operator needs, consistent."""
    service = one("Service")
    router = one("ServiceMonitor")
    assert router["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(router["spec"]) <= {
        "selector",
        "endpoints",
        "jobLabel",
        "targetLabels",
        "namespaceSelector",
    }
    assert all(
        service["metadata"]["labels"].get(k) == v
        for k, v in router["spec"]["selector"]["matchLabels"].items()
    )
    (endpoint,) = router["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    for m in (router, one("ServiceMonitor", "sglang")):
        for e in m["spec"]["endpoints"]:
            assert set(e) <= {"port", "path", "interval", "scrapeTimeout"}
            assert e["interval"].endswith("s") and e["scrapeTimeout"].endswith("s")
            assert float(e["scrapeTimeout"][:-1]) <= float(e["interval"][:-1])
    engines = one("ServiceMonitor", "sglang")["spec"]
    # Same job and pool labels as the compose stack's prometheus.yml gives the engines.
    assert engines["targetLabels"] == ["pool"]
    assert engines["jobLabel"] in engines["selector"]["matchLabels"]
    assert engines["selector"]["matchLabels"][engines["jobLabel"]] == "sglang"


def test_config_map_is_a_valid_router_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = container()
    env = {e["name"]: e for e in c["env"]}
    path = Path(env[CONFIG_ENV]["value"])
    (mount,) = [m for m in c["volumeMounts"] if Path(m["mountPath"]) == path.parent]
    (volume,) = [
        v
        for v in one("Deployment")["spec"]["template"]["spec"]["volumes"]
        if v["name"] == mount["name"]
    ]
    config_map = one("ConfigMap", volume["configMap"]["name"])
    toml = config_map["data"][path.name]
    # Secrets come from an optional Secret, never from the ConfigMap.
    for name in ("SPEC_ROUTER_API_KEYS", "SPEC_ROUTER_ADMIN_TOKEN"):
        assert env[name]["valueFrom"]["secretKeyRef"]["optional"] is True

    (tmp_path / path.name).write_text(toml)
    for key in [k for k in os.environ if k.startswith("SPEC_ROUTER_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / path.name))
    settings = load_settings()
    assert settings.speculative_urls == ["http://sglang-eagle3:30000"]
    assert settings.baseline_urls == ["http://sglang-baseline:30000"]
    # Several pods (replicas > 1) need the engines' view of the load.
    if one("Deployment")["spec"]["replicas"] > 1:
        assert settings.load_signal in ("engine", "max")
    # The learned table is written to a writable volume, not into the read-only ConfigMap.
    if settings.table_path is not None:
        (state,) = [
            m for m in c["volumeMounts"] if Path(m["mountPath"]) == settings.table_path.parent
        ]
        assert not state.get("readOnly")
