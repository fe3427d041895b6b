"""The autoscalers' queries (deploy/k8s/fleet) against a real Prometheus scraping a real
router that plans: each returns exactly the planner's desired engines for its pool, and
nothing once the planner is gone (which KEDA, with ``ignoreNullValues: "false"``, and an HPA
treat as an error: they hold the pools as they are)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from router.decide import table as tables
from router.pools import BASELINE, SPECULATIVE
from tests.conftest import TIME_SCALE, RouterFactory
from tests.deploy import prometheus as prom_mod
from tests.deploy.test_k8s_fleet import FLEET
from tests.support.http import wait_for
from tests.support.processes import Proc
from tests.support.tables import model_table

_MISSING = prom_mod.missing_reason("prometheus")
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")
NAMESPACE = "inference"


def keda_queries() -> dict[str, str]:
    """pool -> the query of the ScaledObject scaling that pool's Deployment."""
    out = {}
    for doc in yaml.safe_load_all((FLEET / "keda" / "scaledobjects.yaml").read_text()):
        (trigger,) = doc["spec"]["triggers"]
        out[doc["metadata"]["labels"]["pool"]] = trigger["metadata"]["query"]
    return out


def adapter_query(pool: str) -> str:
    """The adapter's metricsQuery as it renders it for an HPA in NAMESPACE asking for
    spec_router_plan_desired_engines{pool=<pool>}."""
    values = yaml.safe_load((FLEET / "hpa" / "prometheus-adapter-values.yaml").read_text())
    (rule,) = values["rules"]["external"]
    series = rule["seriesQuery"].split("{")[0]
    matchers = f'pool="{pool}",namespace="{NAMESPACE}"'
    query: str = rule["metricsQuery"]
    return query.replace("<<.Series>>", series).replace("<<.LabelMatchers>>", matchers)


def test_the_autoscalers_queries_read_the_plans_next_step(
    start_router: RouterFactory, tmp_path: Path
) -> None:
    table = tmp_path / "table.json"
    tables.save(model_table(256, 32, time_scale=float(TIME_SCALE)), table)
    router: Proc = start_router(table_path=str(table), planner="autoscale",
                                plan_time_scale="0.02", gpu_budget="2")  # fmt: skip
    address = router.url.removeprefix("http://")
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "spec-router",
                # (the Operator labels every target with its namespace and pod)
                "static_configs": [
                    {"targets": [address], "labels": {"namespace": NAMESPACE, "pod": "p-0"}}
                ],
            }
        ],
    }
    plan = httpx.get(f"{router.url}/router/plan", timeout=5).json()
    want = plan["desired_engines"]
    assert want == {SPECULATIVE: 1, BASELINE: 1}
    (tmp_path / "prometheus").mkdir()
    with prom_mod.running(config, tmp_path / "prometheus") as prom:
        queries = keda_queries()
        assert set(queries) == {SPECULATIVE, BASELINE}
        for pool, query in queries.items():
            samples = wait_for(lambda q=query: prom.query(q), timeout=20)  # type: ignore[misc]
            # one series (KEDA refuses several), the plan's number
            (sample,) = samples
            assert float(sample["value"][1]) == want[pool]
            (by_adapter,) = prom.query(adapter_query(pool))
            assert by_adapter["metric"] == {"pool": pool}
            assert float(by_adapter["value"][1]) == want[pool]
        # another namespace's HPA sees nothing of this planner
        assert prom.query(adapter_query(SPECULATIVE).replace(NAMESPACE, "other")) == []
        # the planner gone: no series (an error for the autoscalers, not a zero)
        router.stop()
        for query in queries.values():
            wait_for(lambda q=query: prom.query(q) == [], timeout=20)  # type: ignore[misc]
