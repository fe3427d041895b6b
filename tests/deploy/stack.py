"""The compose file's `sim` profile, started as local processes (Docker cannot run here).

``start_sim_profile`` reads deploy/docker-compose.yml, interpolates ``${VAR:-default}`` like
Compose does, takes the services of the `sim` profile that run this project's image (the two
simulated engines and the router), and starts their own commands as subprocesses on
127.0.0.1 with ``--port 0``. Compose networking is replaced by a map from each service's host
names (service name and network aliases) and container port to the local URL; the router's
``SPEC_ROUTER_*_URLS`` are rewritten through it, so a URL that names no `sim` service fails
the test, as it would fail to resolve under Compose. Prometheus and Grafana run other images;
tests/deploy/prometheus.py runs a real Prometheus with the same prometheus.yml instead. Paths
on the router's volumes (the learned crossover table) move to scratch directories.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.processes import Proc, spawn

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
IMAGE_PREFIX = "spec-router:"

_VAR = re.compile(
    r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?)-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)"
)
_URL = re.compile(r"http://([A-Za-z0-9_.-]+):(\d+)")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's interpolation: ``$$``, ``$VAR``, ``${VAR}``, ``${VAR-d}``, ``${VAR:-d}``."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        value = env.get(name)
        if m.group(3) is not None:  # a default is given
            if value is None or (m.group(2) == ":" and value == ""):
                return interpolate(m.group(3), env)
        return value or ""

    return _VAR.sub(sub, text)


def _interpolate_tree(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_interpolate_tree(v, env) for v in node]
    if isinstance(node, dict):
        return {k: _interpolate_tree(v, env) for k, v in node.items()}
    return node


def load_compose(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The compose file with YAML anchors merged and variables interpolated from ``env``."""
    raw = yaml.safe_load(COMPOSE.read_text())
    compose: dict[str, Any] = _interpolate_tree(raw, env or {})
    return compose


def services_in_profile(compose: dict[str, Any], profile: str) -> dict[str, dict[str, Any]]:
    """Services Compose starts for ``--profile <profile>``: unprofiled ones and that profile's."""
    return {
        name: svc
        for name, svc in compose["services"].items()
        if not svc.get("profiles") or profile in svc["profiles"]
    }


def host_names(name: str, svc: dict[str, Any]) -> set[str]:
    names = {name}
    networks = svc.get("networks") or {}
    if isinstance(networks, dict):
        for net in networks.values():
            names.update((net or {}).get("aliases", []))
    return names


def _option(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def local_args(cmd: list[str]) -> list[str]:
    """A container command ``spec-router ...`` as ``python -m router ...`` on 127.0.0.1:0."""
    assert cmd[0] == "spec-router", f"not a spec-router command: {cmd}"
    args = list(cmd[1:])
    for flag, value in (("--host", "127.0.0.1"), ("--port", "0")):
        assert flag in args, f"{flag} missing from {cmd}"
        args[args.index(flag) + 1] = value
    return ["-m", "router", *args]


def container_port(cmd: list[str]) -> int:
    port = _option(cmd, "--port")
    assert port is not None, f"--port missing from {cmd}"
    return int(port)


@dataclass
class Stack:
    procs: dict[str, Proc] = field(default_factory=dict)
    # "host:port" as containers see each other -> "127.0.0.1:port" here
    addresses: dict[str, str] = field(default_factory=dict)
    router_service: str = ""
    scratch: list[str] = field(default_factory=list)  # directories standing in for volumes

    @property
    def router(self) -> Proc:
        return self.procs[self.router_service]

    def engine(self, alias: str) -> Proc:
        """The process that answers for ``alias`` (e.g. ``sglang-eagle3``)."""
        local = next(v for k, v in self.addresses.items() if k.split(":")[0] == alias)
        return next(p for p in self.procs.values() if p.url == f"http://{local}")

    def stop(self, service: str) -> None:
        self.procs[service].stop()

    def close(self) -> None:
        for proc in self.procs.values():
            proc.stop()
        for path in self.scratch:
            shutil.rmtree(path, ignore_errors=True)


def rewrite_urls(value: str, addresses: Mapping[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        key = f"{m.group(1)}:{m.group(2)}"
        assert key in addresses, f"{value!r} names {key}, which no `sim` profile service provides"
        return f"http://{addresses[key]}"

    return _URL.sub(sub, value)


@contextmanager
def start_sim_profile(
    variables: Mapping[str, str] | None = None,
    router_overlay: Mapping[str, str] | None = None,
) -> Iterator[Stack]:
    """Start the `sim` profile's engines and router; ``router_overlay`` adds test-only settings."""
    compose = load_compose(variables)
    ours = {
        name: svc
        for name, svc in services_in_profile(compose, "sim").items()
        if str(svc.get("image", "")).startswith(IMAGE_PREFIX)
    }
    engines = {n: s for n, s in ours.items() if s["command"][1] == "sim"}
    routers = {n: s for n, s in ours.items() if s["command"][1] == "serve"}
    assert len(engines) == 2 and len(routers) == 1, f"unexpected sim profile: {sorted(ours)}"
    stack = Stack()
    try:
        for name, svc in engines.items():
            proc = spawn(local_args(svc["command"]))
            stack.procs[name] = proc
            port = container_port(svc["command"])
            for host in host_names(name, svc):
                stack.addresses[f"{host}:{port}"] = proc.url.removeprefix("http://")
        ((name, svc),) = routers.items()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_ROUTER_")}
        env.update(
            {k: rewrite_urls(str(v), stack.addresses) for k, v in svc["environment"].items()}
        )
        # Paths on the service's volumes move to scratch directories of the test's own.
        for volume in svc.get("volumes", []):
            target = volume.split(":")[1]
            local = tempfile.mkdtemp(prefix="spec-router-volume-")
            stack.scratch.append(local)
            env.update(
                {k: v.replace(target, local, 1) for k, v in env.items() if v.startswith(target)}
            )
        env.update(router_overlay or {})
        proc = spawn(local_args(svc["command"]), env=env)
        stack.procs[name] = proc
        stack.router_service = name
        port = container_port(svc["command"])
        for host in host_names(name, svc):
            stack.addresses[f"{host}:{port}"] = proc.url.removeprefix("http://")
        yield stack
    finally:
        stack.close()


def healthcheck_code(dockerfile: str) -> str:
    """The Python code of a Dockerfile's exec-form HEALTHCHECK (``python -c CODE``)."""
    cmd = re.search(r"HEALTHCHECK[^\n]*\\\n\s*CMD (\[.*\])", dockerfile)
    assert cmd, "no exec-form HEALTHCHECK"
    args = json.loads(cmd.group(1))
    assert args[:2] == ["python", "-c"]
    return str(args[2])
