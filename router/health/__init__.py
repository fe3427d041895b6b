"""The backends' health: the per-backend state machine (``state``), the poller that probes and
scrapes the engines (``poller``), and the reading of their /metrics (``engines``)."""
