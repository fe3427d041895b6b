"""A real Prometheus server for tests, and the few HTTP API calls the tests make.

Started with ``--web.listen-address=127.0.0.1:0``; the port it got is read from its
"Listening on" log line (no sleeping, no guessed port). Stopped by PID: SIGTERM, then SIGKILL.
The binary comes from the Debian package ``prometheus`` (scripts/ensure-prometheus.sh).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.deploy.queries import ALERTS, PROMETHEUS_YML, RECORDING

_LISTENING = re.compile(r'msg="Listening on" address=([0-9.]+:\d+)')
START_TIMEOUT = 30.0


def binary(name: str) -> str | None:
    return shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)


def missing_reason(name: str) -> str | None:
    """Why a test needing ``name`` cannot run, or None. In CI (CI=true) a missing binary is
    an error, not a skip: scripts/ensure-prometheus.sh must have installed it."""
    if binary(name) is not None:
        return None
    reason = f"{name} is not installed: run scripts/ensure-prometheus.sh"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise RuntimeError(reason)
    return reason


def local_config(addresses: Mapping[str, str], interval: str = "1s") -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with its targets moved to local addresses.

    ``addresses`` maps "host:port" as the compose services know each other to the local
    "127.0.0.1:port"; a target it does not know fails the test. Scrape and rule evaluation
    run every ``interval`` so a short test sees many samples; rule files get absolute paths.
    """
    config: dict[str, Any] = yaml.safe_load(PROMETHEUS_YML.read_text())
    config["global"].update(
        scrape_interval=interval, scrape_timeout=interval, evaluation_interval=interval
    )
    by_name = {p.name: str(p) for p in (ALERTS, RECORDING)}
    config["rule_files"] = [by_name[Path(f).name] for f in config["rule_files"]]
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            unknown = [t for t in static["targets"] if t not in addresses]
            assert not unknown, f"job {job['job_name']}: no local service for {unknown}"
            static["targets"] = [addresses[t] for t in static["targets"]]
    return config


class Prometheus:
    def __init__(
        self, popen: subprocess.Popen[str], url: str, log: list[str], pump: threading.Thread
    ) -> None:
        self.popen = popen
        self.url = url
        self.log = log
        self.pump = pump
        self.http = httpx.Client(base_url=url or "http://127.0.0.1", timeout=10.0)

    def stop(self) -> None:
        self.http.close()
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        # The log reader ends at EOF once the process is gone; then its pipe can be closed.
        self.pump.join(timeout=10)
        if self.popen.stderr is not None and not self.pump.is_alive():
            self.popen.stderr.close()

    # -- HTTP API -------------------------------------------------------------------------------
    def _get(self, path: str, **params: Any) -> Any:
        r = self.http.get(path, params=params)
        body = r.json()
        assert body.get("status") == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query at "now"; the result as a list of samples (vector or scalar)."""
        data = self._get("/api/v1/query", query=expr)
        if data["resultType"] == "vector":
            samples: list[dict[str, Any]] = data["result"]
            return samples
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        raise AssertionError(f"{expr}: unexpected result type {data['resultType']}")

    def label_values(self, label: str, match: str) -> list[str]:
        params = {"match[]": match} if match else {}
        values: list[str] = self._get(f"/api/v1/label/{label}/values", **params)
        return values

    def targets(self) -> list[dict[str, Any]]:
        targets: list[dict[str, Any]] = self._get("/api/v1/targets")["activeTargets"]
        return targets

    def alerts(self) -> list[dict[str, Any]]:
        alerts: list[dict[str, Any]] = self._get("/api/v1/alerts")["alerts"]
        return alerts

    def rule_health(self) -> dict[str, str]:
        """Each rule's name -> its last evaluation's health ("ok", "err", "unknown")."""
        out = {}
        for group in self._get("/api/v1/rules")["groups"]:
            for rule in group["rules"]:
                out[rule["name"]] = rule["health"] + (
                    f": {rule['lastError']}" if rule.get("lastError") else ""
                )
        return out


def finite(samples: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(s["value"][1])) for s in samples)


@contextmanager
def running(config: dict[str, Any], workdir: Path) -> Iterator[Prometheus]:
    exe = binary("prometheus")
    assert exe, "prometheus is not installed: run scripts/ensure-prometheus.sh"
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    popen = subprocess.Popen(
        [
            exe,
            f"--config.file={path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            "--web.listen-address=127.0.0.1:0",
            "--storage.tsdb.retention.time=1h",
            "--log.level=info",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    log: list[str] = []
    found: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert popen.stderr is not None
        for line in popen.stderr:
            log.append(line.rstrip("\n"))
            m = _LISTENING.search(line)
            if m and not found:
                found.append(m.group(1))
                ready.set()
        ready.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    ready.wait(START_TIMEOUT)
    prom = Prometheus(popen, f"http://{found[0]}" if found else "", log, reader)
    try:
        assert found, "prometheus did not start:\n" + "\n".join(log[-30:])
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if prom.http.get("/-/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "prometheus not ready:\n" + "\n".join(log[-30:])
            time.sleep(0.05)
        yield prom
    finally:
        prom.stop()
