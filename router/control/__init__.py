"""The router's own endpoints, off the hot path: ``/health``, ``/ready``, ``/metrics``,
``/router/*`` and ``/v1/models`` (``app``, through ``controlled``), the status document
(``status``) and the live page (``page``, ``feed``, ``live``, ``ui/``)."""
