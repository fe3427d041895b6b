"""``PUT /router/crossover`` pins the crossover: the learner does not move it afterwards."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from router.app import RouterApp
from router.decide import table as tables
from router.settings import Settings
from tests.support.tables import model_table

pytestmark = pytest.mark.anyio

AUTH = {"authorization": "Bearer s3cret"}


async def test_a_put_crossover_is_not_learned_over(tmp_path: Path) -> None:
    # A calibrated table whose curves put the crossover near 6: every learning step would
    # walk a crossover of 30 back down towards it, one step per update.
    path = tmp_path / "t.json"
    tables.save(model_table(1024, 256), path)
    app = RouterApp(Settings(admin_token="s3cret", table_path=path, learn_max_step=1))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
        r = await client.put("/router/crossover", json={"crossover": 30}, headers=AUTH)
        assert r.status_code == 200
        assert r.json() == {"crossover": 30, "crossover_source": "configured"}
        # the acceptance length the engines report moved: a re-target that would apply at once
        app.keeper.learner.observe_accept(2.0)
        for _ in range(5):
            app.keeper.update()
        status = (await client.get("/router/status")).json()
    assert (status["crossover"], status["crossover_source"]) == (30, "configured")
    assert status["learning"]["pinned"] is True


async def test_a_new_table_unpins(tmp_path: Path) -> None:
    """An operator who PUTs a table hands the crossover back to the table and the learner."""
    app = RouterApp(
        Settings(admin_token="s3cret", table_path=tmp_path / "t.json", table_fresh=True)
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
        await client.put("/router/crossover", json={"crossover": 30}, headers=AUTH)
        good = tables.to_json(model_table(1024, 256, crossover=12))
        assert (await client.put("/router/table", json=good, headers=AUTH)).status_code == 200
        app.keeper.learner.observe_accept(2.0)
        app.keeper.update()
        status = (await client.get("/router/status")).json()
    assert status["learning"]["pinned"] is False
    assert status["crossover_source"] == "learned" and status["crossover"] == 11
