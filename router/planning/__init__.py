"""The fleet planner in the router: the edge around the pure planner (``router.plan``).

``router.plan`` decides how many engines should run speculative from plain values; this
package gathers those values from what the router sees, calls it on a timer and publishes the
plan (``GET /router/plan``, the ``spec_router_plan_*`` gauges, the live page):

- ``traffic``: the arrival rate and lengths over an interval, from the engines' own counters
  (what every router replica reads alike), or the router's own counts where an engine has none;
- ``fleet``: the engines as the planner sees them (up, loading, draining, down), from the
  members, their health and the switch the planner last advised, followed through the
  members; the sequenced targets per pool; restart times as observed;
- ``service``: ``FleetPlanner``, the loop's state and one call per interval;
- ``metrics``: the gauges.

Nothing here restarts an engine: an autoscaler following the gauges, or an actuator following
``GET /router/plan`` (``spec-router fleet``), does.
"""
