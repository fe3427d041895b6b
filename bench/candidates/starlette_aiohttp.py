"""Candidate: Starlette routing + ``StreamingResponse`` + aiohttp, without FastAPI.

Against ``fastapi_aiohttp.py`` it measures FastAPI's layer; against ``asgi_aiohttp.py`` it
measures Starlette's ``Request``/``StreamingResponse``. The body is passed through as bytes.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from _cli import serve
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


def create_app(upstream: str) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=75)
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(
            upstream, connector=connector, timeout=timeout, auto_decompress=False
        ) as session:
            app.state.session = session
            yield

    async def proxy(request: Request) -> Response:
        session: aiohttp.ClientSession = request.app.state.session
        body = await request.body()
        response = await session.post(
            request.url.path, data=body, headers={"content-type": "application/json"}
        )
        content_type = response.headers.get("content-type", "application/json")
        if content_type.startswith("text/event-stream"):
            return StreamingResponse(
                response.content.iter_any(),
                status_code=response.status,
                media_type=content_type,
                background=BackgroundTask(response.release),
            )
        content = await response.read()
        response.release()
        return Response(content, response.status, media_type=content_type)

    routes = [Route("/v1/{path:path}", proxy, methods=["POST"])]
    return Starlette(routes=routes, lifespan=lifespan)


if __name__ == "__main__":
    sys.exit(serve(create_app, __doc__))
