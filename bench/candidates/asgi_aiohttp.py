"""Candidate: a raw ASGI handler + aiohttp: no framework between uvicorn and the client.

Reads the request body from ``receive``, forwards it as bytes, and sends each upstream read as
one ``http.response.body`` message; a response with a Content-Length is sent in one piece.
"""

from __future__ import annotations

import sys
from typing import Any

import aiohttp
from _cli import serve

Scope = dict[str, Any]
Message = dict[str, Any]


class Proxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        elif scope["type"] == "http":
            await self.proxy(scope, receive, send)

    async def lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.session = aiohttp.ClientSession(
                    self.upstream,
                    connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=75),
                    timeout=aiohttp.ClientTimeout(total=None),
                    auto_decompress=False,
                )
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def proxy(self, scope: Scope, receive: Any, send: Any) -> None:
        assert self.session is not None
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        async with self.session.request(
            scope["method"], scope["path"], data=body, headers={"content-type": "application/json"}
        ) as response:
            headers = [(b"content-type", response.headers.get("content-type", "").encode())]
            length = response.headers.get("content-length")
            if length is not None:
                content = await response.read()
                headers.append((b"content-length", length.encode()))
                await send(
                    {"type": "http.response.start", "status": response.status, "headers": headers}
                )
                await send({"type": "http.response.body", "body": content})
                return
            await send(
                {"type": "http.response.start", "status": response.status, "headers": headers}
            )
            async for chunk in response.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})


if __name__ == "__main__":
    sys.exit(serve(Proxy, __doc__))
