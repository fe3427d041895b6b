"""A soak: thousands of requests through faults, and at the end nothing lost and nothing leaked.

Two replicas per pool (four sims) behind one router. Closed-loop clients send chat requests,
half streamed, with outputs the sims make deterministic (``router.sim.protocol.filler``), so
every answer can be checked word for word. Meanwhile: 10% of requests are abandoned by their
client at a random point; each engine is SIGKILLed (by PID) once and restarted on its port;
one engine hangs mid-stream for a while (``hang_after``, a share of its requests); a slow
client reads long streams a little at a time.

Each request ends as exactly one of: ``complete`` (200, every word, a clean end), ``failed``
(visibly: an error status in the OpenAI shape, an error event ending a stream, or a broken
connection), ``aborted`` (by its own client), or ``silent`` (a 200 that ended short, or a
``[DONE]`` after wrong content) -- which must never happen. At the end: nothing in flight, the
engines idle, and the router's RSS, open fds and upstream connections within a small margin of
what they were after warm-up.

    python bench/soak.py [--requests 10000] [--max-seconds 720] [--out bench/results/soak.md]

The router is pinned to core 0, the sims and this load generator to core 1 (a 2-core machine
shared with other work): the checks are counts and end states, none of them timings.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from soak_checks import Engines, classify, footprint, slow_read  # noqa: E402

from router.tools.processes import Proc, pinned, spawn  # noqa: E402

SERVE = ["-m", "router", "serve", "--port", "0"]
MESSAGES = [{"role": "user", "content": "tell me a story"}]


async def client(router: str, rng: random.Random, tally: Counter[str], budget: list[int]) -> None:
    """One closed-loop client until the shared budget of requests is spent."""
    async with httpx.AsyncClient(base_url=router, timeout=httpx.Timeout(30.0)) as http:
        while budget[0] > 0:
            budget[0] -= 1
            stream = rng.random() < 0.5
            tokens = rng.randint(4, 48)
            abort_at = rng.random() if rng.random() < 0.10 else None
            body = {"model": "sim", "messages": MESSAGES, "max_tokens": tokens, "stream": stream}
            tally[await one(http, body, abort_at)] += 1


async def one(http: httpx.AsyncClient, body: dict[str, Any], abort_at: float | None) -> str:
    """Send one request; how it ended (see ``classify``)."""
    try:
        async with asyncio.timeout(60):
            if abort_at is not None and abort_at < 0.3:  # gone before the response, likely
                try:
                    async with asyncio.timeout(abort_at / 10):
                        early = await http.post("/v1/chat/completions", json=body)
                except TimeoutError:
                    return "aborted"
                return classify(early.status_code, early.content, body)
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                raw = b""
                async for chunk in response.aiter_raw():
                    raw += chunk
                    if abort_at is not None and len(raw) > abort_at * 40 * body["max_tokens"]:
                        return "aborted"  # (closing the response mid-body)
                return classify(response.status_code, raw, body)
    except (httpx.TransportError, httpx.DecodingError):
        return "failed"  # the connection broke: visible to the client


def router_env(spec: list[str], base: list[str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEC_ROUTER_")}
    env.update(
        SPEC_ROUTER_SPECULATIVE_URLS=",".join(spec),
        SPEC_ROUTER_BASELINE_URLS=",".join(base),
        SPEC_ROUTER_POLICY="spillover",
        SPEC_ROUTER_CROSSOVER="3",
        SPEC_ROUTER_HEALTH_INTERVAL="0.5",
        SPEC_ROUTER_EJECT_BASE="0.5",
        SPEC_ROUTER_FIRST_BYTE_TIMEOUT="5",
        SPEC_ROUTER_IDLE_TIMEOUT="2",
        SPEC_ROUTER_RAMP_SECONDS="2",
        SPEC_ROUTER_BUSY_POLL_US="0",  # a shared core
        SPEC_ROUTER_LEARN="false",
        SPEC_ROUTER_LOG_LEVEL="error",
    )
    return env


async def chaos(
    engines: Engines, progress: Callable[[], float], log: list[str], calm: asyncio.Event
) -> None:
    """Kill and restart every engine once, and make one hang mid-stream for a while, at set
    shares of the request budget (not times: the rate depends on what else the machine runs)."""
    names = list(engines.urls)
    hanging = names[-1]  # (killed last, so the fault it is given lives until it is turned off)
    steps: list[tuple[float, str, str]] = [
        (0.15 + 0.17 * i, "kill", n) for i, n in enumerate(names)
    ]
    steps += [(0.25, "hang", hanging), (0.45, "unhang", hanging)]
    for share, action, name in sorted(steps):
        while progress() < share:
            await asyncio.sleep(0.1)
        stamp = f"{time.strftime('%X')} at {progress():.0%} of the requests:"
        if action == "kill":
            await asyncio.to_thread(engines.kill, name)  # (blocking: off the clients' loop)
            log.append(f"{stamp} {name} SIGKILLed (pid {engines.last_pid[name]})")
            await asyncio.sleep(2.0)
            await asyncio.to_thread(engines.restart, name)
            log.append(f"{time.strftime('%X')} {name} restarted on the same port")
        else:
            fault = "hang_after=3,p=0.3" if action == "hang" else "none"
            await asyncio.to_thread(engines.configure, name, fault)
            log.append(f"{stamp} {name} fault={fault}")
    calm.set()


async def slow_client(
    router: str, busy: Callable[[], bool], tally: Counter[str], calm: asyncio.Event
) -> None:
    """Long streams read slowly, from when every engine is back (a stream that long would
    otherwise meet a kill: visible, but it would not show the router holding back the engine)."""
    await calm.wait()
    tally[await slow_read(router, 60000)] += 1
    while busy():
        tally[await slow_read(router, 60000)] += 1


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    engines = Engines(args.time_scale, pinned(1))
    router: Proc | None = None
    try:
        engines.start_all()
        spec, base = engines.pool("eagle3"), engines.pool("baseline")
        router = spawn(SERVE, router_env(spec, base), prefix=pinned(0))
        await engines.wait_usable(router.url)
        rng = random.Random(args.seed)
        warm: Counter[str] = Counter()
        await asyncio.gather(*(client(router.url, rng, warm, [20]) for _ in range(args.clients)))
        await engines.settle(router.url)
        start = footprint(router.pid, router.url)
        tally: Counter[str] = Counter()
        slow: Counter[str] = Counter()
        log: list[str] = []
        began = time.monotonic()
        budget = [args.requests]
        clients = [client(router.url, rng, tally, budget) for _ in range(args.clients)]
        load = asyncio.gather(*clients)
        calm = asyncio.Event()
        extra = asyncio.gather(
            chaos(engines, lambda: 1 - budget[0] / args.requests, log, calm),
            slow_client(router.url, lambda: budget[0] > 0, slow, calm),
        )
        try:
            async with asyncio.timeout(args.max_seconds):
                await load
        except TimeoutError:
            log.append("time cap reached before the request budget")
        budget[0] = 0
        try:
            async with asyncio.timeout(240):
                await extra  # (a kill still due is done now; the slow client finishes its read)
        except TimeoutError:
            log.append("the chaos or the slow client did not finish")
        elapsed = time.monotonic() - began
        await engines.settle(router.url)
        end = footprint(router.pid, router.url)
        metrics = httpx.get(f"{router.url}/metrics").text
        return {
            "tally": tally, "slow": slow, "log": log, "elapsed": elapsed, "start": start,
            "end": end, "warm": warm, "metrics": metrics, "kills": dict(engines.kills),
            "idle": engines.idle(),
        }  # fmt: skip
    finally:
        if router is not None:
            router.stop()
        engines.stop_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--max-seconds", type=float, default=720.0)
    parser.add_argument("--clients", type=int, default=24)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "soak.md")
    args = parser.parse_args()
    from soak_report import report

    result = asyncio.run(soak(args))
    text, ok = report(result, args, " ".join(["python", *sys.argv]))
    print(text)
    args.out.write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
