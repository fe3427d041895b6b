"""Candidate: the same FastAPI pass-through with aiohttp as the upstream client.

Differs from ``fastapi_httpx.py`` only in the client, so the pair measures httpx against
aiohttp (whose response parser is in C) under FastAPI and Starlette's ``StreamingResponse``.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from _cli import serve
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask


def create_app(upstream: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=75)
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(
            upstream, connector=connector, timeout=timeout, auto_decompress=False
        ) as session:
            app.state.session = session
            yield

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/{path:path}")
    async def proxy(path: str, request: Request) -> Response:
        session: aiohttp.ClientSession = request.app.state.session
        payload = await request.json()
        response = await session.post(f"/v1/{path}", json=payload)
        if payload.get("stream"):
            return StreamingResponse(
                response.content.iter_any(),
                status_code=response.status,
                media_type="text/event-stream",
                background=BackgroundTask(response.release),
            )
        content = await response.read()
        response.release()
        return Response(content, response.status, media_type="application/json")

    return app


if __name__ == "__main__":
    sys.exit(serve(create_app, __doc__))
