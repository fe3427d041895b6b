"""What the control endpoints see of the router: its views and the operator's actions.

The one interface between ``router.control`` and the router (``router.app.RouterApp`` provides
it), so the endpoints and the live page import nothing of the app.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from router.control.feed import Feed
from router.decide import table as tables
from router.members.member import Member
from router.pools import Pool
from router.settings import Settings


class Controlled(Protocol):
    """What the control endpoints read and do (``router.app.RouterApp`` provides it)."""

    settings: Settings
    feed: Feed  # the live page's snapshots (router.control.feed)

    def status(self) -> dict[str, Any]: ...

    def usable_pools(self) -> dict[Pool, bool]: ...

    def metrics_text(self) -> bytes: ...

    def table(self) -> tables.Table: ...

    def replace_table(self, raw: Any) -> tables.Table: ...

    def pin_crossover(self, value: int) -> None: ...

    async def list_models(self) -> dict[str, Any]: ...

    def add_backend(self, pool: Pool, url: str) -> Member:
        """Raises ``MembershipError`` (a 409 or 404) or ``ValueError`` (a bad URL)."""
        ...

    def remove_backend(self, pool: Pool, url: str) -> Member: ...

    def members(self, pool: Pool) -> list[Member]: ...

    def in_flight(self) -> Mapping[str, int]: ...

    @property
    def clock(self) -> Callable[[], float]: ...
