"""A short, bounded load through the router: streamed and whole answers, and some trouble.

Closed loop: ``workers`` clients each send a chat completion, read it to the end and send the
next, until ``seconds`` have passed. With ``trouble=True`` one more client sends, every
``trouble_every`` seconds, a request the simulated engines are told to fail (the sim's
``x-sim-fault`` header, which the router forwards) or that it abandons half-way, so that
every error, retry and disconnect series has data:

- ``status=500``: the engine answers 500; the router passes it on (and ejects the backend);
- ``close``: the engine resets the connection; the router retries on the other pool, which
  resets too: 503 from the router, an upstream error and a retry of kind ``reset``;
- ``status=503``: refused; retried elsewhere (retry kind ``http_503``), refused again: 503;
- ``status=429``: refused; retried elsewhere (``http_429``), no ejection;
- a stream the client closes after its first chunk: a client disconnect.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

FAULTS = ("status=500", "close", "status=503", "status=429", "disconnect")


@dataclass
class LoadResult:
    codes: Counter[int] = field(default_factory=Counter)
    pools: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.codes.values())

    @property
    def server_errors(self) -> int:
        return sum(n for code, n in self.codes.items() if code >= 500)


def _body(seq: int, stream: bool, model: str) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"request {seq}"}],
        "max_tokens": 16 + seq % 17,
        "stream": stream,
    }


async def drive(
    url: str,
    seconds: float,
    workers: int = 12,
    trouble: bool = True,
    trouble_every: float = 0.2,
    model: str = "default",
) -> LoadResult:
    result = LoadResult()
    stop = time.monotonic() + seconds
    seq = itertools.count()
    limits = httpx.Limits(max_connections=workers + 4, max_keepalive_connections=workers + 4)
    async with httpx.AsyncClient(base_url=url, timeout=30.0, limits=limits) as client:

        async def one(stream: bool, fault: str | None = None) -> None:
            headers = {"x-sim-fault": fault} if fault and fault != "disconnect" else {}
            body = _body(next(seq), stream, model)
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers=headers
            ) as r:
                async for _ in r.aiter_raw():
                    if fault == "disconnect":
                        break  # leaving the block closes the connection mid-stream
            if fault != "disconnect":
                result.codes[r.status_code] += 1
                result.pools[r.headers.get("x-spec-router-pool", "none")] += 1

        async def worker(i: int) -> None:
            k = 0
            while time.monotonic() < stop:
                k += 1
                await one(stream=(i + k) % 2 == 0)

        async def troublemaker() -> None:
            for fault in itertools.cycle(FAULTS):
                if time.monotonic() >= stop:
                    return
                await one(stream=fault in ("disconnect", "close"), fault=fault)
                await asyncio.sleep(trouble_every)  # pacing, not waiting for a condition

        tasks = [worker(i) for i in range(workers)]
        if trouble:
            tasks.append(troublemaker())
        await asyncio.gather(*tasks)
    return result
