"""Accounting for requests: the in-flight counts and their leases (``inflight``; across workers,
``shared``), the record of each request (``outcome``) and what observes it (``metrics``,
``recent``)."""
