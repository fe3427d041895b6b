"""CPU per SSE event of the load generator's HTTP client: httpx against the router's own.

``spec-router demo``'s load generator (router.calibrate.loadgen) is its own process, one Python
thread; past most of a core it measures itself, not the engines (router/tools/demo.py,
``LOADGEN_LIMIT``). This drives one simulated engine (pinned to CPU 1) with ``--users`` streams
back to back for ``--seconds``, reading every event as the load generator does (split, JSON
decode), through ``httpx.AsyncClient.stream`` and through ``router.calibrate.loadgen.FastClient``
(httptools callbacks, router.upstream.client) in turns, from this process pinned to CPU 0, and
prints events/s, the process's CPU and its CPU per event for each run, then the medians.

    python bench/lab/loadgen_client.py
    python bench/lab/loadgen_client.py --users 64 --seconds 4 --reps 3 --time-scale 0.1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import httpx

from router.calibrate.loadgen import FAST_TIMEOUTS, FastClient
from router.tools.processes import pinned, spawn_command

PATH = "/v1/chat/completions"


def body(output_tokens: int) -> bytes:
    return json.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x " * 32}],
            "max_tokens": output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()


def count(buffer: bytes) -> tuple[int, bytes]:
    """Events decoded from ``buffer``, and what is left of it (as the load generator reads)."""
    *events, rest = buffer.split(b"\n\n")
    n = 0
    for event in events:
        if event.startswith(b"data: {"):
            json.loads(event[6:])
            n += 1
    return n, rest


async def with_httpx(url: str, users: int, seconds: float, payload: bytes) -> int:
    events = 0
    limits = httpx.Limits(max_connections=users + 8, max_keepalive_connections=users)
    async with httpx.AsyncClient(limits=limits, timeout=None) as client:
        end = time.monotonic() + seconds

        async def user() -> None:
            nonlocal events
            headers = {"content-type": "application/json"}
            while time.monotonic() < end:
                async with client.stream("POST", url + PATH, content=payload, headers=headers) as r:
                    buffer = b""
                    async for data in r.aiter_raw():
                        n, buffer = count(buffer + data)
                        events += n

        await asyncio.gather(*[user() for _ in range(users)])
    return events


async def with_fast(url: str, users: int, seconds: float, payload: bytes) -> int:
    events = 0
    client = FastClient(users + 8)
    pool = client.pool(url)
    end = time.monotonic() + seconds

    async def user() -> None:
        nonlocal events
        headers = [(b"content-type", b"application/json")]
        while time.monotonic() < end:
            conn = await pool.request(b"POST", PATH.encode(), headers, payload, FAST_TIMEOUTS)
            try:
                buffer = b""
                while data := await conn.read():
                    n, buffer = count(buffer + data)
                    events += n
            finally:
                conn.release()

    await asyncio.gather(*[user() for _ in range(users)])
    await client.aclose()
    return events


Run = Callable[[str, int, float, bytes], Coroutine[Any, Any, int]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=64)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--time-scale", type=float, default=0.1)
    p.add_argument("--output-tokens", type=int, default=96)
    args = p.parse_args(argv)
    os.sched_setaffinity(0, {0})
    sim = [sys.executable, "-m", "router.sim", "--port", "0", "--preset", "baseline"]
    sim += ["--time-scale", str(args.time_scale)]
    engine = spawn_command([*pinned(1), *sim])
    payload = body(args.output_tokens)
    runs: dict[str, list[float]] = {"httpx": [], "fast": []}
    clients: dict[str, Run] = {"httpx": with_httpx, "fast": with_fast}
    try:
        for _ in range(args.reps):
            for name, run in clients.items():
                cpu, wall = time.process_time(), time.monotonic()
                events = asyncio.run(run(engine.url, args.users, args.seconds, payload))
                cpu, wall = time.process_time() - cpu, time.monotonic() - wall
                runs[name].append(1e6 * cpu / events)
                print(f"{name:5s} {events / wall:7.0f} events/s  cpu {cpu / wall:.2f} core  "
                      f"{1e6 * cpu / events:6.1f} us/event", flush=True)  # fmt: skip
    finally:
        engine.popen.kill()
        engine.popen.wait()
    httpx_us, fast_us = (statistics.median(runs[k]) for k in ("httpx", "fast"))
    print(f"median us/event: httpx {httpx_us:.1f}, fast {fast_us:.1f} ({httpx_us / fast_us:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
