"""deploy/k8s/fleet: the planner's pod and the engine autoscalers, rendered and validated.

The two kustomize Components (``fleet/keda``, ``fleet/hpa``) are rendered on top of the base
twice: by hand here (the base's manifests, the Components' resources, their JSON patches
applied as kustomize applies them), and with ``kubectl kustomize`` where kubectl is installed.
Each rendering is validated: core kinds (Deployment, PersistentVolumeClaim,
HorizontalPodAutoscaler) strictly against the Kubernetes schemas of ``kubernetes-validate``,
KEDA's ScaledObject strictly against its CRD's published schema (tests/deploy/schemas), and
how the pieces fit: one planner whose gauge each autoscaler reads for its own pool, followed
exactly (the HPA's replica arithmetic, below, with the manifests' tolerance).
"""

from __future__ import annotations

import copy
import math
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from router.settings import CONFIG_ENV, load_settings
from tests.deploy.test_k8s import K8S, POOLS, manifests, selects

FLEET = K8S / "fleet"
VARIANTS = ("keda", "hpa")
# HPA tolerance and the ScaledObject's behavior.tolerance exist from Kubernetes 1.33
KUBERNETES_VERSION = "1.33"
KEDA_SCHEMA = Path(__file__).with_name("schemas") / "keda-scaledobject-v1alpha1.yaml"
# The prometheus scaler's metadata keys (kedacore/keda pkg/scalers/prometheus_scaler.go)
PROMETHEUS_SCALER_KEYS = {
    "serverAddress", "query", "queryParameters", "threshold", "activationThreshold",
    "namespace", "customHeaders", "ignoreNullValues", "unsafeSsl", "awsRegion", "timeout",
    "identityOwner",
}  # fmt: skip
RENDERINGS = ("by hand", "kubectl")


def component(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((FLEET / name / "kustomization.yaml").read_text())
    assert doc["apiVersion"] == "kustomize.config.k8s.io/v1alpha1" and doc["kind"] == "Component"
    return doc


def pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]


def apply_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    """The JSON patch operations the Components use (add, remove)."""
    for op in ops:
        *parents, last = pointer(op["path"])
        node: Any = doc
        for key in parents:
            node = node[key]
        if op["op"] == "add":
            node[last] = op["value"]
        elif op["op"] == "remove":
            del node[last]
        else:
            raise AssertionError(f"unexpected patch op {op['op']}")


def by_hand(variant: str) -> list[dict[str, Any]]:
    docs = copy.deepcopy(manifests())
    patches: list[dict[str, Any]] = []
    names = [variant]
    while names:  # (a Component's Components first)
        name = names.pop()
        comp = component(name)
        for resource in comp.get("resources", []):
            docs += [d for d in yaml.safe_load_all((FLEET / name / resource).read_text()) if d]
        patches += comp.get("patches", [])
        names += [str(Path(c).name) for c in comp.get("components", [])]
    for patch in patches:
        target = patch["target"]
        for doc in docs:
            if doc["kind"] == target["kind"] and re.fullmatch(
                target["name"], doc["metadata"]["name"]
            ):
                apply_patch(doc, yaml.safe_load(patch["patch"]))
    return docs


