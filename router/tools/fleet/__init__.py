"""``spec-router fleet``: a fleet of simulated engines on one machine, planned (issue 37).

- ``workload``: the day (an envelope over the all-baseline fleet's SLO capacity, arrivals);
- ``zone``: the DNS names the router discovers the engines by;
- ``engines``: the sims, which switch mode by restarting;
- ``actuator``: what to do about the router's plan (pure);
- ``run``: one run, set up, replayed and torn down;
- ``score``, ``report``: the summary and buckets, the markdown and the PNG;
- ``cli``: the command.
"""
