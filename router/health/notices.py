"""What an operator should know about the backends and the pools, until its cause goes away.

One place for every warning about the deployment, whoever finds it: the health poller (a backend
that cannot be reached, ``router.health.trouble``), the start-up checks (``router.lifecycle``)
and the checks of the pools against what their engines say. Each ``Notice`` is kept under a key
(one per backend and cause, or per check) until it is cleared; ``/router/status`` lists them
(``warnings``), ``/ready`` too, and the live page shows them. Whoever raises a notice decides
when it is logged (``log=True``): the poller at most every few minutes per backend.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger("spec_router.health")

Level = Literal["warning", "error"]


@dataclass(frozen=True, slots=True)
class Notice:
    subject: str  # a backend's URL, a pool's name, or "settings"
    message: str  # one line, saying what to check
    since: float  # when it was first raised (the router's clock)
    level: Level = "warning"


class Notices:
    """The current notices, by key."""

    def __init__(self) -> None:
        self._by_key: dict[str, Notice] = {}

    def raise_(
        self,
        key: str,
        subject: str,
        message: str,
        now: float,
        level: Level = "warning",
        log_it: bool = True,
    ) -> None:
        """Keep ``message`` under ``key`` (replacing what was there, keeping its ``since``);
        log it when ``log_it``."""
        old = self._by_key.get(key)
        self._by_key[key] = Notice(subject, message, old.since if old else now, level)
        if log_it:
            log.log(logging.ERROR if level == "error" else logging.WARNING, "%s", message)

    def clear(self, key: str) -> bool:
        """Drop the notice under ``key``; whether there was one."""
        return self._by_key.pop(key, None) is not None

    def clear_prefix(self, prefix: str) -> None:
        for key in [k for k in self._by_key if k.startswith(prefix)]:
            del self._by_key[key]

    def current(self) -> list[Notice]:
        return sorted(self._by_key.values(), key=lambda n: (n.since, n.subject))

    def document(self, now: float) -> list[dict[str, Any]]:
        """The notices as /router/status lists them, oldest first."""
        return [
            {
                "kind": "backend",
                "level": n.level,
                "subject": n.subject,
                "message": n.message,
                "for_s": round(now - n.since, 1),
            }
            for n in self.current()
        ]
