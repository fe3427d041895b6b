"""The router's own per-chunk code, timed in-process: no socket, no event loop turn.

One upstream ``Connection`` (router/upstream/client.py) in the middle of a chunked SSE response,
diverted to the sink ``Proxy._divert`` asks ``DirectSend`` for (ready check, SSE tap that
strips the usage it asked for, chunk framing) writing to a transport that only counts. Each
iteration feeds one chunk of bench/fake_backend.py's shape to ``data_received``: what the
router does per chunk on top of the read and the write that any proxy, a TCP pipe included,
makes.

    python bench/lab/chunk_path.py --chunks 200000 --repeat 3
    python bench/lab/chunk_path.py --tap    # and the SSE tap alone per read shape (timeit, best of)
    python bench/lab/chunk_path.py --whole  # also with the whole-chunk pass-through (callback path)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import timeit
from typing import Any

from router.fastpath.responder import chunk_whole
from router.fastpath.uvicorn import DirectSend
from router.origin import Origin
from router.upstream.client import Connection, OriginPool
from router.upstream.stream import SseTap

EVENT = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"bench-model","choices":[{"index":0,"delta":{"content":" tok3"},'
    b'"finish_reason":null}]}\n\n'
)
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


class CountingTransport:
    """A transport that counts writes (here and in bench/lab/server_shape.py)."""

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

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )


async def per_chunk(chunks: int, whole: bool = False) -> float:
    """Microseconds per chunk through ``data_received`` and the sink (``whole``: with
    ``chunk_whole`` offered each whole chunk first, as the callback path diverts)."""
    origin = Origin.parse("http://127.0.0.1:9")
    pool = OriginPool(origin, max_connections=1, max_idle=1, keepalive_expiry=5.0)
    conn = Connection(pool)
    conn.connection_made(CountingTransport())  # type: ignore[arg-type]
    conn.data_received(HEAD)
    client = CountingTransport()
    # uvicorn's request cycle as DirectSend sees it, mid-way through a chunked response
    cycle: Any = type("Cycle", (), {})()
    cycle.flow = type("Flow", (), {"write_paused": False})()
    cycle.transport, cycle.disconnected = client, False
    cycle.response_started, cycle.chunked_encoding, cycle.response_complete = True, True, False
    cycle.scope = {"method": "POST"}
    tap = SseTap(strip_usage=True)
    # the sink Proxy._divert asks for, the first byte long past
    direct = DirectSend(None, cycle)
    sink = direct.body_sink(tap.feed, None)
    assert sink is not None
    conn.divert(sink, chunk_whole(cycle.flow, cycle, client, tap.plain) if whole else None)
    frame = b"%x\r\n%b\r\n" % (len(EVENT), EVENT)
    conn.data_received(frame)
    client.writes = 0
    began = time.perf_counter()
    for _ in range(chunks):
        conn.data_received(frame)
    elapsed = time.perf_counter() - began
    assert client.writes == chunks, client.writes
    return 1e6 * elapsed / chunks


SGLANG_EVENT = EVENT.replace(b"}]}\n\n", b'}],"usage":null}\n\n')
READS = {  # the SSE tap's common reads (strip on), by shape
    "one compact event (SGLang)": SGLANG_EVENT,
    "two compact events": SGLANG_EVENT * 2,
    "one spaced event": SGLANG_EVENT.replace(b'":', b'": '),
    "one vLLM event": EVENT,
}


def per_read(number: int, repeat: int) -> dict[str, float]:
    """Microseconds for the SSE tap alone (``SseTap.feed``, strip on) per read shape."""
    out = {}
    for name, data in READS.items():
        feed = SseTap(strip_usage=True).feed
        best = min(timeit.repeat(lambda: feed(data), number=number, repeat=repeat))  # noqa: B023
        out[name] = 1e6 * best / number
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--tap", action="store_true", help="then the SSE tap alone, by read shape")
    p.add_argument("--whole", action="store_true", help="also with the whole-chunk pass-through")
    args = p.parse_args(argv)
    for whole in (False, True) if args.whole else (False,):
        runs = [asyncio.run(per_chunk(args.chunks, whole)) for _ in range(args.repeat)]
        label = "per chunk, whole chunks passed through" if whole else "per chunk"
        print(f"{label}: " + ", ".join(f"{us:.2f}" for us in runs) + " µs")
    if args.tap:
        for name, us in per_read(args.chunks, args.repeat).items():
            print(f"  tap, {name}: {us:.2f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
