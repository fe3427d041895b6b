"""Write deploy/k8s/prometheusrule.yaml: alerts.yml and recording.yml as a PrometheusRule.

The Prometheus Operator loads rules from PrometheusRule objects, not files. The groups are
copied unchanged; tests/deploy fails if the two drift apart.

    python deploy/prometheus/to_prometheusrule.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "k8s" / "prometheusrule.yaml"
SOURCES = ("alerts.yml", "recording.yml")

HEADER = """\
# Generated from deploy/prometheus/alerts.yml and recording.yml by
# `python deploy/prometheus/to_prometheusrule.py`: edit those, then regenerate.
# Your Prometheus may select rules by a label (e.g. release: <helm release>): add it here.
"""


def groups() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name in SOURCES:
        out.extend(yaml.safe_load((HERE / name).read_text())["groups"])
    return out


def document() -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "spec-router", "labels": {"app.kubernetes.io/name": "spec-router"}},
        "spec": {"groups": groups()},
    }


class _Dumper(yaml.SafeDumper):  # type: ignore[misc]  # (no stubs for PyYAML here)
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render() -> str:
    body: str = yaml.dump(document(), Dumper=_Dumper, sort_keys=False, width=100)
    return HEADER + body


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
