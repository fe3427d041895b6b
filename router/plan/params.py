"""The planner's tunables, in one place, each with where its value comes from.

"The lab" is ``bench/lab/fleet_lab.py`` (results: ``bench/results/fleet-lab.md``); a value
chosen there was chosen on the tuning set (the Azure conversation day, seeds 1-2) and judged
on the held-out set. Values from first principles say so.
"""

from __future__ import annotations

from typing import NamedTuple

from router.plan.forecast import ForecastParams
from router.plan.goodput import ModelParams


class Params(NamedTuple):
    # Seconds between planning calls. A minute: the forecast needs counts large enough to
    # mean something (tens of requests per engine), and a restart (~530 s) spans nine calls.
    interval: float = 60.0
    # The window a switch must pay back within, after its restart: value is compared over
    # restart + dwell. Ten minutes, about one restart: a switch that does not pay back the
    # capacity it costs within the time it took is not worth its risk (and a forecast much
    # past a restart is a guess).
    dwell: float = 600.0
    # Least seconds since the last switch ended before the next one towards speculation, and
    # towards baseline. Asymmetric on purpose (the rule: towards baseline faster): load
    # that rises hurts within minutes, load that falls only wastes a little latency. Towards
    # baseline 0: one switch in flight at a time already spaces them by a restart.
    dwell_speculative: float = 600.0
    dwell_baseline: float = 0.0
    # A switch opposite to the last one waits this long after it ended (dynamo #9294: replicas
    # flipping between 2 and 1 each interval). Two restarts: a reversal sooner than the time two
    # switches cost cannot have paid for the first.
    dwell_reverse: float = 1200.0
    # Least expected gain, in points of the objective over the window's requests, to switch
    # towards baseline / towards speculation. Above the model's noise between neighbouring
    # splits (a few tenths of a point; the lab's flat loads) so a flat load never switches;
    # larger towards speculation (the asymmetry above).
    margin_baseline: float = 0.005
    margin_speculative: float = 0.01
    # The objective: strict_weight * strict goodput + (1 - strict_weight) * relaxed.
    strict_weight: float = 0.5
    # The floor: during a switch, the engines that stay up must keep the upper forecast's peak
    # over the restart at or below their SLO capacity, the rate at which their expected relaxed
    # goodput is this share.
    floor_share: float = 0.9
    # The model's mix is replaced by the observed one when their means or sampling shares drift
    # apart by more than this (relative / absolute): the model's cached tables stay valid
    # between, and a mix estimate's noise does not move the plan.
    mix_tolerance: float = 0.1
    # Recent decisions kept in the state (for GET /router/plan's history).
    history: int = 20
    forecast: ForecastParams = ForecastParams()
    model: ModelParams = ModelParams()
