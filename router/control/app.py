"""The router's own endpoints: liveness, readiness, metrics, status, models, admin.

A FastAPI app, deliberately off the ``/v1/*`` hot path. Errors use the OpenAI error shape like
everything else the router answers.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from router.account.inflight import POOLS
from router.decide import table as tables
from router.errors import BadRequest, NoBackend, RouterError, Unauthorized, error_body
from router.forward.request import has_api_key
from router.forward.upstream import Timeouts, UpstreamError
from router.health.state import usable

if TYPE_CHECKING:
    from router.app import RouterApp

_STATUS_TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error"}


def _error(status: int, message: str, code: str, headers: dict[str, str] | None = None) -> Response:
    type_ = _STATUS_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return Response(
        error_body(message, type_, code), status, headers, media_type="application/json"
    )


def require_admin(app: RouterApp, request: Request) -> Response | None:
    token = app.settings.admin_token
    if token is None:
        return _error(
            403, "admin endpoints are disabled: set SPEC_ROUTER_ADMIN_TOKEN", "admin_disabled"
        )
    given = request.headers.get("authorization", "")
    secret = token.get_secret_value()
    if not hmac.compare_digest(given.encode(), f"Bearer {secret}".encode()):
        return _error(401, "invalid or missing admin token", "invalid_admin_token")
    return None


def _connections(app: RouterApp, url: str) -> dict[str, int]:
    client = app.clients.get(url)
    if client is None:
        return {"open": 0, "idle": 0, "busy": 0}
    opened, idle = client.open_connections, client.idle_connections
    return {"open": opened, "idle": idle, "busy": opened - idle}


def status_document(app: RouterApp) -> dict[str, Any]:
    router = app.router
    now = router.clock()
    wall = time.time()

    def ago(t: float | None) -> float | None:
        return None if t is None else round(now - t, 3)

    pools: dict[str, Any] = {}
    for pool in POOLS:
        backends = []
        for url in app.pools[pool]:
            h = app.health.states[url]
            seen = router.engine.get(url)
            backends.append(
                {
                    "url": url,
                    "state": h.state.value,
                    "usable": usable(h, now),
                    "in_flight": app.tracker.by_backend[url],
                    "load": router.backend_load(url),
                    "weight": round(app.health.weight(url, now), 3),
                    "last_check": None if h.last_check is None else wall - (now - h.last_check),
                    "last_check_age_s": ago(h.last_check),
                    "checks": h.checks,
                    "consecutive_failures": h.failures,
                    "consecutive_successes": h.successes,
                    "last_error": h.last_error,
                    "ejected_for_s": round(max(0.0, h.ejected_until - now), 3),
                    "ejections": h.ejections,
                    "connections": _connections(app, url),
                    "engine": None
                    if seen is None
                    else {
                        "flavor": seen.flavor,
                        "running": seen.running,
                        "queued": seen.queued,
                        "spec_accept_length": seen.accept_length,
                        "age_s": ago(seen.scraped_at),
                    },
                }
            )
        pools[pool] = {
            "usable": any(b["usable"] for b in backends),
            "in_flight": app.tracker.by_pool[pool],
            "slow_clients": app.tracker.slow_clients[pool],
            "backends": backends,
        }
    keeper = app.keeper
    learner = keeper.learner
    return {
        "policy": router.policy,
        "crossover": router.crossover,
        "crossover_source": router.crossover_source,
        "learning": {
            "enabled": keeper.learning,
            "pinned": keeper.pinned,
            "target": learner.target(),
            "samples": {pool: learner.pools[pool].samples for pool in POOLS},
            "acceptance_length": learner.tau,
            "reference_acceptance_length": learner.ref_tau,
            "explore_share": router.explore_share,
        },
        "hysteresis": router.hysteresis,
        "load_signal": router.load_signal,
        "in_flight": app.tracker.snapshot(),
        "pools": pools,
        "busy_poll": {
            "window_us": app.settings.busy_poll_us,
            "spinning": app.busy is not None and app.busy.running,
            "turns": 0 if app.busy is None else app.busy.spins,
        },
    }


async def _fetch_json(app: RouterApp, url: str, pool: str, path: bytes) -> Any:
    s = app.settings
    timeouts = Timeouts(s.connect_timeout, s.health_timeout * 5, s.health_timeout * 5)
    key = s.pool_api_key(pool)
    headers = (
        [] if key is None else [(b"authorization", b"Bearer " + key.get_secret_value().encode())]
    )
    conn = await app.clients[url].request(b"GET", path, headers, b"", timeouts)
    try:
        parts = []
        while chunk := await conn.read():
            parts.append(chunk)
        if conn.status != 200:
            raise UpstreamError("status", f"{url}{path.decode()}: HTTP {conn.status}")
        return json.loads(b"".join(parts))
    finally:
        conn.release()


async def list_models(app: RouterApp) -> dict[str, Any]:
    """The union of the models both pools serve, under their public names."""
    now = app.router.clock()
    tasks = []
    for pool in POOLS:
        url = next((u for u in app.pools[pool] if app.health.usable(u, now)), None)
        if url is not None:
            tasks.append((pool, _fetch_json(app, url, pool, b"/v1/models")))
    if not tasks:
        raise NoBackend(
            "no backend can list models right now", max(1, round(app.settings.health_interval))
        )
    results = await asyncio.gather(*(t for _, t in tasks), return_exceptions=True)
    seen: dict[str, Any] = {}
    for (pool, _), result in zip(tasks, results, strict=True):
        if isinstance(result, BaseException) or not isinstance(result, dict):
            continue
        public = {v: k for k, v in app.settings.pool_model_map(pool).items()}
        for entry in result.get("data", []):
            if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                served: str = entry["id"]
                name = public.get(served, served)
                seen.setdefault(name, {**entry, "id": name})
    if not seen:
        raise NoBackend(
            "no backend answered /v1/models", max(1, round(app.settings.health_interval))
        )
    return {"object": "list", "data": list(seen.values())}


def build_control_app(app: RouterApp) -> FastAPI:
    api = FastAPI(title="spec-router", docs_url=None, redoc_url=None, openapi_url=None)

    @api.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = "not_found" if exc.status_code == 404 else f"http_{exc.status_code}"
        message = (
            f"no route for {request.method} {request.url.path}"
            if exc.status_code == 404
            else str(exc.detail)
        )
        return _error(exc.status_code, message, code)

    @api.exception_handler(RouterError)
    async def router_error(request: Request, exc: RouterError) -> Response:
        return Response(
            exc.body(),
            exc.status,
            dict((k.decode(), v.decode()) for k, v in exc.headers),
            media_type="application/json",
        )

    @api.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        return _error(
            400, f"invalid request: {exc.errors()[0].get('msg', 'invalid')}", "invalid_request"
        )

    @api.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/ready")
    async def ready() -> Response:
        pools = {pool: app.router.pool_usable(pool) for pool in POOLS}
        ok = any(pools.values())
        body = {"ready": ok, "pools": pools}
        return JSONResponse(body, 200 if ok else 503)

    @api.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(app.registry), media_type=CONTENT_TYPE_LATEST)

    @api.get("/router/status")
    async def status() -> dict[str, Any]:
        return status_document(app)

    api_keys = [k.get_secret_value().encode() for k in app.settings.api_keys]

    @api.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        if api_keys and not has_api_key(request.scope["headers"], api_keys):
            raise Unauthorized("invalid or missing API key")
        return await list_models(app)

    @api.put("/router/crossover")
    async def set_crossover(request: Request) -> Response:
        denied = require_admin(app, request)
        if denied is not None:
            return denied
        try:
            value = json.loads(await request.body()).get("crossover")
        except (ValueError, AttributeError):
            value = None
        if type(value) is not int or value < 0:
            raise BadRequest('expected {"crossover": <non-negative integer>}')
        app.router.set_crossover(value, "configured")
        return JSONResponse({"crossover": value, "crossover_source": "configured"})

    @api.get("/router/table")
    async def get_table() -> dict[str, Any]:
        return tables.to_json(app.keeper.table())

    @api.put("/router/table")
    async def put_table(request: Request) -> Response:
        denied = require_admin(app, request)
        if denied is not None:
            return denied
        try:
            raw = json.loads(await request.body())
        except ValueError as exc:
            raise BadRequest(f"table is not valid JSON: {exc}", "invalid_json") from None
        try:
            table = app.keeper.replace(raw)
        except tables.TableError as exc:
            raise BadRequest(f"table refused: {exc}", "invalid_table") from None
        return JSONResponse({"crossover": table.crossover, "crossover_source": table.source})

    @api.api_route("/v1/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"])
    async def not_started(rest: str) -> Response:
        # Only reached before the lifespan started the proxy.
        return _error(503, "the router is starting", "starting", {"retry-after": "1"})

    return api
