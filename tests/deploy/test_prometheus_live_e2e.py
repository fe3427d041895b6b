"""A real Prometheus scrapes the compose `sim` stack under load; every query gets data.

What "gets data" means, per kind of expression (all evaluated as instant queries at "now",
after a ~6 s load, with Grafana's variables as in ``queries.VARIABLES``):

- dashboard targets: at least one sample with a finite value (a quantile over an empty
  window is NaN and does not count); a query grouped ``by (pool, ...)`` must show both pools,
  except for errors and retries, which land on whichever pool the failure happened in;
- template variables (``label_values``): at least one value;
- recording rules: the expression returns samples, and so does the recorded series;
- alert rules: a firing condition is not the normal state, so each operand of the condition
  (the sides of its comparisons and ``and``/``unless``; an ``offset`` is dropped, since the
  test has no past) must return samples, and every rule's
  last evaluation is healthy. Then the second test breaks the stack step by step and checks
  that each alert goes pending (``for`` is minutes long; pending proves the expression
  matches). SpecRouterSpecAcceptLengthDropped needs an hour of history and is covered by the
  promtool unit tests (test_rules.py).

The two tests share one stack and run in file order: the second one stops its processes.
The router runs with test-only settings (``ROUTER_OVERLAY``) so that a failure is noticed in
a fraction of a second rather than in several.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from router.decide import table as tables
from tests.deploy import prometheus as prom_mod
from tests.deploy.load import drive
from tests.deploy.prometheus import Prometheus, finite, local_config
from tests.deploy.queries import (
    alert_rules,
    dashboard_queries,
    operands,
    recording_rules,
    variable_queries,
)
from tests.deploy.stack import Stack, start_sim_profile
from tests.support.http import router_ready, wait_for
from tests.support.tables import model_table

_MISSING = prom_mod.missing_reason("prometheus")
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")

COMPOSE_VARIABLES = {"SIM_TIME_SCALE": "0.5"}
ROUTER_OVERLAY = {
    "SPEC_ROUTER_HEALTH_INTERVAL": "0.2",
    "SPEC_ROUTER_EJECT_BASE": "0.1",
    "SPEC_ROUTER_EJECT_MAX": "0.5",
    "SPEC_ROUTER_LOG_LEVEL": "warning",
    # the planner (advisory in the stack) plans every 1.2 s, so its Fleet plan row has data
    "SPEC_ROUTER_PLAN_TIME_SCALE": "0.02",
    # ... on the lengths of its first five requests (PLAN_MIN_REQUESTS' 50 may not all have
    # ended when the queries run)
    "SPEC_ROUTER_PLAN_MIN_REQUESTS": "5",
}
# Errors and retries are labelled with the pool where they happened: one pool may have none.
ONE_POOL_OK = ("spec_router_upstream_errors_total", "spec_router_retries_total")
POOLS = {"speculative", "baseline"}

# Alerts made to go pending: in test 1 (errors) and test 2 (breaking the stack).
INDUCED = {
    "SpecRouterHighErrorRatio",
    "SpecRouterSpecAcceptLengthLow",
    "SpecRouterPoolDown",
    "SGLangTargetDown",
    "SpecRouterNoUsablePool",
    "SpecRouterDown",
}
NOT_INDUCED = {
    "SpecRouterSpecAcceptLengthDropped": "compares with the previous hour: promtool unit tests",
    "SpecRouterFleetOffPlan": "30 minutes off the plan: promtool unit tests",
    "SpecRouterSLOMissed": "needs 10 minutes of traffic below the SLO: promtool unit tests",
}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, Stack]]:
    # the planner's curves: a table of the sims' model at the stack's time scale (the stack
    # itself starts from none and learns)
    table = tmp_path_factory.mktemp("table") / "table.json"
    tables.save(model_table(256, 64, time_scale=float(COMPOSE_VARIABLES["SIM_TIME_SCALE"])), table)
    overlay = {**ROUTER_OVERLAY, "SPEC_ROUTER_TABLE_PATH": str(table)}
    with start_sim_profile(COMPOSE_VARIABLES, overlay) as stack:
        workdir: Path = tmp_path_factory.mktemp("prometheus")
        with prom_mod.running(local_config(stack.addresses), workdir) as prom:
            wait_for(lambda: router_ready(stack.router.url))
            wait_for(lambda: all(t["health"] == "up" for t in prom.targets()), timeout=15)
            yield prom, stack


def poll(check: Callable[[], list[str]], timeout: float) -> list[str]:
    """Run ``check`` until it reports no problem or time runs out; return the last problems."""
    deadline = time.monotonic() + timeout
    while True:
        problems = check()
        if not problems or time.monotonic() > deadline:
            return problems
        time.sleep(0.25)


def active(prom: Prometheus, name: str, **labels: str) -> bool:
    return any(
        a["labels"].get("alertname") == name
        and all(a["labels"].get(k) == v for k, v in labels.items())
        for a in prom.alerts()
    )


def query_problems(prom: Prometheus) -> list[str]:
    problems = []
    for q in dashboard_queries():
        samples = prom.query(q.expr)
        if not finite(samples):
            problems.append(f"{q.source}: no finite sample: {q.expr}")
            continue
        if "by (pool" in q.expr and not any(m in q.expr for m in ONE_POOL_OK):
            seen = {s["metric"].get("pool") for s in samples}
            if not POOLS <= seen:
                problems.append(f"{q.source}: pools {sorted(map(str, seen))}: {q.expr}")
    for name, match, label in variable_queries():
        if not prom.label_values(label, match):
            problems.append(f"variable {name}: no values for label_values({match}, {label})")
    for rule in recording_rules():
        if not prom.query(rule["expr"]):
            problems.append(f"record {rule['record']}: expression returns nothing")
        if not prom.query(rule["record"]):
            problems.append(f"record {rule['record']}: recorded series missing")
    for rule in alert_rules():
        for operand in operands(rule["expr"]):
            # The test has no past to look at: an `offset` operand is checked at "now".
            operand = re.sub(r"\s+offset\s+\w+", "", operand)
            if not prom.query(operand):
                problems.append(f"alert {rule['alert']}: operand returns nothing: {operand}")
    for name, health in prom.rule_health().items():
        if health != "ok":
            problems.append(f"rule {name}: {health}")
    return problems


@pytest.mark.slow
def test_every_dashboard_and_rule_query_returns_data(live: tuple[Prometheus, Stack]) -> None:
    prom, stack = live
    # rate() sees only what a series gained after Prometheus first scraped it: let the error
    # series exist in a scrape before the measured load, or a scrape that times out under that
    # load can leave them with no increase to rate (and the error-ratio alert never pending)
    asyncio.run(drive(stack.router.url, seconds=1.0))
    wait_for(lambda: prom.query('spec_router_requests_total{code=~"5.."}'), timeout=15)
    result = asyncio.run(drive(stack.router.url, seconds=6.0))
    assert result.codes[200] > 50, result
    assert set(result.pools) >= POOLS, result
    # The load itself must be bad enough for the error-ratio alert (> 5% 5xx).
    assert result.server_errors / result.total > 0.05, result

    problems = poll(lambda: query_problems(prom), timeout=20)
    assert not problems, "\n".join(problems)
    wait_for(lambda: active(prom, "SpecRouterHighErrorRatio"), timeout=15)


def test_alerts_go_pending_when_the_stack_breaks(live: tuple[Prometheus, Stack]) -> None:
    prom, stack = live
    assert {r["alert"] for r in alert_rules()} == INDUCED | set(NOT_INDUCED)
    spec_url = stack.engine("sglang-eagle3").url
    base_url = stack.engine("sglang-baseline").url

    # The draft model stops being useful: the engine accepts one token per step (greedy and
    # sampled requests alike).
    collapse = {"tau": 1.0, "tau_sampling": 1.0}
    httpx.post(f"{spec_url}/sim/config", json=collapse).raise_for_status()
    asyncio.run(drive(stack.router.url, seconds=3.0, trouble=False))
    wait_for(
        lambda: active(prom, "SpecRouterSpecAcceptLengthLow", pool="speculative", backend=spec_url),
        timeout=15,
    )

    # The baseline engine dies: that pool is down, the router still serves from the other.
    wait_for(lambda: not active(prom, "SpecRouterPoolDown"), timeout=15)
    stack.stop("sim-baseline")
    wait_for(lambda: active(prom, "SpecRouterPoolDown", pool="baseline"), timeout=15)
    wait_for(lambda: active(prom, "SGLangTargetDown", pool="baseline"), timeout=15)
    assert not active(prom, "SpecRouterNoUsablePool")
    assert (
        httpx.get(f"{stack.router.url}/router/status").json()["pools"]["baseline"]["backends"][0][
            "url"
        ]
        == base_url
    )

    # And the speculative one: nothing left to route to.
    stack.stop("sim-eagle3")
    wait_for(lambda: active(prom, "SpecRouterNoUsablePool"), timeout=15)

    # The router itself goes away.
    stack.stop("spec-router")
    wait_for(lambda: active(prom, "SpecRouterDown"), timeout=15)
