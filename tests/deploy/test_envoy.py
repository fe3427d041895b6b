"""deploy/envoy/: both Envoy configurations pass ``envoy --mode validate`` (the real binary,
from .venv-envoy), and hold what the EPP relies on (the gateway tier runs them:
tests/gateway)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.envoy import ORIGINAL_DST, RECOMMENDED, validate

CONFIGS = [RECOMMENDED, ORIGINAL_DST]
DESTINATION = "x-gateway-destination-endpoint"


def http_filters(config: dict[str, Any]) -> list[dict[str, Any]]:
    (listener,) = config["static_resources"]["listeners"]
    (chain,) = listener["filter_chains"]
    (hcm,) = chain["filters"]
    filters: list[dict[str, Any]] = hcm["typed_config"]["http_filters"]
    return filters


def cluster(config: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        c for c in config["static_resources"]["clusters"] if c["name"] == name
    ]
    (one,) = found
    return one


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_envoy_accepts_the_configuration(path: Path) -> None:
    done = validate(path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK" in done.stdout


def test_envoy_refuses_a_broken_one(tmp_path: Path) -> None:
    """(so that the check above can fail) a misspelt field is refused"""
    config = yaml.safe_load(RECOMMENDED.read_text())
    cluster(config, "epp")["conect_timeout"] = "1s"
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(config))
    assert validate(broken).returncode != 0


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_what_the_epp_relies_on(path: Path) -> None:
    config = yaml.safe_load(path.read_text())
    filters = http_filters(config)
    names = [f["name"] for f in filters]
    # the client's own destination header is gone before ext_proc, and the router is last
    strip, ext_proc = (
        names.index("envoy.filters.http.header_mutation"),
        names.index("envoy.filters.http.ext_proc"),
    )
    assert strip < ext_proc and names[-1] == "envoy.filters.http.router"
    removed = filters[strip]["typed_config"]["mutations"]["request_mutations"]
    assert {"remove": DESTINATION} in removed
    xp = filters[ext_proc]["typed_config"]
    assert xp["failure_mode_allow"] is True
    assert xp["processing_mode"] == {
        "request_header_mode": "SEND",
        "request_body_mode": "FULL_DUPLEX_STREAMED",
        "request_trailer_mode": "SEND",
        "response_header_mode": "SEND",
        "response_body_mode": "NONE",
        "response_trailer_mode": "SKIP",
    }
    assert "envoy.lb" in xp["metadata_options"]["receiving_namespaces"]["untyped"]
    assert "envoy.lb.subset_hint" in xp["metadata_options"]["forwarding_namespaces"]["untyped"]
    # one access-log record per request, at once, to the EPP
    (listener,) = config["static_resources"]["listeners"]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    (als,) = hcm["access_log"]
    common = als["typed_config"]["common_config"]
    assert common["grpc_service"]["envoy_grpc"]["cluster_name"] == "epp"
    assert common["buffer_size_bytes"] == 0
    # routes never time out a stream
    for host in hcm["route_config"]["virtual_hosts"]:
        assert all(r["route"]["timeout"] == "0s" for r in host["routes"])
    # the EPP cluster: HTTP/2, a gRPC health check of ext_proc, no panic routing to a dead EPP
    epp = cluster(config, "epp")
    (check,) = epp["health_checks"]
    assert check["grpc_health_check"]["service_name"] == (
        "envoy.service.ext_proc.v3.ExternalProcessor"
    )
    assert check["no_traffic_interval"] == check["interval"]
    assert epp["common_lb_config"]["healthy_panic_threshold"]["value"] == 0
    assert "outlier_detection" in epp
    assert "http2_protocol_options" in str(epp["typed_extension_protocol_options"])
