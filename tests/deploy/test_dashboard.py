"""The Grafana dashboard and its provisioning: generated, well-formed, and naming real metrics."""

from __future__ import annotations

import re
from types import ModuleType

import yaml
from prometheus_client import CollectorRegistry

from router.sim.behaviour import behaviour
from router.sim.engine import Engine
from router.sim.exposition import SglangCollector, Topology
from router.sim.model import EAGLE3
from tests.deploy.queries import (
    DASHBOARD,
    DEPLOY,
    all_queries,
    dashboard,
    dashboard_panels,
    metric_names,
    recording_rules,
    variable_queries,
)
from tests.deploy.stack import load_compose
from tests.support.modules import load_script

GRAFANA = DEPLOY / "grafana"


def generator() -> ModuleType:
    return load_script(GRAFANA / "generate_dashboard.py")


def test_dashboard_json_is_what_the_generator_writes() -> None:
    assert DASHBOARD.read_text() == generator().render(), (
        "stale: run python deploy/grafana/generate_dashboard.py"
    )


def test_dashboard_structure() -> None:
    d = dashboard()
    assert d["uid"] == "spec-router"
    assert 36 <= d["schemaVersion"] <= 41
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"job", "instance", "engine_job"} <= set(variables)
    for name in ("job", "instance", "engine_job"):
        assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}

    panels = dashboard_panels()
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p.get("description"), f"{p['title']}: no description"
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"]
            assert t["expr"].strip()
            # Router panels follow $job/$instance; engine panels follow $engine_job.
            if "spec_router_" in t["expr"]:
                assert 'job=~"$job"' in t["expr"] and 'instance=~"$instance"' in t["expr"], t[
                    "expr"
                ]
            if "sglang:" in t["expr"]:
                assert 'job=~"$engine_job"' in t["expr"], t["expr"]
            if "rate(" in t["expr"] and not p["title"].endswith("(5m)"):
                assert "[$__rate_interval]" in t["expr"], t["expr"]


def test_dashboard_has_the_panels_the_issue_asks_for() -> None:
    titles = " | ".join(p["title"].lower() for p in dashboard_panels())
    for needed in (
        "requests/s by pool",
        "in flight by pool vs crossover",
        "share routed to speculative",
        "time to first token p50/p99 by pool",
        "time per output token p50/p99 by pool",
        "output tokens/s by pool",
        "acceptance length",
        "backend health",
        "upstream errors and retries",
        "routing reasons",
        "within the slo (5m)",  # the objective (issue 34)
        "within the slo by pool",
    ):
        assert needed in titles, needed


def exposed_names(registry: CollectorRegistry) -> set[str]:
    """Sample names a registry can expose, from its families' names and types."""
    suffixes = {
        "counter": ("_total",),
        "info": ("_info",),
        "histogram": ("_bucket", "_count", "_sum"),
        "gauge": ("",),
        "unknown": ("",),
    }
    return {
        family.name + suffix for family in registry.collect() for suffix in suffixes[family.type]
    }


def router_registry() -> CollectorRegistry:
    """The router's metrics as app.py registers them (no I/O: nothing is started)."""
    from router.app import RouterApp
    from router.settings import Settings

    settings = Settings(
        speculative_urls=["http://127.0.0.1:30001"],
        baseline_urls=["http://127.0.0.1:30002"],
        planner="advisory",  # (its gauges: the Fleet plan row, SpecRouterFleetOffPlan)
    )
    return RouterApp(settings).registry


def sim_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    engine = Engine(EAGLE3, every_step=False)
    engine.publish()  # the first report (after the warm-up): the gauges exist from here on
    registry.register(SglangCollector("default", [engine], behaviour("sglang"), Topology()))
    return registry


def test_every_metric_named_exists() -> None:
    """Each metric in the dashboard and the rules is exposed by the router or by the engines
    (the simulated engines expose SGLang's names), or is Prometheus' own ``up``, or is
    recorded by recording.yml."""
    router = exposed_names(router_registry())
    engines = exposed_names(sim_registry())
    assert any(n.startswith("spec_router_") for n in router)
    recorded = {r["record"] for r in recording_rules()}
    known = router | engines | recorded | {"up"}
    missing: dict[str, str] = {}
    for q in all_queries():
        for name in metric_names(q.expr) - known:
            missing.setdefault(name, q.source)
    for name, match, _ in variable_queries():
        for metric in metric_names(match) - known:
            missing.setdefault(metric, f"variable {name}")
    assert not missing, f"metrics nobody exposes: {missing}"
    # Engine panels use only SGLang's names, router panels only the router's.
    for q in all_queries():
        for name in metric_names(q.expr):
            if name.startswith("sglang:"):
                assert name in engines, (name, q.source)
            elif name.startswith("spec_router_"):
                assert name in router, (name, q.source)


def test_provisioning_matches_the_compose_stack() -> None:
    compose = load_compose()
    services = compose["services"]
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus"
    url = re.match(r"http://([^:/]+):(\d+)$", source["url"])
    assert url is not None, source["url"]
    host, port = url.groups()
    assert host in services and port == "9090"
    prom_yml = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert source["jsonData"]["timeInterval"] == prom_yml["global"]["scrape_interval"]

    boards = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "spec-router.yml").read_text()
    )
    (provider,) = boards["providers"]
    mounts = dict(v.split(":")[:2][::-1] for v in services["grafana"]["volumes"])
    # The provider reads the directory compose mounts deploy/grafana/dashboards on.
    assert mounts[provider["options"]["path"]] == "./grafana/dashboards"
    assert mounts["/etc/grafana/provisioning"] == "./grafana/provisioning"
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"
