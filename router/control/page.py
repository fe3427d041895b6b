"""``GET /router/ui``: the live page, its assets and its feed. Read-only: GET and HEAD only.

The assets are files of this package (``router/control/ui/``, read once at start-up): no build
step and no network at run time. When ``API_KEYS`` is set the page, its assets and its feed
need a key like ``/v1/*``: as a header (``Authorization: Bearer`` or ``x-api-key``), or, since a
browser's ``EventSource`` cannot send headers, as ``?key=`` on the page's address. A key given
that way is put in a cookie for ``/router/ui`` (HttpOnly, SameSite=Strict) that the assets and
the feed then send by themselves.
"""

from __future__ import annotations

import hmac
from importlib import resources
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from router.asgi import Receive, Scope, Send
from router.control.feed import Feed
from router.errors import Unauthorized, error_body
from router.forward.request import has_api_key

if TYPE_CHECKING:
    from router.control.controlled import Controlled

PREFIX = "/router/ui"
COOKIE = "spec_router_key"
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".md": "text/plain; charset=utf-8",
    ".LICENSE": "text/plain; charset=utf-8",
}
# Nothing but this origin: the page reads the feed and its own files, and cannot be framed.
SECURITY = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def load_assets() -> dict[str, tuple[bytes, str]]:
    """Every file under ``router/control/ui/``: relative path -> (bytes, content type)."""
    root = resources.files("router.control").joinpath("ui")
    assets: dict[str, tuple[bytes, str]] = {}

    def walk(node: resources.abc.Traversable, prefix: str) -> None:
        for child in node.iterdir():
            name = prefix + child.name
            if child.is_dir():
                walk(child, name + "/")
            else:
                suffix = "." + child.name.rsplit(".", 1)[-1]
                assets[name] = (child.read_bytes(), TYPES.get(suffix, "application/octet-stream"))

    walk(root, "")
    return assets


class FeedResponse(Response):
    """The feed as a response: ``Feed.serve`` runs the whole exchange (and releases it)."""

    def __init__(self, feed: Feed) -> None:
        super().__init__()
        self.feed = feed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.feed.serve(receive, send)


def _matches(given: str, keys: list[bytes]) -> bool:
    token = given.encode()
    ok = False
    for key in keys:  # compare with every key: the time taken reveals nothing
        ok |= hmac.compare_digest(token, key)
    return ok


def add_page(api: FastAPI, app: Controlled) -> None:
    assets = load_assets()
    index = assets["index.html"][0]
    keys = [k.get_secret_value().encode() for k in app.settings.api_keys]

    def check(request: Request) -> bool:
        """Whether the request may see the page; True when the key came in the query."""
        if not keys or has_api_key(request.scope["headers"], keys):
            return False
        if _matches(request.cookies.get(COOKIE, ""), keys):
            return False
        if _matches(request.query_params.get("key", ""), keys):
            return True
        raise Unauthorized(
            "invalid or missing API key: send it as a header, or open /router/ui?key=<key>"
        )

    @api.api_route(PREFIX + "/events", methods=["GET"])
    async def events(request: Request) -> Response:
        check(request)
        return FeedResponse(app.feed)

    @api.api_route(PREFIX, methods=["GET", "HEAD"])
    async def bare(request: Request) -> Response:
        # The page's own addresses are relative (its files, its feed): serve it at the
        # directory address, so that they resolve under /router/ui/ behind any path prefix.
        query = request.url.query
        return RedirectResponse("ui/" + (f"?{query}" if query else ""), 307)

    @api.api_route(PREFIX + "/", methods=["GET", "HEAD"])
    async def page(request: Request) -> Response:
        from_query = check(request)
        headers = {**SECURITY, "cache-control": "no-store"}
        response = Response(index, 200, headers, media_type=TYPES[".html"])
        if from_query:
            response.set_cookie(
                COOKIE,
                request.query_params["key"],
                path=PREFIX,
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        return response

    @api.api_route(PREFIX + "/{name:path}", methods=["GET", "HEAD"])
    async def asset(name: str, request: Request) -> Response:
        check(request)
        found = assets.get(name)
        if found is None:
            body = error_body(f"no such file: {name}", "invalid_request_error", "not_found")
            return Response(body, 404, media_type="application/json")
        body, media_type = found
        headers = {**SECURITY, "cache-control": "no-cache"}
        return Response(body, 200, headers, media_type=media_type)
