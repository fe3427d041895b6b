"""``GET /router/plan``: the fleet planner's last plan, as it published it (router.planning).

Current and desired split, the switch in progress, the next switch's expected gain and cost
with the numbers behind them (the floor's need and have), the forecast, each split's value and
the recent decisions with their reasons; ``{"planner": "off"}`` when the planner is off.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from router.control.controlled import Controlled


def add_plan(api: FastAPI, app: Controlled) -> None:
    @api.get("/router/plan")
    async def plan() -> dict[str, Any]:
        return app.plan()
