"""How long a client's idle connection stays open, in seconds, unless configured
(``SPEC_ROUTER_CLIENT_KEEP_ALIVE``): longer than the usual load balancer's idle timeout (60 s), as
it must be. A leaf of its own: the settings and the serving helpers (which the sims use without
loading the settings) share it."""

from __future__ import annotations

CLIENT_KEEP_ALIVE = 75.0
