"""The router's own endpoints: liveness, readiness, metrics, status, models, admin, live page.

A FastAPI app, deliberately off the ``/v1/*`` hot path. Errors use the OpenAI error shape like
everything else the router answers. It sees the router only through ``Controlled``: the views
and the two operator actions the router exposes, so it imports nothing of the app.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from router.control.controlled import Controlled
from router.control.page import add_page
from router.control.plan import add_plan
from router.decide import table as tables
from router.errors import BadRequest, NotFound, RouterError, Unauthorized, error_body
from router.forward.request import has_api_key
from router.members.store import MembershipError
from router.membership import member_document
from router.pools import POOLS, Pool

_STATUS_TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error"}


def _error(status: int, message: str, code: str, headers: dict[str, str] | None = None) -> Response:
    type_ = _STATUS_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return Response(
        error_body(message, type_, code), status, headers, media_type="application/json"
    )


def require_admin(app: Controlled, request: Request) -> Response | None:
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


_POOLS: dict[str, Pool] = {pool: pool for pool in POOLS}


def _pool(name: str) -> Pool:
    pool = _POOLS.get(name)
    if pool is None:
        raise NotFound(f"no pool {name!r}: the pools are {', '.join(POOLS)}")
    return pool


def _url(body: bytes) -> str:
    try:
        url = json.loads(body).get("url")
    except (ValueError, AttributeError):
        url = None
    if not isinstance(url, str) or not url:
        raise BadRequest('expected {"url": "<the backend\'s URL>"}', "invalid_request")
    return url


def build_control_app(app: Controlled) -> FastAPI:
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
        pools = app.usable_pools()
        ok = any(pools.values())
        body = {"ready": ok, "pools": pools}
        return JSONResponse(body, 200 if ok else 503)

    @api.get("/metrics")
    async def metrics() -> Response:
        return Response(app.metrics_text(), media_type=CONTENT_TYPE_LATEST)

    @api.get("/router/status")
    async def status() -> dict[str, Any]:
        return app.status()

    api_keys = [k.get_secret_value().encode() for k in app.settings.api_keys]

    @api.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        if api_keys and not has_api_key(request.scope["headers"], api_keys):
            raise Unauthorized("invalid or missing API key")
        return await app.list_models()

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
        app.pin_crossover(value)
        return JSONResponse({"crossover": value, "crossover_source": "configured"})

    @api.get("/router/table")
    async def get_table() -> dict[str, Any]:
        return tables.to_json(app.table())

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
            table = app.replace_table(raw)
        except tables.TableError as exc:
            raise BadRequest(f"table refused: {exc}", "invalid_table") from None
        return JSONResponse(
            {
                "crossover": table.crossover,  # null: none measured up to measured_up_to
                "crossover_source": table.source,
                "measured_up_to": table.measured_up_to,
            }
        )

    @api.get("/router/pools/{pool}/backends")
    async def list_backends(pool: str) -> Response:
        name = _pool(pool)
        now = app.clock()
        flight = app.in_flight()
        return JSONResponse(
            {"pool": name, "backends": [member_document(m, now, flight) for m in app.members(name)]}
        )

    @api.post("/router/pools/{pool}/backends")
    async def add_backend(pool: str, request: Request) -> Response:
        denied = require_admin(app, request)
        if denied is not None:
            return denied
        name = _pool(pool)
        url = _url(await request.body())
        try:
            member = app.add_backend(name, url)
        except ValueError as exc:
            raise BadRequest(f"bad backend URL: {exc}", "invalid_url") from None
        except MembershipError as exc:
            return _error(exc.status, exc.message, exc.code)
        return JSONResponse(member_document(member, app.clock(), app.in_flight()), 201)

    @api.delete("/router/pools/{pool}/backends")
    async def remove_backend(pool: str, request: Request) -> Response:
        denied = require_admin(app, request)
        if denied is not None:
            return denied
        name = _pool(pool)
        url = request.query_params.get("url")
        if not url:
            raise BadRequest("expected ?url=<the backend's URL>", "missing_url")
        try:
            member = app.remove_backend(name, url)
        except MembershipError as exc:
            return _error(exc.status, exc.message, exc.code)
        # 202: it drains; it is gone once its requests in flight have ended
        return JSONResponse(member_document(member, app.clock(), app.in_flight()), 202)

    add_page(api, app)
    add_plan(api, app)

    @api.api_route("/v1/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"])
    async def not_started(rest: str) -> Response:
        # Only reached before the lifespan started the proxy.
        return _error(503, "the router is starting", "starting", {"retry-after": "1"})

    return api
