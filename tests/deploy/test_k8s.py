"""deploy/k8s: schema validation where offline schemas exist, and how the pieces fit together.

Core kinds (Deployment, Service, ConfigMap, PodDisruptionBudget, PersistentVolumeClaim) are
validated, strictly (unknown fields rejected), against the Kubernetes JSON schemas that the
`kubernetes-validate` package bundles; the ConfigMaps are the ones kustomize's
configMapGenerator makes (read here from the kustomization, as kustomize reads it). The
ServiceMonitor, PodMonitor and PrometheusRule are Prometheus Operator CRDs, and the
Kustomization is kustomize's own: no offline schema ships for them here, so their structure is
checked by hand below. Where kubectl is installed, ``kubectl kustomize`` renders the whole
thing, and a change of the router's settings is shown to roll its pods.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from router.decide import table as tables
from router.serving import uvicorn_config
from router.settings import CONFIG_ENV, load_settings
from tests.deploy.queries import DEPLOY

K8S = DEPLOY / "k8s"
KUBERNETES_VERSION = "1.30"
CORE_KINDS = {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "PersistentVolumeClaim"}
POOLS = {"speculative": "sglang-eagle3", "baseline": "sglang-baseline"}
# SGLang's load of a large model (~510-550 s measured): the startup probe must outlast it
ENGINE_LOAD_S = 600


def kustomization() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return doc


def generated() -> list[dict[str, Any]]:
    """The ConfigMaps of the configMapGenerator, as kustomize makes them (before it adds a
    hash of their content to the name)."""
    docs = []
    for gen in kustomization()["configMapGenerator"]:
        data = {}
        for entry in gen["files"]:
            key, _, path = entry.partition("=")
            data[key] = (K8S / (path or key)).read_text()
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": gen["name"], "labels": gen["options"]["labels"]},
                "data": data,
            }
        )
    return docs


def manifests() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs + generated()


def one(kind: str, name: str = "spec-router") -> dict[str, Any]:
    (doc,) = [d for d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def container(name: str = "spec-router") -> dict[str, Any]:
    c: dict[str, Any]
    (c,) = one("Deployment", name)["spec"]["template"]["spec"]["containers"]
    return c


def volume(deployment: dict[str, Any], mount: dict[str, Any]) -> dict[str, Any]:
    v: dict[str, Any]
    (v,) = [
        v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    ]
    return v


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
    k = kustomization()
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert k["kind"] == "Kustomization"
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(k["resources"]) == files
    # every other file is a generator's input, and every input is there
    inputs = {e.partition("=")[2] for g in k["configMapGenerator"] for e in g["files"]}
    inputs_found = {
        p.name for p in K8S.iterdir() if p.is_file()
    }  # (gateway/ is its own kustomization)
    assert inputs == inputs_found - files - {"kustomization.yaml"}


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


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_selectors_and_ports_line_up() -> None:
    deployment, service, pdb = one("Deployment"), one("Service"), one("PodDisruptionBudget")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    assert selects(service["spec"]["selector"], pod_labels)
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in container()["ports"]}
    # The Operator names the job after the Service; alerts.yml expects job="spec-router".
    assert service["metadata"]["name"] == "spec-router"


def test_engine_pools_are_headless_services_of_gpu_deployments() -> None:
    for pool, name in POOLS.items():
        service, deployment = one("Service", name), one("Deployment", name)
        spec = deployment["spec"]["template"]["spec"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["pool"] == pool and labels["app.kubernetes.io/name"] == "sglang"
        # headless, publishing ready pods only: one A record per engine that can serve
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["publishNotReadyAddresses"] is False
        assert selects(service["spec"]["selector"], labels)
        assert selects(deployment["spec"]["selector"]["matchLabels"], labels)
        # the other pool's Service does not select these pods
        other = one("Service", POOLS["baseline" if pool == "speculative" else "speculative"])
        assert not selects(other["spec"]["selector"], labels)
        (port,) = service["spec"]["ports"]
        c = container(name)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports[port["targetPort"]] == port["port"] == 30000
        command = c["command"]
        assert command[:3] == ["python3", "-m", "sglang.launch_server"]
        assert command[command.index("--port") + 1] == "30000"
        assert "--enable-metrics" in command
        speculative = "--speculative-algorithm" in command
        assert speculative == (pool == "speculative")
        if speculative:
            assert command[command.index("--speculative-algorithm") + 1] == "EAGLE3"
        env = {e["name"] for e in c["env"]}
        assert {v[2:-1] for v in command if v.startswith("$(")} <= env  # (every $(VAR) is set)
        # a ten-minute load fits in the startup probe before liveness may kill it
        startup = c["startupProbe"]
        window = (
            startup.get("initialDelaySeconds", 0)
            + startup["periodSeconds"] * startup["failureThreshold"]
        )
        assert window >= ENGINE_LOAD_S
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"] == {"path": "/ready", "port": "http"}
        # one GPU each (extended resources: requests equal limits)
        assert c["resources"]["requests"]["nvidia.com/gpu"] == "1"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        shm = volume(deployment, mounts["/dev/shm"])
        assert shm["emptyDir"]["medium"] == "Memory"
        cache = volume(deployment, mounts["/models"])
        claim = one("PersistentVolumeClaim", cache["persistentVolumeClaim"]["claimName"])
        assert "ReadWriteMany" in claim["spec"]["accessModes"]
        assert {e["name"]: e.get("value") for e in c["env"]}["HF_HOME"] == "/models"
        assert spec["terminationGracePeriodSeconds"] > 0


def test_monitors() -> None:
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
    assert selects(router["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    (endpoint,) = router["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    engines = one("PodMonitor", "sglang")
    assert engines["apiVersion"] == "monitoring.coreos.com/v1"
    spec = engines["spec"]
    assert set(spec) <= {
        "selector",
        "podMetricsEndpoints",
        "jobLabel",
        "podTargetLabels",
        "namespaceSelector",
    }
    endpoints = [*router["spec"]["endpoints"], *spec["podMetricsEndpoints"]]
    for e in endpoints:
        assert set(e) <= {"port", "path", "interval", "scrapeTimeout"}
        assert e["interval"].endswith("s") and e["scrapeTimeout"].endswith("s")
        assert float(e["scrapeTimeout"][:-1]) <= float(e["interval"][:-1])
    # one target per engine pod of both pools, labelled like the compose stack's prometheus.yml
    # (job sglang, with the pool), which the alerts and the dashboard expect
    assert spec["podTargetLabels"] == ["pool"]
    for name in POOLS.values():
        deployment = one("Deployment", name)
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selects(spec["selector"]["matchLabels"], labels)
        assert labels[spec["jobLabel"]] == "sglang"
        (e,) = spec["podMetricsEndpoints"]
        assert e["port"] in {p["name"] for p in container(name)["ports"]}
        assert e["path"] == "/metrics"
    assert not selects(spec["selector"]["matchLabels"], service["metadata"]["labels"])


def test_config_map_is_a_valid_router_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = container()
    env = {e["name"]: e for e in c["env"]}
    path = Path(env[CONFIG_ENV]["value"])
    (mount,) = [m for m in c["volumeMounts"] if Path(m["mountPath"]) == path.parent]
    config_map = one("ConfigMap", volume(one("Deployment"), mount)["configMap"]["name"])
    toml = config_map["data"][path.name]
    # Secrets come from an optional Secret, never from the ConfigMap.
    for name in ("SPEC_ROUTER_API_KEYS", "SPEC_ROUTER_ADMIN_TOKEN"):
        assert env[name]["valueFrom"]["secretKeyRef"]["optional"] is True

    (tmp_path / path.name).write_text(toml)
    for key in [k for k in os.environ if k.startswith("SPEC_ROUTER_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / path.name))
    settings = load_settings()
    # each pool is discovered from its engines' headless Service, at the Service's port
    assert settings.discovery == "dns"
    for pool, urls in (
        ("speculative", settings.speculative_urls),
        ("baseline", settings.baseline_urls),
    ):
        (url,) = urls
        parts = urlsplit(url)
        service = one("Service", POOLS[pool])
        assert parts.hostname == service["metadata"]["name"]
        assert parts.port == service["spec"]["ports"][0]["port"]
    # short names: resolved through the pod's resolv.conf search domains (the system resolver)
    assert settings.dns_servers == []
    assert settings.discovery_interval <= 5.0  # (CoreDNS answers headless names with TTL 5)
    # Several pods (replicas > 1) need the engines' view of the load.
    if one("Deployment")["spec"]["replicas"] > 1:
        assert settings.load_signal in ("engine", "max")
    # The learned table is written to a writable volume, not into the read-only ConfigMap.
    assert settings.table_path is not None
    (state,) = [m for m in c["volumeMounts"] if Path(m["mountPath"]) == settings.table_path.parent]
    assert not state.get("readOnly")


def test_the_calibrated_table_is_where_each_pod_starts(tmp_path: Path) -> None:
    deployment = one("Deployment")
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    c = container()
    assert init["image"] == c["image"]
    # the init container copies the table ConfigMap's file into the state volume (not over a
    # table this pod already learned: -n) ...
    command = init["command"]
    assert command[:2] == ["cp", "-n"]
    source, target = Path(command[2]), Path(command[3])
    mounts = {m["name"]: m for m in init["volumeMounts"]}
    (table_mount,) = [m for m in mounts.values() if Path(m["mountPath"]) == source.parent]
    assert table_mount["readOnly"] is True
    config_map = one("ConfigMap", volume(deployment, table_mount)["configMap"]["name"])
    # ... where the router reads it from and writes what it learns
    (state_mount,) = [m for m in mounts.values() if Path(m["mountPath"]) == target.parent]
    assert not state_mount.get("readOnly")
    router_state = [m for m in c["volumeMounts"] if m["name"] == state_mount["name"]]
    assert router_state and router_state[0]["mountPath"] == state_mount["mountPath"]
    toml = one("ConfigMap")["data"]["config.toml"]
    assert f'table_path = "{target}"' in toml
    # and the file is a table the router accepts
    (tmp_path / "table.json").write_text(config_map["data"][source.name])
    table = tables.load(tmp_path / "table.json")
    assert table.source == "calibrated"


def kustomize(directory: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, check=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def config_names(docs: list[dict[str, Any]]) -> set[str]:
    (router,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "spec-router"
    ]
    return {
        v["configMap"]["name"]
        for v in router["spec"]["template"]["spec"]["volumes"]
        if "configMap" in v
    }


def test_a_change_of_the_router_settings_rolls_its_pods(tmp_path: Path) -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("needs kubectl (for `kubectl kustomize`)")
    docs = kustomize(K8S)
    made = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    names = config_names(docs)
    # the Deployment refers to the generated, hashed names
    assert names == made and all(
        n.startswith(("spec-router-", "spec-router-table-")) for n in names
    )
    copy_dir = tmp_path / "k8s"
    shutil.copytree(K8S, copy_dir)
    with (copy_dir / "router.toml").open("a") as f:
        f.write("drain_timeout = 120.0\n")
    changed = config_names(kustomize(copy_dir))
    # a new name for the settings (so a new pod template: a rollout); the table's stays
    assert len(changed - names) == 1 and len(names & changed) == 1
