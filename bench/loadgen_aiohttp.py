"""A closed-loop streaming load generator on aiohttp, as an independent harness would write one.

The counterpart of bench/loadgen_raw.py with the client most Python harnesses use: ``-c`` tasks
share one ``aiohttp.ClientSession`` (a connector of ``-c`` keep-alive connections, or a new
connection per request with ``--new-connections``), each posts a streamed chat completion, reads
it line by line and posts the next at once. TTFT is taken when the first ``data:`` line has
been parsed out of the response by aiohttp (so it includes the client's own event-loop delay,
as any aiohttp-based measurement does), latency when ``data: [DONE]`` arrives.

Prints one JSON object with the same fields as loadgen_raw (``rps``, ``ttfc_ms``,
``events_per_s``, ``cpu_cores``, ``cpus_busy``, ...), so bench/overhead.py can use either
(``--loadgen aiohttp``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

import aiohttp
from loadgen_raw import cpu_seconds, cpus_busy, summary_ms


class Stats:
    def __init__(self) -> None:
        self.window_start = float("inf")
        self.window_end = float("inf")
        self.latencies: list[float] = []
        self.ttfts: list[float] = []
        self.events = 0
        self.errors: dict[str, int] = {}

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


async def one(session: aiohttp.ClientSession, url: str, body: bytes, stats: Stats) -> None:
    t0 = time.perf_counter()
    first = 0.0
    events = 0
    done = False
    headers = {"content-type": "application/json", "authorization": "Bearer sk-bench"}
    async with session.post(url, data=body, headers=headers) as resp:
        if resp.status != 200:
            stats.error(f"status {resp.status}")
            await resp.read()
            return
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            if not first:
                first = time.perf_counter()
            events += 1
            if line.startswith(b"data: [DONE]"):
                done = True
    end = time.perf_counter()
    if not done:
        stats.error("stream without [DONE]")
    elif stats.window_start <= end <= stats.window_end:
        stats.latencies.append(end - t0)
        stats.ttfts.append(first - t0)
        stats.events += events


async def worker(
    session: aiohttp.ClientSession, url: str, body: bytes, stats: Stats, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        try:
            await one(session, url, body, stats)
        except (aiohttp.ClientError, OSError) as exc:
            stats.error(type(exc).__name__)
            await asyncio.sleep(0.01)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    body = json.dumps(
        {
            "model": args.model,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 16,
            "stream": True,
        }
    ).encode()
    stats = Stats()
    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=args.concurrency, force_close=args.new_connections)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [
            asyncio.create_task(worker(session, args.url, body, stats, stop))
            for _ in range(args.concurrency)
        ]
        await asyncio.sleep(args.warmup)
        cpu_start = {pid: cpu_seconds(pid) for pid in args.cpu_pid}
        busy_start = cpus_busy()
        stats.window_start = time.perf_counter()
        await asyncio.sleep(args.duration)
        stats.window_end = end = time.perf_counter()
        cpu_end = {pid: cpu_seconds(pid) for pid in args.cpu_pid}
        busy_end = cpus_busy()
        stop.set()
        _, pending = await asyncio.wait(tasks, timeout=args.drain)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    wall = end - stats.window_start
    n = len(stats.latencies)
    return {
        "url": args.url,
        "stream": True,
        "loadgen": "aiohttp" + (" (new connection per request)" if args.new_connections else ""),
        "concurrency": args.concurrency,
        "window_s": wall,
        "completed": n,
        "rps": n / wall,
        "errors": sum(stats.errors.values()),
        "error_kinds": stats.errors,
        "not_drained": len(pending),
        "latency_ms": summary_ms(stats.latencies),
        "ttfc_ms": summary_ms(stats.ttfts),
        "events_per_s": stats.events / wall,
        "cpu_cores": {str(p): (cpu_end[p] - cpu_start[p]) / wall for p in cpu_end},
        "cpus_busy": {str(c): (busy_end[c] - busy_start[c]) / wall for c in busy_end},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="e.g. http://127.0.0.1:8000/v1/chat/completions")
    parser.add_argument("-c", "--concurrency", type=int, default=256)
    parser.add_argument("-d", "--duration", type=float, default=5.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before the window")
    parser.add_argument("--drain", type=float, default=15.0, help="max seconds to finish at end")
    parser.add_argument("--model", default="bench-model")
    parser.add_argument("--new-connections", action="store_true", help="no keep-alive")
    parser.add_argument("--stream", action="store_true", help="accepted for loadgen_raw parity")
    parser.add_argument(
        "--cpu-pid", type=int, action="append", default=[], help="sample this process's CPU"
    )
    args = parser.parse_args(argv)
    args.cpu_pid.append(os.getpid())
    result = asyncio.run(run(args))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
