"""One request's life in the EPP: read and routed as the proxy does, ended by Envoy's record.

``route`` reads the request with the proxy's own code (API key, path, body: ``router.forward``),
asks the same ``Decider`` the proxy asks (the same call, so one policy for both), waits in the
same bounded queue, keeps to the gateway's subset hint, and takes the lease. Where the proxy
would refuse, it returns the same ``RouterError`` (400, 401, 404, 413, 429, 503), which the
exchange sends as Envoy's immediate response. ``ended`` is the other half: Envoy's access-log
record of the request releases its lease, judges its backend as the proxy's verdicts do, and
hands the record to the proxy's observers (metrics, learning, the recent window).

What an access-log record cannot tell is when the first token came: Envoy sees the engine's
response headers, which vLLM and SGLang send before the first token. So the EPP's records carry
no first byte: no TTFT or TPOT histograms and no decode-time samples for the curves; durations,
codes, disconnects and (with ``sse_to_metadata``) token counts are recorded (docs/gateway.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from router.account.inflight import InflightTracker
from router.account.outcome import Outcome
from router.errors import NoBackend, PayloadTooLarge, RouterError, Unauthorized
from router.forward.admission import Admission
from router.forward.decider import Decider
from router.forward.proxy import slo_headers, wait_in_queue
from router.forward.request import check_path, has_api_key, inspect, upstream_body
from router.gateway.connections import Connections
from router.gateway.endpoints import Endpoints
from router.gateway.leases import Held, LeaseBook
from router.gateway.messages import Headers
from router.gateway.records import Ending
from router.health.state import HealthRegistry
from router.pools import POOLS, Pool
from router.settings import Settings
from router.upstream import verdicts

log = logging.getLogger("spec_router.gateway")


@dataclass(frozen=True, slots=True)
class Routed:
    """Where a request goes and what the gateway sends there."""

    endpoint: str  # ip:port
    pool: Pool
    reason: str
    body: bytes  # the body to hand back (the pool's default model filled in, if it named none)
    set_headers: Headers  # request headers to set (the pool's own key)
    remove_headers: tuple[str, ...]  # and to remove (the router's own key)


class GatewayMetrics:
    """The EPP's own counters (the rest are the proxy's: ``RouterMetrics``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        p = "spec_router_epp_"
        self.records = Counter(
            p + "access_log_records",
            "Envoy access-log records received, by what they ended: released (a lease of this "
            "EPP), elsewhere (released, but Envoy served it on another endpoint than picked), "
            "unknown (no lease here: a refusal, a request of another replica, or fail-open).",
            ["lease"], registry=registry,
        )  # fmt: skip
        self.expired = Counter(
            p + "leases_expired",
            "Leases let go because no access-log record came for them within the lease max age.",
            registry=registry,
        )  # fmt: skip
        self.orphaned = Counter(
            p + "leases_orphaned",
            "Leases let go because the gateway connection that asked for them went away (its "
            "access-log stream ended and it was not heard from again): no record will come.",
            registry=registry,
        )  # fmt: skip
        for lease in ("released", "elsewhere", "unknown"):
            self.records.labels(lease)


