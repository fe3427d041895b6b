"""What a proxied response's start and end, and a connection's keep-alive, cost under uvicorn's
httptools server, in process: the router's plain writes (``DirectSend.write_plain``) against
uvicorn's own ``send``, and uvicorn's keep-alive timer per response against the lean protocol's
one sweep (router/fastpath/lean.py). No socket; the transport only keeps what is written.

    taskset -c 0 python bench/lab/send_path.py --number 10000 --repeat 9

Prints the minimum and median over the repeats, in microseconds per response.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, cast

import uvloop
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

import router.fastpath.uvicorn as fast
from router.fastpath.lean import KeepAliveSweep
from router.fastpath.uvicorn import direct_send

# what the proxy sends for a stream (router.forward.proxy._relay), with uvicorn's defaults
HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-spec-router-pool", b"speculative"),
    (b"x-spec-router-reason", b"within_slo"),
    (b"x-spec-router-predicted-ttft-ms", b"12.3"),
    (b"x-spec-router-predicted-tpot-ms", b"4.56"),
]
DEFAULTS = [(b"server", b"uvicorn"), (b"date", b"Mon, 07 Dec 2026 00:00:00 GMT")]
START = {"type": "http.response.start", "status": 200, "headers": HEADERS}
FIRST = {"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True}
END = {"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False}


class Kept:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def cycle() -> Any:
    transport = Kept()
    return RequestResponseCycle(
        scope=cast(Any, {"type": "http", "method": "POST", "headers": []}),
        transport=transport,  # type: ignore[arg-type]
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=logging.getLogger("bench"),
        access_logger=logging.getLogger("bench.access"),
        access_log=False,
        default_headers=DEFAULTS,
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=True,
        on_response=lambda: None,
    )


async def responses(number: int, plain: bool) -> float:
    saved = fast._PLAIN
    fast._PLAIN = saved if plain else None
    try:
        senders = [direct_send(cycle().send) for _ in range(number)]
        began = time.perf_counter()
        for sender in senders:
            assert sender is not None
            await sender.send_all([START, FIRST])
            await sender.send_all([END])
        return (time.perf_counter() - began) / number
    finally:
        fast._PLAIN = saved


class Idle:
    idle_since: float | None = None

    def timeout_keep_alive_handler(self) -> None:
        pass


async def keep_alive(number: int, sweep: bool) -> float:
    """``number`` connections each answered, then reading again (or closed) a while later:
    uvicorn's timer is made at the answer and cancelled at the read, the sweep's entry is
    filed and left (the sweep itself runs later, once per grain)."""
    loop = asyncio.get_running_loop()
    shared = KeepAliveSweep(loop)
    idle = [Idle() for _ in range(number)]
    began = time.perf_counter()
    if sweep:
        for protocol in idle:
            protocol.idle_since = now = loop.time()
            shared.idle(protocol, now, now + 5.0)
        for protocol in idle:
            protocol.idle_since = None
    else:
        timers = [loop.call_later(5.0, p.timeout_keep_alive_handler) for p in idle]
        for timer in timers:
            timer.cancel()
    await asyncio.sleep(0)  # (uvloop frees a cancelled timer's handle in a later turn)
    return (time.perf_counter() - began) / number


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--number", type=int, default=10000)
    p.add_argument("--repeat", type=int, default=9)
    args = p.parse_args(argv)
    n = args.number
    cases: dict[str, Callable[[], Coroutine[Any, Any, float]]] = {
        "start+first, end: uvicorn's send": lambda: responses(n, False),
        "start+first, end: plain writes": lambda: responses(n, True),
        "keep-alive: uvicorn's timer": lambda: keep_alive(n, False),
        "keep-alive: one sweep": lambda: keep_alive(n, True),
    }
    runs: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeat):  # (alternating, so a slow spell hits every case)
        for name, case in cases.items():
            runs[name].append(uvloop.run(case()) * 1e6)
    for name, us in runs.items():
        print(f"{name:36s} min {min(us):6.2f}  median {statistics.median(us):6.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
