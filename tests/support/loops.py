"""A module's tests on both event loops the router may run on: import ``on_both_loops`` into
a test module (it overrides tests/conftest.py's session-wide ``anyio_backend``, asyncio only)."""

from __future__ import annotations

import pytest


@pytest.fixture(
    name="anyio_backend",
    params=[
        pytest.param(("asyncio", {}), id="asyncio"),
        # the router's own loop: its timers and transports are uvloop's
        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    ],
)
def on_both_loops(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    return request.param  # type: ignore[no-any-return]
