"""What the server's shape costs per request, in-process: no socket, no proxying, no router code.

The router's request path runs under uvicorn's httptools server (the router's own subclass of
its protocol, router/fastpath/protocol.py) as an ASGI task per request, which waits for the
upstream's head, first event and end. ``bench/candidates/router_callbacks.py`` runs the same
per-request router code from socket callbacks, and that shape met the streaming tail target
where the router did not (issue 14, bench/results/overhead-harnesses.md). This measures the
difference with the router's code taken out, on a transport that only counts writes:

- ``callbacks``: an httptools protocol that answers from ``on_message_complete`` (the shape of
  http_floor and router_callbacks);
- ``uvicorn+task``: the router's uvicorn protocol and a trivial ASGI app that reads the body and
  sends a start and a body in one write, through ``DirectSend.send_all`` as the proxy does
  (what every request pays before the router does anything);
- ``+3 wakes``: the same app waiting three times on a future another callback resolves, as the
  proxy waited for the upstream (its head, its first event, its end); ``+2 wakes``: twice, as
  it waits since the upstream connection holds the head until the first event;
- ``lane``, ``lane +2 wakes``: the same app on the router's lane (router/fastpath/lane.py): the
  router's protocol gives the request its own ``LaneCycle``, and the app answers through it;
- ``plain uvicorn``: ``uvicorn+task`` with uvicorn's own httptools protocol, not the router's
  subclass (what the router's request deadline and limits cost);
- ``loop turn``: one ``await asyncio.sleep(0)`` of the driver, included in each of the above
  (once for ``callbacks``, one or more times for the others).

    taskset -c 0 python bench/lab/server_shape.py --number 20000 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import httptools
import uvicorn
import uvloop
from chunk_path import CountingTransport
from uvicorn.server import ServerState

from router.fastpath.lane import LaneCycle
from router.fastpath.protocol import http_protocol
from router.fastpath.uvicorn import DirectSend, direct_send

REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n"
    b"authorization: Bearer x\r\naccept: */*\r\nuser-agent: bench\r\ncontent-length: 2\r\n\r\n{}"
)
START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")],
}
BODY = {"type": "http.response.body", "body": b"ok", "more_body": False}
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok"


class Callbacks(asyncio.Protocol):
    """Parses each request and answers it from the parser's callback."""

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.url, self.headers, self.body = b"", [], []
        self.transport.write(ANSWER)


def app_with(wakes: int, lane: bool = False) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        loop = asyncio.get_running_loop()
        await receive()
        for _ in range(wakes):
            waiter = loop.create_future()
            loop.call_soon(waiter.set_result, None)
            await waiter
        # as the proxy answers under this server (router.fastpath.Responders)
        responder = send.__self__ if lane else direct_send(send)
        assert isinstance(responder, LaneCycle if lane else DirectSend)
        await responder.send_all([START, BODY])

    if not lane:
        return app

    class Laned:
        """An app that, as ``RouterApp`` does, names the handler the lane runs."""

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            raise AssertionError("the request should have run on the lane")

        def spec_router_lane(self, path: str) -> Any:
            return app

    return Laned()


async def loop_turn(number: int) -> float:
    began = time.process_time()
    for _ in range(number):
        await asyncio.sleep(0)
    return (time.process_time() - began) / number


async def callbacks(number: int) -> float:
    protocol, transport = Callbacks(), CountingTransport()
    protocol.connection_made(transport)
    began = time.process_time()
    for _ in range(number):
        protocol.data_received(REQUEST)
        await asyncio.sleep(0)
    elapsed = time.process_time() - began
    assert transport.writes == number
    return elapsed / number


async def uvicorn_task(
    number: int, wakes: int, router_protocol: bool = True, lane: bool = False
) -> float:
    loop = asyncio.get_running_loop()
    config = uvicorn.Config(
        app_with(wakes, lane),
        http=http_protocol(30.0) if router_protocol else "httptools",
        lifespan="off",
        access_log=False,
        server_header=False,
        date_header=False,
        proxy_headers=False,
        log_level="warning",
    )
    config.load()
    protocol: Any = config.http_protocol_class(  # type: ignore[call-arg]
        config=config, server_state=ServerState(), app_state={}, _loop=loop
    )
    transport = CountingTransport()
    protocol.connection_made(transport)
    began = time.process_time()
    for _ in range(number):
        protocol.data_received(REQUEST)
        while protocol.tasks:
            await asyncio.sleep(0)
    elapsed = time.process_time() - began
    assert transport.writes == number, transport.writes  # (the start and body in one write)
    protocol.connection_lost(None)
    return elapsed / number


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--number", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    n = args.number
    shapes: dict[str, Callable[[], Coroutine[Any, Any, float]]] = {
        "callbacks": lambda: callbacks(n),
        "uvicorn+task": lambda: uvicorn_task(n, 0),
        "+3 wakes": lambda: uvicorn_task(n, 3),
        "+2 wakes": lambda: uvicorn_task(n, 2),
        "lane": lambda: uvicorn_task(n, 0, lane=True),
        "lane +2 wakes": lambda: uvicorn_task(n, 2, lane=True),
        "plain uvicorn": lambda: uvicorn_task(n, 0, router_protocol=False),
        "loop turn": lambda: loop_turn(n),
    }
    for name, shape in shapes.items():
        runs = [uvloop.run(shape()) * 1e6 for _ in range(args.repeat)]
        print(f"{name:14s} " + ", ".join(f"{us:6.1f}" for us in runs) + " us per request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
