"""Write deploy/grafana/dashboards/spec-router.json, the spec-router Grafana dashboard.

The dashboard is generated so that its ~20 panels stay reviewable: each panel below is a title,
its PromQL and a one-line description; the JSON around them is Grafana's boilerplate.
tests/deploy checks that the committed JSON is what this script writes, that every query uses
only metrics the router or the engines expose, and that every query returns data from a real
Prometheus scraping a router and two simulated engines.

    python deploy/grafana/generate_dashboard.py          # rewrite the JSON
    python deploy/grafana/generate_dashboard.py --check  # exit 1 if it is stale

Conventions: `$job` and `$instance` select the router's scrape targets, `$engine_job` the
SGLang engines' (which carry a `pool` target label, see deploy/prometheus/prometheus.yml).
Panels use `$__rate_interval` so rates stay correct at any scrape interval.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards" / "spec-router.json"
UID = "spec-router"
DS = {"type": "prometheus", "uid": "${datasource}"}
R = 'job=~"$job", instance=~"$instance"'  # the router's targets
E = 'job=~"$engine_job"'  # the engines' targets
# SGLang's scheduler gauges: the total only (priority="" also matches a series without the
# label), one value over the TP/PP ranks that repeat a scheduler's (with
# --enable-metrics-for-all-schedulers), so that summing adds up schedulers (DP ranks) only
# (docs/engines.md, section 2).
E_TOTAL = E + ', priority=""'
RANKS = "tp_rank, pp_rank, moe_ep_rank"
SPEC_TOTAL = E_TOTAL + ', pool="speculative"'


def per_scheduler(metric: str, selector: str = E_TOTAL) -> str:
    return f"max without ({RANKS}) ({metric}{{{selector}}})"


RI = "$__rate_interval"

# Fixed colours per pool, so "speculative" is the same colour on every panel.
POOL_COLORS = {"speculative": "purple", "baseline": "blue", "none": "red"}


def rate(metric: str, selector: str = R) -> str:
    return f"rate({metric}{{{selector}}}[{RI}])"


def quantile(q: float, metric: str, by: str = "pool", selector: str = R) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) ({rate(metric + '_bucket', selector)}))"


def target(
    expr: str, legend: str = "", instant: bool = False, fmt: str = "time_series"
) -> dict[str, Any]:
    return {
        "datasource": DS,
        "editorMode": "code",
        "expr": expr,
        "legendFormat": legend or "__auto",
        "range": not instant,
        "instant": instant,
        "format": fmt,
    }


def pool_overrides() -> list[dict[str, Any]]:
    return [
        {
            "matcher": {"id": "byRegexp", "options": f"^{pool}( .*)?$"},
            "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": color}}],
        }
        for pool, color in POOL_COLORS.items()
    ]


def timeseries(
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    unit: str = "short",
    width: int = 8,
    height: int = 8,
    stack: bool = False,
    minmax: tuple[float | None, float | None] = (0, None),
    dashed: str | None = None,
) -> dict[str, Any]:
    overrides = pool_overrides()
    if dashed:
        # A reference line (the crossover): dashed, no fill, drawn in red.
        overrides.append(
            {
                "matcher": {"id": "byRegexp", "options": dashed},
                "properties": [
                    {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                    {"id": "custom.fillOpacity", "value": 0},
                    {"id": "custom.stacking", "value": {"mode": "none", "group": "A"}},
                    {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}},
                ],
            }
        )
    defaults: dict[str, Any] = {
        "unit": unit,
        "color": {"mode": "palette-classic"},
        "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10 if not stack else 30,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        },
    }
    if minmax[0] is not None:
        defaults["min"] = minmax[0]
    if minmax[1] is not None:
        defaults["max"] = minmax[1]
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": overrides},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "_size": (width, height),
    }


def stat(
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    width: int,
    unit: str = "short",
    text_mode: str = "value_and_name",
    mappings: list[dict[str, Any]] | None = None,
    thresholds: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "mappings": mappings or [],
                "color": {"mode": "thresholds"},
                "thresholds": {
                    "mode": "absolute",
                    "steps": thresholds or [{"color": "text", "value": None}],
                },
            },
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": text_mode,
            "colorMode": "background" if mappings else "none",
            "graphMode": "none",
            "justifyMode": "auto",
            "orientation": "auto",
        },
        "_size": (width, 4),
    }


USABLE_MAPPINGS = [
    {
        "type": "value",
        "options": {
            "0": {"text": "down", "color": "red", "index": 0},
            "1": {"text": "usable", "color": "green", "index": 1},
        },
    }
]
USABLE_THRESHOLDS: list[dict[str, Any]] = [
    {"color": "red", "value": None},
    {"color": "green", "value": 1},
]


def row(title: str) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_size": (24, 1)}


def panels() -> list[dict[str, Any]]:
    share = (
        f'sum(rate(spec_router_routing_decisions_total{{{R}, pool="speculative"}}[{RI}]))'
        f" / sum({rate('spec_router_routing_decisions_total')})"
    )
    requests = rate("spec_router_requests_total")
    errors = rate("spec_router_requests_total", R + ', code=~"5.."')
    return [
        row("Overview"),
        stat(
            "Pools usable",
            "Whether each pool has at least one backend that can take a request now "
            "(healthy and not ejected). Both down: every request gets 503.",
            [
                target(
                    f"max by (pool) (spec_router_backend_usable{{{R}}})", "{{pool}}", instant=True
                )
            ],
            width=6,
            mappings=USABLE_MAPPINGS,
            thresholds=USABLE_THRESHOLDS,
        ),
        stat(
            "Crossover",
            "Concurrent requests per speculative engine above which new requests go to the "
            "baseline pool.",
            [target(f"max(spec_router_crossover{{{R}}})", "crossover", instant=True)],
            width=4,
            text_mode="value",
        ),
        stat(
            "Speculative share (5m)",
            "Share of routing decisions that chose the speculative pool over the last 5 minutes.",
            [target(share.replace(RI, "5m"), "speculative", instant=True)],
            width=4,
            unit="percentunit",
            text_mode="value",
        ),
        stat(
            "Policy",
            "The routing policy and the load signal it compares with the crossover.",
            [
                target(
                    f"max by (policy, load_signal) (spec_router_policy_info{{{R}}})",
                    "{{policy}} (load: {{load_signal}})",
                    instant=True,
                )
            ],
            width=5,
            text_mode="name",
        ),
        stat(
            "Crossover source",
            "Where the crossover came from: default, configured (pinned by a setting or the "
            "admin API), calibrated (a table) or learned online.",
            [
                target(
                    f"max by (source) (spec_router_crossover_source_info{{{R}}})",
                    "{{source}}",
                    instant=True,
                )
            ],
            width=5,
            text_mode="name",
        ),
        row("Traffic"),
        timeseries(
            "Requests/s by pool",
            "Answered requests per second by the pool that served them ('none': the router "
            "answered itself, e.g. 503 with no usable backend).",
            [target(f"sum by (pool) ({requests})", "{{pool}}")],
            unit="reqps",
            stack=True,
        ),
        timeseries(
            "Share routed to speculative",
            "Fraction of routing decisions that chose the speculative pool. High at low load, "
            "falling as load passes the crossover.",
            [target(share, "speculative share")],
            unit="percentunit",
            minmax=(0, 1),
        ),
        timeseries(
            "Routing reasons",
            "Routing decisions per second by pool and reason: below_crossover, "
            "above_crossover, failover (the chosen pool had no usable backend), retry.",
            [
                target(
                    f"sum by (pool, reason) ({rate('spec_router_routing_decisions_total')})",
                    "{{pool}} {{reason}}",
                )
            ],
            unit="reqps",
            stack=True,
        ),
        timeseries(
            "In flight by pool vs crossover",
            "Requests in flight through the router, by pool, against the speculative pool's "
            "capacity before spilling over (crossover x usable speculative engines).",
            [
                target(f"sum by (pool) (spec_router_in_flight_requests{{{R}}})", "{{pool}}"),
                target(
                    f"max(spec_router_crossover{{{R}}}) * max(sum by (job, instance) "
                    f'(spec_router_backend_usable{{{R}, pool="speculative"}}))',
                    "speculative capacity (crossover x usable engines)",
                ),
            ],
            width=12,
            dashed="^speculative capacity.*",
        ),
        timeseries(
            "In flight per backend vs crossover",
            "Per engine: requests the router has in flight, and running/queued as the engine "
            "reports them, against the per-engine crossover.",
            [
                target(
                    f"sum by (pool, backend) (spec_router_backend_in_flight_requests{{{R}}})",
                    "{{pool}} {{backend}} in flight (router)",
                ),
                target(
                    f"max by (pool, backend) (spec_router_engine_running_requests{{{R}}})",
                    "{{pool}} {{backend}} running (engine)",
                ),
                target(
                    f"max by (pool, backend) (spec_router_engine_queued_requests{{{R}}})",
                    "{{pool}} {{backend}} queued (engine)",
                ),
                target(f"max(spec_router_crossover{{{R}}})", "crossover (per engine)"),
            ],
            width=12,
            dashed="^crossover.*",
        ),
        row("Latency"),
        timeseries(
            "Time to first token p50/p99 by pool",
            "Arrival at the router to the first response byte, by pool (successful requests).",
            [
                target(quantile(0.5, "spec_router_time_to_first_token_seconds"), "{{pool}} p50"),
                target(quantile(0.99, "spec_router_time_to_first_token_seconds"), "{{pool}} p99"),
            ],
            unit="s",
        ),
        timeseries(
            "Time per output token p50/p99 by pool",
            "Mean time between output tokens after the first, per streamed request, by pool.",
            [
                target(quantile(0.5, "spec_router_time_per_output_token_seconds"), "{{pool}} p50"),
                target(quantile(0.99, "spec_router_time_per_output_token_seconds"), "{{pool}} p99"),
            ],
            unit="s",
        ),
        timeseries(
            "Request duration p50/p99 by pool",
            "Arrival to last byte, by pool.",
            [
                target(quantile(0.5, "spec_router_request_duration_seconds"), "{{pool}} p50"),
                target(quantile(0.99, "spec_router_request_duration_seconds"), "{{pool}} p99"),
            ],
            unit="s",
        ),
        row("Throughput and speculation"),
        timeseries(
            "Output tokens/s by pool",
            "Generated tokens per second: counted by the router from the engines' usage, and "
            "as the engines count them (which includes traffic that bypasses this router).",
            [
                target(
                    f"sum by (pool) ({rate('spec_router_output_tokens_total')})",
                    "{{pool}} (router)",
                ),
                target(
                    f"sum by (pool) ({rate('sglang:generation_tokens_total', E)})",
                    "{{pool}} (engines)",
                ),
            ],
            unit="short",
        ),
        timeseries(
            "Speculative acceptance length",
            "Mean tokens accepted per speculative step (1 = nothing accepted; at most "
            "num-draft-tokens). As re-exported by the router, and from the engines directly.",
            [
                target(
                    "max by (backend) "
                    f'(spec_router_engine_spec_accept_length{{{R}, pool="speculative"}})',
                    "{{backend}} (router)",
                ),
                target(
                    # 0 until a rank's first 40-step decode window: no data, left out
                    "avg by (instance) "
                    f"({per_scheduler('sglang:spec_accept_length', SPEC_TOTAL)} > 0)",
                    "{{instance}} (engine)",
                ),
            ],
            minmax=(0, None),
        ),
        timeseries(
            "Prompt tokens/s by pool",
            "Prompt tokens per second, from the engines' usage.",
            [
                target(
                    f"sum by (pool) ({rate('spec_router_prompt_tokens_total')})",
                    "{{pool}}",
                )
            ],
        ),
        timeseries(
            "Engines: running and queued",
            "SGLang's own scheduler gauges by pool. A queue that grows while running stays "
            "flat means the engine is full (max running requests or KV cache).",
            [
                target(
                    f"sum by (pool) ({per_scheduler('sglang:num_running_reqs')})",
                    "{{pool}} running",
                ),
                target(
                    f"sum by (pool) ({per_scheduler('sglang:num_queue_reqs')})", "{{pool}} queued"
                ),
            ],
        ),
        timeseries(
            "Engines: generation throughput",
            "SGLang's gen_throughput gauge (tokens/s, as the engine logs it) by pool.",
            [target(f"sum by (pool) ({per_scheduler('sglang:gen_throughput')})", "{{pool}}")],
        ),
        timeseries(
            "Engines: TTFT and inter-token latency p99",
            "The engines' own latency histograms. Router TTFT minus engine TTFT is time spent "
            "in the router and on the network.",
            [
                target(
                    quantile(0.99, "sglang:time_to_first_token_seconds", selector=E),
                    "{{pool}} TTFT p99",
                ),
                target(
                    quantile(0.99, "sglang:inter_token_latency_seconds", selector=E),
                    "{{pool}} ITL p99",
                ),
            ],
            unit="s",
        ),
        row("Backend health"),
        timeseries(
            "Backend usable",
            "1 while the backend can take new requests (healthy and not ejected after a "
            "failure on real traffic), 0 otherwise.",
            [
                target(
                    f"max by (pool, backend) (spec_router_backend_usable{{{R}}})",
                    "{{pool}} {{backend}}",
                )
            ],
            width=12,
            minmax=(0, 1),
        ),
        {
            "type": "table",
            "title": "Backend health state",
            "description": "Each backend's current state: starting (not yet seen healthy), "
            "healthy or unhealthy.",
            "datasource": DS,
            "targets": [
                target(
                    f"max by (pool, backend, state) (spec_router_backend_health{{{R}}}) == 1",
                    instant=True,
                    fmt="table",
                )
            ],
            "fieldConfig": {"defaults": {}, "overrides": []},
            "options": {"showHeader": True, "cellHeight": "sm"},
            "transformations": [
                {
                    "id": "organize",
                    "options": {"excludeByName": {"Time": True, "Value": True}},
                }
            ],
            "_size": (12, 8),
        },
        row("Errors and retries"),
        timeseries(
            "5xx share by pool",
            "Share of answers with a 5xx status, by pool ('none': the router had no backend).",
            [
                target(
                    f"(sum by (pool) ({errors}) or sum by (pool) ({requests}) * 0)"
                    f" / sum by (pool) ({requests})",
                    "{{pool}}",
                )
            ],
            unit="percentunit",
            width=6,
        ),
        timeseries(
            "Responses by status code",
            "Answers per second by HTTP status (499: the client went away first).",
            [target(f"sum by (code) ({requests})", "{{code}}")],
            unit="reqps",
            width=6,
            stack=True,
        ),
        timeseries(
            "Upstream errors and retries",
            "Failures talking to a backend by kind (connect, reset, timeouts, status), and "
            "requests re-sent to another backend before any byte reached the client.",
            [
                target(
                    f"sum by (pool, kind) ({rate('spec_router_upstream_errors_total')})",
                    "error {{pool}} {{kind}}",
                ),
                target(
                    f"sum by (pool, kind) ({rate('spec_router_retries_total')})",
                    "retry {{pool}} {{kind}}",
                ),
            ],
            unit="reqps",
            width=6,
        ),
        timeseries(
            "Client disconnects",
            "Requests whose client went away before the end, by pool.",
            [
                target(
                    f"sum by (pool) ({rate('spec_router_client_disconnects_total')})",
                    "{{pool}}",
                )
            ],
            unit="reqps",
            width=6,
        ),
        row("Fleet plan"),
        timeseries(
            "Engines per pool: plan and fleet",
            "The fleet planner (PLANNER=advisory or autoscale; docs/fleet.md): the engines "
            "each pool runs (up or loading), the plan's next step (what autoscalers follow "
            "under autoscale) and where its best schedule over the horizon heads.",
            [
                target(
                    f"max by (pool) (spec_router_plan_running_engines{{{R}}})", "{{pool}} running"
                ),
                target(
                    f"max by (pool) (spec_router_plan_advised_engines{{{R}}})", "{{pool}} next step"
                ),
                target(
                    f"max by (pool) (spec_router_plan_goal_engines{{{R}}})", "{{pool}} heading for"
                ),
            ],  # fmt: skip
            width=12,
        ),
        timeseries(
            "Arrival rate and forecast",
            "Requests per second over the last planning interval, counted from the engines' "
            "own counters, and the forecast one interval ahead with its upper band (what the "
            "floor of a switch is held to).",
            [
                target(
                    f"max by (source) (spec_router_plan_arrival_rate{{{R}}})",
                    "arrivals ({{source}})",
                ),
                target(
                    f"max by (band) (spec_router_plan_forecast_rate{{{R}}})", "forecast {{band}}"
                ),
            ],  # fmt: skip
            unit="reqps",
            width=6,
        ),
        timeseries(
            "Switches: in flight and off plan",
            "1 while a switch of an engine's mode is under way; engines the pools are off the "
            "plan's next step (1 during a switch; the SpecRouterFleetOffPlan alert fires when "
            "it stays 30 minutes).",
            [
                target(f"max(spec_router_plan_switch_in_flight{{{R}}})", "switch in flight"),
                target(f"max(spec_router_plan_off_plan_engines{{{R}}})", "off plan"),
            ],
            width=6,
        ),
    ]


def layout(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Place panels left to right, wrapping at 24 columns; rows start a new line."""
    x = y = line_h = 0
    out = []
    for pid, panel in enumerate(items, start=1):
        w, h = panel.pop("_size")
        if panel["type"] == "row" or x + w > 24:
            y += line_h
            x = line_h = 0
        panel = {"id": pid, "gridPos": {"h": h, "w": w, "x": x, "y": y}, **panel}
        for ref, t in zip("ABCDEFGH", panel.get("targets", []), strict=False):
            t["refId"] = ref
        out.append(panel)
        x += w
        line_h = max(line_h, h)
        if panel["type"] == "row":
            y += h
            x = line_h = 0
    return out


def variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": {
            "qryType": 1,
            "query": query,
            "refId": "PrometheusVariableQueryEditor-VariableQuery",
        },
        "refresh": 2,
        "regex": "",
        "sort": 1,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "hide": 0,
        "options": [],
    }


def dashboard() -> dict[str, Any]:
    return {
        "uid": UID,
        "title": "spec-router",
        "description": "Routing between an EAGLE-3 speculative pool and a baseline pool by load.",
        "tags": ["spec-router", "llm", "sglang"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "timezone": "",
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "links": [],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                    "regex": "",
                    "options": [],
                },
                variable("job", "Router job", "label_values(spec_router_crossover, job)"),
                variable(
                    "instance",
                    "Router instance",
                    'label_values(spec_router_crossover{job=~"$job"}, instance)',
                ),
                variable("engine_job", "Engine job", "label_values(sglang:num_running_reqs, job)"),
            ]
        },
        "panels": layout(panels()),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
