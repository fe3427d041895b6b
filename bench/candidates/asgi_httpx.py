"""Candidate: the same raw ASGI handler as ``asgi_aiohttp.py`` with httpx as the client.

The pair isolates the upstream client: same handler, same server, only the client differs.
"""

from __future__ import annotations

import sys
from typing import Any

import httpx
from _cli import serve

Scope = dict[str, Any]


class Proxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.client: httpx.AsyncClient | None = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        elif scope["type"] == "http":
            await self.proxy(scope, receive, send)

    async def lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                limits = httpx.Limits(max_connections=None, max_keepalive_connections=1024)
                self.client = httpx.AsyncClient(base_url=self.upstream, timeout=None, limits=limits)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.client is not None:
                    await self.client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def proxy(self, scope: Scope, receive: Any, send: Any) -> None:
        assert self.client is not None
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        request = self.client.build_request(
            scope["method"],
            scope["path"],
            content=body,
            headers={"content-type": "application/json"},
        )
        response = await self.client.send(request, stream=True)
        try:
            headers = [(b"content-type", response.headers.get("content-type", "").encode())]
            length = response.headers.get("content-length")
            if length is not None:
                content = await response.aread()
                headers.append((b"content-length", length.encode()))
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status_code,
                        "headers": headers,
                    }
                )
                await send({"type": "http.response.body", "body": content})
                return
            await send(
                {"type": "http.response.start", "status": response.status_code, "headers": headers}
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()


if __name__ == "__main__":
    sys.exit(serve(Proxy, __doc__))
