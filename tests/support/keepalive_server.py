"""A server of the router's protocol with a short keep-alive, answering every request with a
small 200 (after ``SLOW`` seconds for ``/slow``; before reading its body for ``/early``):
``python -m tests.support.keepalive_server KEEP_ALIVE``. For the keep-alive timer's tests
(tests/fastpath/test_keep_alive_e2e.py): the router's own keep-alive is CLIENT_KEEP_ALIVE."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from router.serving import AnnouncingServer, bind_socket, socket_url, uvicorn_config

SLOW = 1.0


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] != "/early":  # (/early answers before its body is in, as a 401 does)
        while (await receive()).get("more_body"):
            pass
    if scope["path"] == "/slow":
        await asyncio.sleep(SLOW)
    body = b"ok"
    headers = [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    sock = bind_socket("127.0.0.1", 0)
    config = uvicorn_config(app, keep_alive=float(sys.argv[1]), request_timeout=30.0)
    config.lifespan = "off"
    AnnouncingServer(config, socket_url(sock)).run(sockets=[sock])


if __name__ == "__main__":
    main()