def with_kubectl(variant: str, tmp: Path) -> list[dict[str, Any]]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: only the rendering by hand is checked")
    base = os.path.relpath(K8S, tmp)
    (tmp / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [base],
                "components": [f"{base}/fleet/{variant}"],
            }
        )
    )
    out = subprocess.run(
        ["kubectl", "kustomize", str(tmp)], capture_output=True, text=True, check=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(params=[(v, r) for v in VARIANTS for r in RENDERINGS], ids=lambda p: "-".join(p))
def rendered(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, list[dict[str, Any]]]:
    variant, how = request.param
    return variant, by_hand(variant) if how == "by hand" else with_kubectl(variant, tmp_path)


def the(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def strict(schema: Any) -> Any:
    """A CRD schema as the API server's pruning treats it: an object's unknown fields are
    refused here (the server would drop them silently: a misspelt field must fail a test)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if (
            out.get("type") == "object"
            and "properties" in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
            and "additionalProperties" not in out
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def keda_errors(doc: dict[str, Any]) -> list[str]:
    jsonschema = pytest.importorskip("jsonschema")
    schema = strict(yaml.safe_load(KEDA_SCHEMA.read_text()))
    validator = jsonschema.Draft7Validator(schema)
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(doc)]


def test_the_manifests_validate_against_their_schemas(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="needs kubernetes-validate (dev extra)")
    variant, docs = rendered
    scalers = []
    for doc in docs:
        if doc["kind"] in {"Deployment", "PersistentVolumeClaim", "HorizontalPodAutoscaler"}:
            kv.validate(doc, KUBERNETES_VERSION, strict=True)
        if doc["kind"] == "ScaledObject":
            assert doc["apiVersion"] == "keda.sh/v1alpha1"
            assert keda_errors(doc) == [], doc["metadata"]["name"]
            (trigger,) = doc["spec"]["triggers"]
            assert set(trigger["metadata"]) <= PROMETHEUS_SCALER_KEYS
            assert all(isinstance(v, str) for v in trigger["metadata"].values())
        if doc["kind"] in {"ScaledObject", "HorizontalPodAutoscaler"}:
            scalers.append(doc["kind"])
    assert scalers == 2 * ["ScaledObject" if variant == "keda" else "HorizontalPodAutoscaler"]
    # strict means strict, for the CRD too
    broken = copy.deepcopy(the(docs, "Deployment", "spec-router-planner"))
    broken["spec"]["template"]["spec"]["containers"][0]["envv"] = []
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, KUBERNETES_VERSION, strict=True)
    if variant == "keda":
        so = copy.deepcopy(the(docs, "ScaledObject", "sglang-eagle3"))
        so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"][
            "stabilisationWindowSeconds"
        ] = 0
        so["spec"]["minReplicaCount"] = -1
        assert len(keda_errors(so)) == 2


def planner_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    (c,) = the(docs, "Deployment", "spec-router-planner")["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in c["env"] if "value" in e}


def test_one_planner_among_the_routers_and_the_engines_left_to_the_autoscaler(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = rendered
    router, planner = (
        the(docs, "Deployment", "spec-router"),
        the(docs, "Deployment", "spec-router-planner"),
    )
    service = the(docs, "Service", "spec-router")
    pdb = the(docs, "PodDisruptionBudget", "spec-router")
    r_pods = router["spec"]["template"]["metadata"]["labels"]
    p_pods = planner["spec"]["template"]["metadata"]["labels"]
    # each Deployment selects its own pods only; the Service and the PDB take both
    assert selects(router["spec"]["selector"]["matchLabels"], r_pods)
    assert selects(planner["spec"]["selector"]["matchLabels"], p_pods)
    assert not selects(router["spec"]["selector"]["matchLabels"], p_pods)
    assert not selects(planner["spec"]["selector"]["matchLabels"], r_pods)
    for selector in (service["spec"]["selector"], pdb["spec"]["selector"]["matchLabels"]):
        assert selects(selector, r_pods) and selects(selector, p_pods)
    # one planner, never two at once
    assert planner["spec"]["replicas"] == 1
    assert planner["spec"]["strategy"] == {"type": "Recreate"}
    # the same router otherwise: image, command, config, table
    rs, ps = router["spec"]["template"]["spec"], planner["spec"]["template"]["spec"]
    (rc,), (pc,) = rs["containers"], ps["containers"]
    for key in ("image", "command", "ports", "readinessProbe", "livenessProbe"):
        assert rc[key] == pc[key], key
    assert rs["initContainers"] == ps["initContainers"]
    volumes = {v["name"]: v for v in ps["volumes"]}
    assert [v for v in rs["volumes"]] == [volumes[v["name"]] for v in rs["volumes"]]
    # the forecast's state on a claim of its own, where the setting says
    env = planner_env(docs)
    state = Path(env["SPEC_ROUTER_PLAN_STATE_PATH"])
    (mount,) = [m for m in pc["volumeMounts"] if Path(m["mountPath"]) == state.parent]
    claim = volumes[mount["name"]]["persistentVolumeClaim"]["claimName"]
    assert the(docs, "PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteOnce"]
    # the router pods do not plan (the router.toml leaves it off)
    assert all(e["name"] != "SPEC_ROUTER_PLANNER" for e in rc["env"])
    # the autoscalers own the engines' replicas
    for name in POOLS.values():
        assert "replicas" not in the(docs, "Deployment", name)["spec"]


def test_the_planner_settings_load_and_match_the_autoscalers(
    rendered: tuple[str, list[dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    variant, docs = rendered
    env = planner_env(docs)
    config = next(
        d for d in docs if d["kind"] == "ConfigMap" and "config.toml" in d.get("data", {})
    )
    (tmp_path / "config.toml").write_text(config["data"]["config.toml"])
    for key in [k for k in os.environ if k.startswith("SPEC_ROUTER_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "config.toml"))
    settings = load_settings()
    assert settings.planner == "autoscale"
    assert settings.discovery == "dns"  # (the fleet size comes from the members)
    assert settings.gpu_budget is not None
    # the router pods' configuration leaves the planner off
    monkeypatch.delenv("SPEC_ROUTER_PLANNER")
    assert load_settings().planner == "off"
    for pool, deployment in POOLS.items():
        if variant == "keda":
            so = the(docs, "ScaledObject", deployment)
            spec = so["spec"]
            assert spec["scaleTargetRef"] == {
                "apiVersion": "apps/v1", "kind": "Deployment", "name": deployment
            }  # fmt: skip
            (trigger,) = spec["triggers"]
            meta = trigger["metadata"]
            assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
            assert meta["query"] == f'max(spec_router_plan_desired_engines{{pool="{pool}"}})'
            assert (meta["threshold"], meta["activationThreshold"]) == ("1", "0")
            assert meta["ignoreNullValues"] == "false"  # (no series: hold, never empty a pool)
            assert (spec["minReplicaCount"], spec["cooldownPeriod"]) == (0, 0)
            assert spec["maxReplicaCount"] == settings.gpu_budget
            assert "fallback" not in spec  # (a fallback would scale to a fixed count)
            behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        else:
            hpa = the(docs, "HorizontalPodAutoscaler", deployment)
            spec = hpa["spec"]
            assert spec["scaleTargetRef"]["name"] == deployment
            (metric,) = spec["metrics"]
            assert metric["external"]["metric"] == {
                "name": "spec_router_plan_desired_engines",
                "selector": {"matchLabels": {"pool": pool}},
            }
            assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
            assert (spec["minReplicas"], spec["maxReplicas"]) == (0, settings.gpu_budget)
            behavior = spec["behavior"]
        for direction in ("scaleUp", "scaleDown"):
            rules = behavior[direction]
            assert rules["stabilizationWindowSeconds"] == 0 and rules["tolerance"] == 0
            assert all(p["value"] >= settings.gpu_budget for p in rules["policies"])
            assert follows_exactly(settings.gpu_budget, rules["tolerance"])
    # (the default tolerance would not: a pool of ten going to nine stays at ten)
    assert not follows_exactly(12, 0.1)


def hpa_replicas(current: int, value: float, target: float, tolerance: float) -> int:
    """The HPA's replica count for an external metric with an AverageValue target
    (kubernetes pkg/controller/podautoscaler/replica_calculator.go,
    GetExternalPerPodMetricReplicas): no change within the tolerance of the ratio."""
    if current == 0:
        return math.ceil(value / target)
    ratio = value / (target * current)
    if abs(1.0 - ratio) <= tolerance:
        return current
    return math.ceil(value / target)


def follows_exactly(budget: int, tolerance: float) -> bool:
    """Every step the planner can ask (any count to any other within the budget) is taken."""
    return all(
        hpa_replicas(current, float(value), 1.0, tolerance) == value
        for current in range(budget + 1)
        for value in range(budget + 1)
    )


def test_the_adapter_rule_serves_the_metric_the_hpas_ask_for() -> None:
    values = yaml.safe_load((FLEET / "hpa" / "prometheus-adapter-values.yaml").read_text())
    (rule,) = values["rules"]["external"]
    assert values["rules"]["default"] is False
    assert rule["name"]["as"] == "spec_router_plan_desired_engines"
    assert "spec_router_plan_desired_engines{" in rule["seriesQuery"]
    assert rule["resources"]["overrides"]["namespace"]["resource"] == "namespace"
    assert rule["metricsQuery"] == "max by (pool) (<<.Series>>{<<.LabelMatchers>>})"
