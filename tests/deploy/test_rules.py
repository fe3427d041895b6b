"""Prometheus files: promtool checks, promtool unit tests of the alerts, the PrometheusRule."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy import prometheus as prom_mod
from tests.deploy.queries import ALERTS, DEPLOY, PROMETHEUS_YML, RECORDING, ROOT

PROMTOOL = prom_mod.binary("promtool")
_MISSING = prom_mod.missing_reason("promtool")
needs_promtool = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")
UNIT_TESTS = Path(__file__).with_name("alerts_test.yml")


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False
    )


@needs_promtool
def test_promtool_check_config() -> None:
    done = promtool("check", "config", str(PROMETHEUS_YML))
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_promtool_check_rules() -> None:
    done = promtool("check", "rules", str(ALERTS), str(RECORDING))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@needs_promtool
def test_alert_unit_tests(tmp_path: Path) -> None:
    """Synthetic series through the real alert expressions and `for` durations.

    promtool compares annotations exactly; they are prose, so the rules run from a copy
    without them (expressions, durations and labels unchanged).
    """
    data = yaml.safe_load(ALERTS.read_text())
    for group in data["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / UNIT_TESTS.name).write_text(UNIT_TESTS.read_text())
    done = promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr

    tested = {
        case["alertname"]
        for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    alerts = {rule["alert"] for group in data["groups"] for rule in group["rules"]}
    assert alerts <= tested, f"alerts without a firing unit test: {sorted(alerts - tested)}"


def test_alerts_have_severity_summary_and_runbook() -> None:
    readme = (DEPLOY / "README.md").read_text().lower()
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
            assert {"summary", "description", "runbook"} <= set(rule["annotations"]), rule["alert"]
            anchor = rule["annotations"]["runbook"].split("#", 1)[1]
            assert f"### {rule['alert'].lower()}" in readme, f"no README section for {anchor}"


def test_prometheusrule_is_the_rule_files() -> None:
    """deploy/k8s/prometheusrule.yaml carries exactly the groups of alerts.yml + recording.yml."""
    rule = yaml.safe_load((DEPLOY / "k8s" / "prometheusrule.yaml").read_text())
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["kind"] == "PrometheusRule"
    expected = [g for f in (ALERTS, RECORDING) for g in yaml.safe_load(f.read_text())["groups"]]
    assert rule["spec"]["groups"] == expected, (
        "stale: run python deploy/prometheus/to_prometheusrule.py"
    )


def test_ensure_prometheus_script_is_idempotent() -> None:
    script = ROOT / "scripts" / "ensure-prometheus.sh"
    syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    if PROMTOOL is None or prom_mod.binary("prometheus") is None:
        pytest.skip("prometheus not installed here: not running the installer from a test")
    # Installed: the script must return at once, without touching apt.
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    assert "installing" not in done.stderr
