"""Proxying a request: reading it (``request``), deciding where it goes from live state
(``decider``), the optional queue (``admission``) and the proxy itself (``proxy``)."""
