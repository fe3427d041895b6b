"""The pools checked against what their engines say (issue 34, item 5).

The health poller reads an engine's description (``router.health.introspect``) at its first
successful contact and whenever it (re)joins -- turns healthy again after being down -- and
hands it here. ``PoolCheck`` keeps the latest description of every backend and runs
``router.health.checks.pool_findings`` over them: an engine in the speculative pool that
reports no speculation (or a baseline that does), pools swapped, one engine under two names,
backends serving different models, tokenizers or context lengths. New findings are logged
(errors at ERROR, the rest at WARNING), findings that went away are logged as resolved, and
``/router/status`` lists the current ones under ``warnings``.

Nothing here refuses to start or takes a pool out of routing. The check runs after start-up
(an engine still loading must not hold the router back), so a refusal would mean a running
router exiting; and a rule that reads what engines say can be wrong where they say little
(two names for one set of weights), so an outage is not its to cause. An error-level finding
is one where the deployment cannot work as meant -- different models behind one name, one
engine in both pools, pools swapped -- and says so at ERROR, in the status document and in
``spec-router doctor``'s exit status.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from router.health.checks import Described, Finding, pool_findings
from router.health.info import EngineInfo
from router.pools import POOLS, Pool

log = logging.getLogger("spec_router.health")


class PoolCheck:
    """The pool checks over the latest description of each backend (one writer: the
    poller's ``on_info`` and ``on_leave``). ``pools``: each pool's URLs, as membership keeps
    them (read at each check: a backend that joined is checked once it has answered)."""

    def __init__(
        self, pools: Mapping[Pool, Sequence[str]], mapped: bool = False, quiet: bool = False
    ) -> None:
        self.pools = pools
        self.mapped = mapped  # a model map is configured: served names may differ on purpose
        self.quiet = quiet  # log nothing (the other workers under --workers: the leader logs)
        self.infos: dict[str, EngineInfo] = {}
        self.findings: list[Finding] = []

    def update(self, info: EngineInfo) -> list[Finding]:
        """Take a backend's (new) description; returns the findings it added."""
        self.infos[info.url] = info
        return self._check()

    def forget(self, url: str) -> list[Finding]:
        """A backend that left the pools (``router.members``): its findings go with it."""
        self.infos.pop(url, None)
        return self._check()

    def _check(self) -> list[Finding]:
        members = [
            Described(pool, self.infos[url])
            for pool in POOLS
            for url in self.pools.get(pool, ())
            if url in self.infos
        ]
        found = pool_findings(members, self.mapped)
        new = [f for f in found if f not in self.findings]
        gone = [f for f in self.findings if f not in found]
        self.findings = found
        if not self.quiet:
            for f in new:
                log.log(
                    logging.ERROR if f.level == "error" else logging.WARNING,
                    "pools: %s: %s (%s; fix: %s)",
                    f.code,
                    f.message,
                    f.reason,
                    f.fix,
                )
            for f in gone:
                log.info("pools: resolved: %s: %s", f.code, f.message)
        return new

    def status(self) -> list[dict[str, Any]]:
        """The current findings, for ``/router/status`` (``warnings``)."""
        return [{"kind": "pools", **f.as_dict()} for f in self.findings]

    def reported(self, url: str) -> dict[str, Any] | None:
        """What a backend said about itself, in short (``/router/status``, per backend)."""
        info = self.infos.get(url)
        if info is None:
            return None
        return {
            "flavor": info.flavor,
            "version": info.version,
            "model": info.served_model,
            "speculative": info.speculative,
            "running_cap": info.running_cap,
        }
