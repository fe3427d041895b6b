"""The planner's tunables, in one place, each with where its value comes from.

"The lab" is ``bench/lab/fleet_lab.py`` (results: ``bench/results/fleet-lab.md``); a value
chosen there was chosen on the tuning day (the Azure conversation trace's lengths under the
diurnal envelope with its surge, seed 1) and is judged on the held-out days. Values from first
principles say so.
"""

from __future__ import annotations

from typing import NamedTuple

from router.plan.forecast import ForecastParams
from router.plan.goodput import ModelParams


class Params(NamedTuple):
    # Seconds between planning calls. A minute: the forecast needs counts large enough to
    # mean something (tens of requests per engine), and a restart (~530 s) spans nine calls.
    interval: float = 60.0
    # Seconds ahead the schedule is planned over. Three hours: the split for a day's peak must
    # be reached while the floor still allows switches, at mid load, a couple of hours before
    # the peak; with 90 minutes the lab's eagle3-tree day kept all-speculative into its peak
    # (5 points under the best static split), with three hours it did not. Going all the way
    # from one mode to the other on four engines takes four restarts (~37 min) besides.
    horizon: float = 10800.0
    # Past the horizon each split keeps the horizon's last rate for this long, so a switch late
    # in the horizon is not judged on its restart alone: about one restart, the least a switch
    # must pay back within.
    tail: float = 600.0
    # A switch towards speculation waits this long after the last switch towards baseline
    # ended, and one towards baseline this long after the last towards speculation (switches
    # in the same direction follow each other, one at a time). Reversals are what flaps
    # (dynamo #9294: replicas flipping between 2 and 1 each interval); a reversal sooner than
    # two restarts cannot have paid for the first switch. Asymmetric on purpose (the issue's
    # rule: towards baseline faster): load that rises hurts within minutes, load that falls only
    # wastes some latency.
    dwell_to_speculative: float = 1800.0
    dwell_to_baseline: float = 600.0
    # Least expected gain, in points of the objective over the horizon's requests, to switch
    # towards baseline / towards speculation (which must also not lose under the upper band).
    # Above the model's noise between neighbouring splits (a few tenths of a point; the lab's
    # flat loads) so a flat load never switches; larger towards speculation (the asymmetry).
    margin_baseline: float = 0.005
    margin_speculative: float = 0.01
    # The objective: strict_weight * strict goodput + (1 - strict_weight) * relaxed. Half and
    # half, by the lab: with 0.5 the planner came within a point of the best static split in
    # both tiers in all three regimes of the tuning day; weighted towards relaxed (0.2) it fell
    # 11-16 relaxed points short in eagle3 and eagle3-tree, misled where the model is weakest
    # (an overloaded all-baseline fleet's relaxed goodput, which it underrates by up to 15).
    strict_weight: float = 0.5
    # The floor: during a switch, the engines that stay up must keep the upper forecast's peak
    # over the restart at or below their SLO capacity, the rate at which their expected relaxed
    # goodput is this share. Half: the model's capacity of four baseline engines at 0.5 is
    # 3.10 req/s on the conversation mix, where the engines' model puts their SLO capacity
    # (mean TPOT at the relaxed target; the lab's envelopes) at 3.09. At 0.9 the floor closed
    # at under half that load and froze the fleet in the split it had.
    floor_share: float = 0.5
    # The model's mix is replaced by the observed one when their means or sampling shares drift
    # apart by more than this (relative / absolute): the model's cached tables stay valid
    # between, and a mix estimate's noise does not move the plan.
    mix_tolerance: float = 0.1
    # Intervals observed before the first switch is advised: a trend from fewer counts is
    # their noise (a minute of 1 req/s is 60 +- 8).
    warmup: int = 5
    # Recent decisions kept in the state (for GET /router/plan's history).
    history: int = 20
    forecast: ForecastParams = ForecastParams()
    model: ModelParams = ModelParams()
