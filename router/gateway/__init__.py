"""``spec-router epp``: the router's decision as an Endpoint Picker behind an inference gateway.

An Envoy-based gateway (the Gateway API Inference Extension's data planes) asks the EPP over
Envoy's ext_proc protocol which engine gets each request, and relays the bytes itself. The EPP
asks the same ``Decider`` the proxy asks, over the same tracker, health registry, poller and
keeper (``router.app.RouterApp``), and learns when a request ended from Envoy's access-log
stream, one record per request, never from the response bytes.

- ``messages``: what goes to and comes from Envoy (ext_proc), as plain values
- ``endpoints``: the pools' URLs as the ``ip:port`` endpoints Envoy routes to
- ``records``: an access-log record, and what it says about the request it ends
- ``leases``: the requests routed and not yet ended, by request id
- ``connections``: the gateway's connections, and which went away (their leases go too)
- ``picker``: one request's decision (the proxy's reading, policy, queue and refusals)
- ``service``: the gRPC services (ext_proc, access log, health)
- ``app``: the EPP process: its components, its HTTP endpoints and its lifecycle
- ``cli``: ``spec-router epp``
"""
