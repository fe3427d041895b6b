"""Candidate: a plain FastAPI + httpx pass-through, as typical projects write it.

The one change from the typical version: httpx's connection limit is raised from its default
of 100, so 256 streams are not queued behind it; this measures the stack, not that default.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from _cli import serve
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask


def create_app(upstream: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=1024)
        async with httpx.AsyncClient(base_url=upstream, timeout=None, limits=limits) as client:
            app.state.client = client
            yield

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/{path:path}")
    async def proxy(path: str, request: Request) -> Response:
        client: httpx.AsyncClient = request.app.state.client
        payload = await request.json()
        upstream_request = client.build_request("POST", f"/v1/{path}", json=payload)
        response = await client.send(upstream_request, stream=True)
        if payload.get("stream"):
            return StreamingResponse(
                response.aiter_raw(),
                status_code=response.status_code,
                media_type="text/event-stream",
                background=BackgroundTask(response.aclose),
            )
        content = await response.aread()
        await response.aclose()
        return Response(content, response.status_code, media_type="application/json")

    return app


if __name__ == "__main__":
    sys.exit(serve(create_app, __doc__))
