"""Every PromQL expression in deploy/, extracted from the files, and small PromQL text helpers.

The helpers are lexical, not a PromQL parser: they handle the constructs these files use
(selectors, ranges, offsets, aggregations with by/without, vector matching, comparisons,
set operators) and are checked on those files by the tests. Prometheus itself is the judge of
whether an expression is valid (promtool, and the live queries in test_prometheus_live.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "spec-router.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
RECORDING = DEPLOY / "prometheus" / "recording.yml"
PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"

# What Grafana's template variables become in a test: every router / engine target.
VARIABLES = {"$__rate_interval": "1m", "$job": ".*", "$instance": ".*", "$engine_job": ".*"}


@dataclass(frozen=True)
class Query:
    source: str  # where it came from, for messages: "dashboard: <panel> [A]", "alert: X", ...
    expr: str


def substitute(expr: str) -> str:
    # Longest names first: "$instance" must not be eaten by a shorter "$i...".
    for name in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, VARIABLES[name])
    assert "$" not in expr.replace("$labels", "").replace("$value", ""), f"unknown variable: {expr}"
    return expr


def dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return board


def dashboard_panels() -> list[dict[str, Any]]:
    out = []
    for panel in dashboard()["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows keep their panels inside
    return out


def dashboard_queries() -> list[Query]:
    return [
        Query(f"dashboard: {panel['title']} [{t['refId']}]", substitute(t["expr"]))
        for panel in dashboard_panels()
        for t in panel.get("targets", [])
    ]


_LABEL_VALUES = re.compile(r"^label_values\((?:(.*),\s*)?([A-Za-z_][A-Za-z0-9_]*)\)$")


def variable_queries() -> list[tuple[str, str, str]]:
    """(variable name, series selector, label) for each ``label_values`` variable."""
    out = []
    for var in dashboard()["templating"]["list"]:
        if var["type"] != "query":
            continue
        m = _LABEL_VALUES.match(var["definition"].strip())
        assert m, f"variable {var['name']}: not a label_values(...) query"
        out.append((var["name"], substitute(m.group(1) or ""), m.group(2)))
    return out


def rules(path: Path) -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def alert_rules() -> list[dict[str, Any]]:
    return rules(ALERTS)


def recording_rules() -> list[dict[str, Any]]:
    return rules(RECORDING)


def all_queries() -> list[Query]:
    """Every expression: dashboard targets, recording rules, alert rules."""
    out = dashboard_queries()
    out += [Query(f"record: {r['record']}", r["expr"]) for r in recording_rules()]
    out += [Query(f"alert: {r['alert']}", r["expr"]) for r in alert_rules()]
    return out


# -- lexical helpers ----------------------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![A-Za-z0-9_:.])[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
     "bool", "offset", "inf", "nan", "Inf", "NaN"}
)  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """Metric names the expression selects (identifiers that are not functions or keywords)."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        if m.group() in _KEYWORDS or text[m.end() :].lstrip().startswith("("):
            continue
        names.add(m.group())
    return names


_COMPARISON = re.compile(r"==|!=|>=|<=|>|<")
_SET_OP = re.compile(r"(?:and|or|unless)\b")
_MODIFIER = re.compile(
    r"\s*(?:bool\b|(?:on|ignoring)\s*\([^)]*\)|(?:group_left|group_right)\s*(?:\([^)]*\))?)"
)


def operands(expr: str) -> list[str]:
    """Split at top-level comparison and set operators; keep the non-literal sides.

    ``a > 0.05 and on (x) b > 0`` gives ``["a", "b"]``: the series an alert condition is built
    from, which must exist even while the condition is false.
    """
    parts: list[str] = []
    depth = 0
    start = i = 0
    n = len(expr)
    while i < n:
        c = expr[i]
        if c in "\"'":
            end = _STRING.match(expr, i)
            i = end.end() if end else n
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            boundary = i == 0 or not (expr[i - 1].isalnum() or expr[i - 1] in "_:")
            op = _COMPARISON.match(expr, i) or (_SET_OP.match(expr, i) if boundary else None)
            if op:
                parts.append(expr[start:i])
                i = op.end()
                while mod := _MODIFIER.match(expr, i):
                    if mod.end() == i:
                        break
                    i = mod.end()
                start = i
                continue
        i += 1
    parts.append(expr[start:])
    out = []
    for part in (p.strip() for p in parts):
        try:
            float(part)
        except ValueError:
            out.append(part)
    return out
