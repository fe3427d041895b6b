"""``PUT /router/table`` on a router in process: the admin token, validation, and the table
persisted at once."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from router.app import RouterApp
from router.decide import table as tables
from router.settings import Settings
from tests.support.tables import model_table

pytestmark = pytest.mark.anyio


async def test_put_table_needs_the_admin_token_and_validates(tmp_path: Path) -> None:
    settings = Settings(admin_token="s3cret", table_path=tmp_path / "t.json")
    app = RouterApp(settings)
    transport = httpx.ASGITransport(app=app)
    good = tables.to_json(model_table(32, 64, crossover=4))
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
        assert (await client.put("/router/table", json=good)).status_code == 401
        auth = {"authorization": "Bearer s3cret"}
        r = await client.put("/router/table", json=good, headers=auth)
        assert r.status_code == 200 and r.json() == {
            "crossover": 4,
            "crossover_source": "calibrated",
            "measured_up_to": 32,
        }
        assert app.keeper.crossover == 4
        assert tables.load(tmp_path / "t.json").crossover == 4  # persisted at once

        for bad in (
            {**good, "version": 99},
            {**good, "crossover": -1},
            [1, 2],
            {**good, "speculative": {"points": [{"concurrency": 1}]}},
        ):
            r = await client.put("/router/table", json=bad, headers=auth)
            assert r.status_code == 400, bad
            assert r.json()["error"]["code"] == "invalid_table" and r.json()["error"]["message"]
        r = await client.put("/router/table", content=b"{nope", headers=auth)
        assert r.status_code == 400
        assert app.keeper.crossover == 4  # the old table stays
        shown = (await client.get("/router/table")).json()
        assert shown["crossover"] == 4 and shown["version"] == tables.TABLE_VERSION
    no_admin = RouterApp(Settings())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=no_admin), base_url="http://r"
    ) as client:
        assert (await client.put("/router/table", json=good)).status_code == 403