class Picker:
    def __init__(
        self,
        settings: Settings,
        decider: Decider,
        tracker: InflightTracker,
        health: HealthRegistry,
        admission: Admission,
        observers: list[Callable[[Outcome], None]],
        endpoints: Endpoints,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
        abort_lag: Callable[[str], float] | None = None,
        default_model: Callable[[Pool, str], str | None] | None = None,
    ) -> None:
        self.settings = settings
        self.decider = decider
        self.tracker = tracker
        self.health = health
        self.admission = admission
        self.observers = observers
        self.endpoints = endpoints
        self.metrics = metrics
        self.clock = clock
        self.abort_lag = abort_lag
        self.default_model = default_model
        self.book = LeaseBook()
        self._api_keys = [k.get_secret_value().encode() for k in settings.api_keys]
        self._pool_auth: Mapping[Pool, bytes | None] = {
            pool: settings.pool_authorization(pool) for pool in POOLS
        }
        self.connections = Connections()
        self.expired = 0
        self.orphaned = 0
        self.unknown = 0

    # -- the request ---------------------------------------------------------------------------
    def check_size(self, size: int) -> PayloadTooLarge | None:
        """A body of ``size`` bytes so far: too large? (checked as the chunks arrive)."""
        limit = self.settings.max_body_bytes
        if size > limit:
            return PayloadTooLarge(f"request body is larger than {limit} bytes")
        return None

    async def route(
        self,
        request_id: str,
        headers: Headers,
        path: str,
        body: bytes,
        subset: frozenset[str] | None,
        out: Outcome,
        source: str = "",
    ) -> Routed | RouterError:
        """Decide where the request goes and take its lease; or the refusal the proxy gives.
        ``source``: the gateway connection that asks (``router.gateway.connections``)."""
        try:
            return await self._route(request_id, headers, path, body, subset, out, source)
        except RouterError as exc:
            out.answered(exc.status)
            self._observe(out, self.clock())
            return exc
        except asyncio.CancelledError:  # the ext_proc stream ended while it waited in the queue
            out.client_left()
            self._observe(out, self.clock())
            raise

    async def _route(
        self,
        request_id: str,
        headers: Headers,
        path: str,
        body: bytes,
        subset: frozenset[str] | None,
        out: Outcome,
        source: str,
    ) -> Routed:
        if self._api_keys and not has_api_key(headers, self._api_keys):
            raise Unauthorized("invalid or missing API key")
        check_path(path)
        content_type = next((v for k, v in headers if k == b"content-type"), None)
        info = inspect(path, body, content_type)
        out.read(info.stream, info.sampling, info.prompt_chars)
        excluded = self.endpoints.excluded(subset)
        retry_after = self.settings.retry_after()
        if excluded and excluded.issuperset(self.endpoints.urls()):
            raise NoBackend("no endpoint of the gateway's subset hint is a backend", retry_after)
        decider = self.decider
        request = decider.request(info, *slo_headers(headers)) if decider.policy == "slo" else None
        out.request = request
        decision = decider.decide(request)
        if decision is None:
            raise NoBackend("no backend can take requests right now", retry_after)
        if decision.reason == "overflow" and self.admission.holds(decision.backend):
            decision = await wait_in_queue(
                decider,
                self.admission,
                request,
                out,
                retry_after,
                asyncio.get_running_loop(),
            )
        if decision.backend in excluded:
            # keep to the hint: another replica of the pool, else the other pool
            alt = decider.retry(decision, excluded)
            if alt is None:
                raise NoBackend(
                    "no backend of the gateway's subset hint can take requests right now",
                    retry_after,
                )
            decision = alt
        backend = decision.backend
        # everything that could fail before the lease is taken: nothing is held if it does
        endpoint = self.endpoints.endpoint(backend)
        named = None
        if info.fill_model and self.default_model is not None:
            named = self.default_model(decision.pool, backend)
        payload = upstream_body(info, body, {}, False, named)
        set_headers: Headers = []
        remove: tuple[str, ...] = ()
        key = self._pool_auth[decision.pool]
        if key is not None:  # the pool's own key replaces the client's
            set_headers.append((b"authorization", key))
        elif self._api_keys:  # the client's key is the router's: it must not reach the engine
            remove = ("authorization",)
        lease = self.tracker.acquire(backend, out if request is not None else None)
        self.book.open(request_id, Held(lease, out, self.clock(), source))
        out.attempt(
            decision.pool,
            backend,
            decision.reason,
            decision.load,
            decision.prefill_share,
            self.tracker.started[backend],
            decision.prefill,
        )
        return Routed(endpoint, decision.pool, decision.reason, payload, set_headers, remove)

    # -- its end -------------------------------------------------------------------------------
    def ended(self, end: Ending) -> None:
        """Envoy's record of a request: release its lease, judge its backend, observe it."""
        held = self.book.close(end.request_id)
        if held is None:
            self.unknown += 1
            self.metrics.records.labels("unknown").inc()
            return
        now = self.clock()
        out, backend = held.out, held.lease.backend
        served = None if end.upstream is None else self.endpoints.backend(end.upstream)
        elsewhere = served is not None and served != backend
        self.metrics.records.labels("elsewhere" if elsewhere else "released").inc()
        out.answered(end.status)
        if end.client_gone:
            out.client_left()
        failure = end.failure()
        verdict = None
        if failure is not None:
            kind, started = failure
            out.broke(kind)
            verdict = verdicts.mid_response(kind) if started else verdicts.after_error(kind, False)
        elif end.via_upstream and end.status:
            verdict = verdicts.after_status(end.status)
        if verdict is not None and not elsewhere:
            if verdict.failed:
                out.attempt_failed(verdict.kind)
            if verdict.eject:
                detail = f"{verdict.kind} (Envoy: {', '.join(sorted(end.flags)) or end.status})"
                self.health.eject(backend, now, detail)
            elif verdict.served:
                self.health.served(backend, now)
        out.counted(end.usage)
        lingers = end.client_gone and end.status < 400
        self._release(held, now, lingers)
        self._observe(out, now)

    def expire(self, max_age: float) -> int:
        """Let go of the leases no record came for within ``max_age`` seconds."""
        now = self.clock()
        gone = self.book.expired(now - max_age)
        for held in gone:
            self._release(held, now, lingers=False)
            log.warning(
                "no access-log record for a request routed to %s %.0f s ago: lease let go",
                held.lease.backend,
                now - held.since,
            )
        if gone:
            self.expired += len(gone)
            self.metrics.expired.inc(len(gone))
        return len(gone)

    def let_go(self, backend: str, why: str) -> int:
        """Stop counting the requests still on ``backend`` (its drain timed out: the member
        goes, ``router.membership``); the gateway carries them on, the EPP cannot end them.
        Their records, if they come, have no lease here. How many were let go."""
        now = self.clock()
        gone = self.book.on_backend(backend)
        for held in gone:
            self._release(held, now, lingers=False)
        return len(gone)  # (logged and counted by the membership, as the proxy's cuts are)

    def gateway_gone(self, source: str) -> int:
        """Let go of the requests the gateway connection ``source`` asked for: it went away
        (``router.gateway.connections``), so their records will not come. How many."""
        now = self.clock()
        gone = self.book.from_source(source)
        for held in gone:
            self._release(held, now, lingers=False)
        if gone:
            self.orphaned += len(gone)
            self.metrics.orphaned.inc(len(gone))
            log.warning(
                "the gateway connection %s went away: %d lease(s) let go", source, len(gone)
            )
        return len(gone)

    def _release(self, held: Held, now: float, lingers: bool) -> None:
        lease = held.lease
        lease.release()
        if lingers and self.abort_lag is not None:
            lag = self.abort_lag(lease.backend)
            if lag > 0:
                self.tracker.linger(lease.backend, now + lag)
        if self.admission.enabled:
            self.admission.released()

    def observe_refusal(self, out: Outcome) -> None:
        """A request refused before it was routed (a body too large, as it arrives)."""
        self._observe(out, self.clock())

    def _observe(self, out: Outcome, now: float) -> None:
        out.finish(now)
        for observe in self.observers:
            try:
                observe(out)
            except Exception:  # an observer must never break the picker
                log.exception("observer failed")

    def status(self) -> dict[str, int]:
        return {
            "leases": len(self.book),
            "expired": self.expired,
            "orphaned": self.orphaned,
            "unknown_records": self.unknown,
            **self.connections.status(),
        }
