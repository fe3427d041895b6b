"""The router's own per-chunk code, timed in-process: no socket, no event loop turn.

One upstream ``Connection`` (router/forward/upstream.py) in the middle of a chunked SSE response,
diverted to a sink built the way ``Proxy._divert`` builds it (ready check, SSE tap that strips
the usage it asked for, chunk framing) writing to a transport that only counts. Each iteration
feeds one chunk of bench/fake_backend.py's shape to ``data_received``: what the router does per
chunk on top of the read and the write that any proxy, a TCP pipe included, makes.

    python bench/chunk_path.py --chunks 200000 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from router.forward.stream import SseTap
from router.forward.upstream import Connection, Origin, OriginPool

EVENT = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"bench-model","choices":[{"index":0,"delta":{"content":" tok3"},'
    b'"finish_reason":null}]}\n\n'
)
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


class CountingTransport:
    def __init__(self) -> None:
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def abort(self) -> None:
        pass


async def per_chunk(chunks: int) -> float:
    """Microseconds per chunk through ``data_received`` and the sink."""
    origin = Origin.parse("http://127.0.0.1:9")
    pool = OriginPool(origin, max_connections=1, max_idle=1, keepalive_expiry=5.0)
    conn = Connection(pool)
    conn.connection_made(CountingTransport())  # type: ignore[arg-type]
    conn.data_received(HEAD)
    client = CountingTransport()
    flow: Any = type("Flow", (), {"write_paused": False})()
    tap = SseTap(strip_usage=True)
    out: Any = type("Outcome", (), {"first_byte": 1.0})()  # (the first byte is long past)

    def ready() -> bool:  # as DirectSend.ready
        return not (flow.write_paused or client.is_closing())

    def write(data: bytes) -> None:  # as DirectSend.write
        client.write(b"%x\r\n%b\r\n" % (len(data), data))

    feed = tap.feed

    def sink(data: bytes) -> bool:  # as Proxy._divert's
        if not ready():
            return False
        if out.first_byte is None:
            raise AssertionError("not reached")
        data = feed(data)
        if data:
            write(data)
        return True

    conn.divert(sink)
    frame = b"%x\r\n%b\r\n" % (len(EVENT), EVENT)
    began = time.perf_counter()
    for _ in range(chunks):
        conn.data_received(frame)
    elapsed = time.perf_counter() - began
    assert client.writes == chunks, client.writes
    return 1e6 * elapsed / chunks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    runs = [asyncio.run(per_chunk(args.chunks)) for _ in range(args.repeat)]
    print("per chunk: " + ", ".join(f"{us:.2f}" for us in runs) + " µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
