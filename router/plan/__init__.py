"""The fleet planner: how many engines should run speculative, decided from the load and the
cost of switching (issue 37). A pure core over plain values: no I/O, no clock, no asyncio.

``plan`` is the entry point (``router.plan.planner``); ``split_goodput`` the model it judges
splits with (``router.plan.goodput``); ``observe`` / ``forecast`` its forecast
(``router.plan.forecast``); ``Params`` its tunables with their provenance.
"""

from __future__ import annotations

from router.plan.forecast import Forecast, ForecastParams, Holt, forecast, observe
from router.plan.goodput import Goodput, ModelParams, slo_capacity, spill_threshold, split_goodput
from router.plan.params import Params
from router.plan.planner import (
    Action,
    Decision,
    EngineState,
    Observation,
    Option,
    Plan,
    PlanState,
    Setting,
    observe_round,
    plan,
    steady_split,
    steps_since,
)
from router.plan.values import Curve, Mix, Slo, curve_of, mix_of

__all__ = [
    "Action",
    "Curve",
    "Decision",
    "EngineState",
    "Forecast",
    "ForecastParams",
    "Goodput",
    "Holt",
    "Mix",
    "ModelParams",
    "Observation",
    "Option",
    "Params",
    "Plan",
    "PlanState",
    "Setting",
    "Slo",
    "curve_of",
    "forecast",
    "mix_of",
    "observe",
    "plan",
    "slo_capacity",
    "spill_threshold",
    "split_goodput",
    "observe_round",
    "steady_split",
    "steps_since",
]
