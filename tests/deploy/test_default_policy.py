"""One default policy on every surface that ships one (issue 34): the settings' default, the
configuration page, the compose file, the Kubernetes router and the gateway's EPP."""

from __future__ import annotations

import re
import tomllib

import yaml

from router.settings import Settings
from tests.deploy.queries import DEPLOY, ROOT
from tests.deploy.stack import COMPOSE


def shipped_policies() -> dict[str, str]:
    """The policy each shipped configuration runs, read from its file."""
    compose = yaml.safe_load(COMPOSE.read_text())
    env = compose["services"]["spec-router"]["environment"]
    compose_default = re.fullmatch(r"\$\{SPEC_ROUTER_POLICY:-(\w+)\}", env["SPEC_ROUTER_POLICY"])
    router_toml = tomllib.loads((DEPLOY / "k8s" / "router.toml").read_text())["spec_router"]
    (epp_map,) = [
        d
        for d in yaml.safe_load_all((DEPLOY / "k8s" / "gateway" / "epp.yaml").read_text())
        if d and d["kind"] == "ConfigMap"
    ]
    epp = tomllib.loads(epp_map["data"]["config.toml"])["spec_router"]
    documented = re.search(
        r"^\| `POLICY` \| `(\w+)` \|", (ROOT / "docs" / "configuration.md").read_text(), re.M
    )
    assert compose_default is not None and documented is not None
    return {
        "docs/configuration.md": documented[1],
        "deploy/docker-compose.yml": compose_default[1],
        "deploy/k8s/router.toml": router_toml["policy"],
        "deploy/k8s/gateway/epp.yaml": epp["policy"],
    }


def test_every_shipped_configuration_runs_the_default_policy() -> None:
    default = Settings.model_fields["policy"].default
    assert default == "slo"
    assert shipped_policies() == dict.fromkeys(shipped_policies(), default)
