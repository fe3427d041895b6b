"""The plan as Prometheus gauges, read from the published plan at scrape time.

``spec_router_plan_desired_engines{pool}`` is what an autoscaler follows (KEDA or an HPA,
``deploy/k8s/fleet``): under ``PLANNER=autoscale`` the plan's next step, sequenced so the two
pools never ask for more than the GPU budget; under ``advisory`` each pool as it runs, so that
an autoscaler installed beside an advisory planner moves nothing. The advice itself is
``spec_router_plan_advised_engines`` in both modes. The rest say why: the split the plan heads
for, the engines by state, the switch in flight, the next switch's expected gain and cost, the
rate and its forecast, the restart times in use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.pools import POOLS

STATES = ("up", "loading", "draining", "down")


class PlanCollector(Collector):
    """Gauges from ``document()`` (``FleetPlanner.document``: the leader's under --workers)."""

    def __init__(self, document: Callable[[], dict[str, Any]]) -> None:
        self.document = document

    def collect(self) -> Iterator[Metric]:
        doc = self.document()
        pools = ["pool"]

        def per_pool(name: str, help_: str, values: dict[str, int] | None) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, help_, labels=pools)
            for pool in POOLS:
                if values is not None and pool in values:
                    g.add_metric([pool], float(values[pool]))
            return g

        def scalar(
            kind: type[GaugeMetricFamily] | type[CounterMetricFamily],
            name: str,
            help_: str,
            value: float | None,
        ) -> Metric:
            m = kind(name, help_)
            if value is not None:
                m.add_metric([], float(value))
            return m

        yield per_pool(
            "spec_router_plan_desired_engines",
            "Engines each pool should run now: the plan's next step under "
            "PLANNER=autoscale, each pool as it runs under advisory (what autoscalers follow)",
            doc.get("desired_engines"),
        )
        yield per_pool(
            "spec_router_plan_advised_engines",
            "Engines each pool should run now by the plan (its next step, sequenced within "
            "the GPU budget), in either mode",
            doc.get("targets"),
        )
        yield per_pool(
            "spec_router_plan_goal_engines",
            "The split the plan's best schedule heads for (engines per pool)",
            doc.get("desired"),
        )
        yield per_pool(
            "spec_router_plan_running_engines",
            "Engines per pool that are up or loading, as the router's members show them",
            doc.get("running"),
        )
        yield scalar(
            GaugeMetricFamily,
            "spec_router_plan_off_plan_engines",
            "How far the pools are from the plan's next step: the sum over pools of "
            "|advised - running| engines (1 during a switch; the alert fires when it stays)",
            doc.get("off_plan_engines"),
        )
        by_state = GaugeMetricFamily(
            "spec_router_plan_engines",
            "Engines as the planner counts them, by the mode they serve or are heading for "
            "and their state (up, loading, draining, down)",
            labels=["pool", "state"],
        )
        fleet = doc.get("fleet")
        if fleet is not None:
            for pool in POOLS:
                for state in STATES:
                    n = sum(e["mode"] == pool and e["status"] == state for e in fleet)
                    by_state.add_metric([pool, state], float(n))
        yield by_state
        sw = doc.get("switch")
        yield scalar(
            GaugeMetricFamily,
            "spec_router_plan_switch_in_flight",
            "1 while a switch of an engine's mode is under way (draining, restarting or "
            "loading), else 0",
            None if "switch" not in doc else float(sw is not None and sw["phase"] != "advised"),
        )
        nxt = doc.get("next_switch")
        gain = GaugeMetricFamily(
            "spec_router_plan_expected_gain",
            "The next switch's expected gain over the planning horizon against staying put "
            "(share of the horizon's requests, objective of strict and relaxed goodput)",
        )
        cost = GaugeMetricFamily(
            "spec_router_plan_switch_cost",
            "What the next switch's restart costs against staying put (share of the "
            "horizon's requests)",
        )
        if nxt is not None:
            gain.add_metric([], float(nxt["gain"]))
            cost.add_metric([], float(nxt["cost"]))
        yield gain
        yield cost
        rate = GaugeMetricFamily(
            "spec_router_plan_arrival_rate",
            "Requests per second over the last planning interval (wall clock), as the "
            "planner counted them",
            labels=["source"],
        )
        traffic = doc.get("traffic")
        if traffic is not None:
            rate.add_metric([traffic["source"]], float(traffic["rate"]))
        yield rate
        fc = GaugeMetricFamily(
            "spec_router_plan_forecast_rate",
            "The forecast arrival rate one interval ahead, requests per second: the point "
            "and the upper band",
            labels=["band"],
        )
        forecast = doc.get("forecast")
        if forecast is not None:
            fc.add_metric(["point"], float(forecast["point"][0]))
            fc.add_metric(["upper"], float(forecast["upper"][0]))
        yield fc
        restart = GaugeMetricFamily(
            "spec_router_plan_restart_seconds",
            "Seconds an engine switching into this pool's mode is out of service, as the "
            "planner assumes it (observed, else RESTART_S)",
            labels=["pool", "source"],
        )
        for pool, r in (doc.get("restart_s") or {}).items():
            restart.add_metric([pool, r["source"]], float(r["seconds"]))
        yield restart
        yield scalar(
            CounterMetricFamily,
            "spec_router_plan_switches_advised",
            "Switches of an engine's mode the planner advised (one advice repeated over "
            "several plans counts once)",
            doc.get("switches_advised"),
        )
        yield scalar(
            GaugeMetricFamily,
            "spec_router_plan_stale",
            "1 while the plan shown is not this interval's (its worker process died or "
            "overran and is being started afresh), else 0",
            None if "stale" not in doc else float(bool(doc["stale"])),
        )
        yield scalar(
            GaugeMetricFamily,
            "spec_router_plan_seconds",
            "Wall seconds the last plan took, from its inputs to its outcome (in the planner's "
            "worker process)",
            doc.get("took_s"),
        )
        worker = doc.get("worker")
        yield scalar(
            CounterMetricFamily,
            "spec_router_plan_worker_restarts",
            "Times the planner's worker process was started again after it died or overran "
            "a plan's timeout (router.planning.worker)",
            None if worker is None else worker["restarts"],
        )
