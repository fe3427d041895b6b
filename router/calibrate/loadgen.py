"""A closed-loop load generator for OpenAI-compatible servers, and the statistics over it.

``concurrency`` workers each send a streamed completion, read it to the end and send the next
one at once (no think time). Every request is recorded as a ``RequestResult``: status,
response headers (the router's ``x-spec-router-pool`` among them), when each content chunk
arrived and how many tokens it carried, and the exact token counts from the usage chunk.

The statistics at the bottom are pure functions over those records. Closed-loop numbers are
only meaningful in steady state, so ``window_stats`` measures inside a time window: total
tok/s from the chunks that arrived in it, and per-request decode tok/s from the spans between
each request's chunks in it (which leaves out time to first token, as the usual
``(output_tokens - 1) / (t_last - t_first)`` does).

Tokens come from the engine's usage chunk: each chunk's share of them is estimated with
``count_tokens`` (default ``estimate_tokens``: whitespace-separated words, at least one per chunk
that carries text; exact for ``router.sim``, whose tokens are words, and for llama.cpp, which
sends one token per event) and the shares are scaled to add up to the usage count.

Real engines send several tokens of one step (a speculative step's accepted drafts) as separate
events at once. Events less than ``BURST_GAP`` apart are one *burst*: decode rates are counted
between bursts, never over the zero gaps inside one (which would make a 4-token step look
infinitely fast).

Prompts start with a nonce drawn once per run, then the worker and sequence numbers, so neither
another request of the run nor an earlier run finds the prompt in an engine's prefix cache.

The load generator's own HTTP client is the router's (``FastClient``: httptools callbacks,
``router.upstream.client``), not httpx: a load generator at its core's limit measures itself,
and httpx cost 321 µs of CPU per SSE event against this one's 35 on a slow host (medians,
``python bench/loadgen_client.py``; bench/results/loadgen-client.md). ``send_one`` still takes
an ``httpx.AsyncClient`` too.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from router.origin import Origin
from router.upstream.client import OriginPool, Timeouts, UpstreamError

POOL_HEADER = "x-spec-router-pool"
BURST_GAP = 1e-3  # seconds: events closer than this arrived together


def estimate_tokens(text: str) -> int:
    """Tokens in a chunk's text, estimated: its words, and at least one."""
    return max(1, len(text.split()))


@dataclass
class RequestResult:
    worker: int
    seq: int
    start: float  # time.monotonic() when the request was sent
    max_tokens: int
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    chunk_times: list[float] = field(default_factory=list)  # content-bearing chunks only
    chunk_tokens: list[int] = field(default_factory=list)
    end: float | None = None
    prompt_tokens: int | None = None  # from the usage chunk
    output_tokens: int | None = None
    error: str | None = None
    stale_retries: int = 0  # sent again after a keep-alive connection closed under it
    body: bytes | None = None  # the body as received, when asked for (``send_one(keep_body)``)

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200

    @property
    def pool(self) -> str | None:
        return self.headers.get(POOL_HEADER)

    @property
    def first_token(self) -> float | None:
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def last_token(self) -> float | None:
        return self.chunk_times[-1] if self.chunk_times else None

    @property
    def ttft(self) -> float | None:
        return None if not self.chunk_times else self.chunk_times[0] - self.start

    def token_counts(self) -> list[float]:
        """Tokens per chunk, scaled so that they add up to the usage count when there is one."""
        estimated = sum(self.chunk_tokens)
        if self.output_tokens is None or estimated <= 0:
            return [float(t) for t in self.chunk_tokens]
        scale = self.output_tokens / estimated
        return [t * scale for t in self.chunk_tokens]


@dataclass(frozen=True)
class Workload:
    """What each request asks for."""

    prompt_tokens: int
    output_tokens: int
    endpoint: Literal["chat", "completions"] = "chat"
    model: str = "default"
    temperature: float = 0.0
    headers: tuple[tuple[str, str], ...] = ()
    extra_body: tuple[tuple[str, Any], ...] = ()
    ignore_eos: bool = False  # SGLang's, vLLM's and llama.cpp's: exactly max_tokens
    nonce: str = field(default_factory=lambda: secrets.token_hex(3))

    def body(self, worker: int, seq: int, output_tokens: int) -> dict[str, Any]:
        # A first word unique to the request and the run keeps real engines' prefix caches from
        # making prompts free (within a run and across runs).
        words = max(1, self.prompt_tokens)
        first = f"{self.nonce}w{worker}r{seq}"
        prompt = " ".join([first, *itertools.repeat("hello", words - 1)])
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": output_tokens,
            "temperature": self.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        body.update(dict(self.extra_body))
        return body

    @property
    def path(self) -> str:
        return "/chat/completions" if self.endpoint == "chat" else "/completions"


# No timeout once connected: a stream may take as long as it takes (httpx's read=None).
FAST_TIMEOUTS = Timeouts(connect=10.0, first_byte=86400.0, idle=86400.0)


# What a failure of FastClient is called in ``RequestResult.error``: httpx's name for it, so that
# reports and the tools that read them (calibrate's refusals) say the same whichever client ran.
UPSTREAM_ERROR_NAMES: dict[str, str] = {
    "connect": "ConnectError",
    "connect_timeout": "ConnectTimeout",
    "reset": "ReadError",
    "first_byte_timeout": "ReadTimeout",
    "idle_timeout": "ReadTimeout",
    "total_timeout": "ReadTimeout",
    "protocol": "RemoteProtocolError",
    "relay": "ReadError",
    "drained": "ReadError",
}


class FastClient:
    """Keep-alive connections per origin on the router's own HTTP/1.1 client; made and used
    inside one running event loop. ``aclose`` aborts whatever is still open."""

    def __init__(self, max_connections: int, timeouts: Timeouts = FAST_TIMEOUTS) -> None:
        self._max = max_connections
        self.timeouts = timeouts
        self._pools: dict[str, OriginPool] = {}

    def pool(self, origin: str) -> OriginPool:
        found = self._pools.get(origin)
        if found is None:
            # (engines close an idle connection after 5 s: drop ours before that)
            found = OriginPool(Origin.parse(origin), max_connections=self._max,
                               max_idle=self._max, keepalive_expiry=4.0)  # fmt: skip
            self._pools[origin] = found
        return found

    async def aclose(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()

    async def __aenter__(self) -> FastClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


Client = httpx.AsyncClient | FastClient


async def send_one(
    client: Client,
    url: str,
    body: dict[str, Any],
    result: RequestResult,
    *,
    headers: dict[str, str] | None = None,
    count_tokens: Callable[[str], int] = estimate_tokens,
    keep_body: bool = False,
) -> RequestResult:
    """Send one streamed completion and fill ``result`` in as the answer arrives (with
    ``keep_body``, also the body's bytes as they came, in ``result.body``).

    A request that the server closed the connection on before any response byte is sent once
    more, as an HTTP client does with a stale keep-alive connection: llama-server closes each
    keep-alive connection after its second streamed response without saying so, and a request
    sent on it in the meantime never reached the engine.
    """
    try:
        if isinstance(client, FastClient):  # (its pool sends a stale one again by itself)
            await _stream_fast(client, url, body, result, headers, count_tokens, keep_body)
        else:
            for attempt in (0, 1):
                try:
                    await _stream(client, url, body, result, headers, count_tokens, keep_body)
                    break
                except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                    if attempt or result.status is not None:
                        raise
                    result.stale_retries += 1
    except asyncio.CancelledError:
        result.error = "cancelled"
        raise
    except UpstreamError as exc:  # (named as httpx names the same failure)
        result.error = f"{UPSTREAM_ERROR_NAMES[exc.kind]}: {exc}"
    except (httpx.HTTPError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.end = time.monotonic()
    return result


async def _stream(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    result: RequestResult,
    headers: dict[str, str] | None,
    count_tokens: Callable[[str], int],
    keep_body: bool,
) -> None:
    async with client.stream("POST", url, json=body, headers=headers) as resp:
        result.status = resp.status_code
        result.headers = dict(resp.headers)
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")
            result.error = f"HTTP {resp.status_code}: {text[:300]}"
            return
        await _read_events(resp.aiter_raw(), result, count_tokens, keep_body)


async def _stream_fast(
    client: FastClient,
    url: str,
    body: dict[str, Any],
    result: RequestResult,
    headers: dict[str, str] | None,
    count_tokens: Callable[[str], int],
    keep_body: bool,
) -> None:
    parts = urlsplit(url)
    pool = client.pool(f"{parts.scheme}://{parts.netloc}")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    sent = [(b"content-type", b"application/json")]
    sent += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]

    def stale() -> None:
        result.stale_retries += 1

    payload = json.dumps(body).encode()
    conn = await pool.request(b"POST", target.encode(), sent, payload, client.timeouts, stale)
    try:
        result.status = conn.status
        result.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in conn.headers}
        if conn.status != 200:
            text = await conn.read_all()
            result.error = f"HTTP {conn.status}: {text.decode(errors='replace')[:300]}"
            return
        await _read_events(_chunks(conn.read), result, count_tokens, keep_body)
    finally:
        conn.release()


async def _chunks(read: Callable[[], Any]) -> AsyncIterator[bytes]:
    while data := await read():
        yield data


async def _read_events(
    chunks: AsyncIterator[bytes],
    result: RequestResult,
    count_tokens: Callable[[str], int],
    keep_body: bool,
) -> None:
    """Read an SSE body to its end into ``result``."""
    buffer = b""
    kept: list[bytes] = []
    try:
        async for data in chunks:
            if keep_body:
                kept.append(data)
            buffer += data
            *events, buffer = buffer.split(b"\n\n")
            now = time.monotonic()
            for event in events:
                _on_event(event, now, result, count_tokens)
    finally:
        if keep_body:
            result.body = b"".join(kept)
    if result.output_tokens is None:
        result.error = "stream ended without a usage chunk"


def _on_event(
    event: bytes, now: float, result: RequestResult, count_tokens: Callable[[str], int]
) -> None:
    for line in event.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        chunk = json.loads(payload)
        usage = chunk.get("usage")
        if usage:
            result.prompt_tokens = usage.get("prompt_tokens")
            result.output_tokens = usage.get("completion_tokens")
        for choice in chunk.get("choices") or ():
            text = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
            if text:
                result.chunk_times.append(now)
                result.chunk_tokens.append(count_tokens(text))


async def run_closed_loop(
    base_url: str,
    *,
    concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
    duration: float | None = None,
    requests: int | None = None,
    desync: bool = True,
    output_jitter: float = 0.0,
    seed: int = 0,
    stop: Literal["cancel", "drain"] = "cancel",
    endpoint: Literal["chat", "completions"] = "chat",
    model: str = "default",
    temperature: float = 0.0,
    ignore_eos: bool = False,
    headers: dict[str, str] | None = None,
    extra_body: dict[str, Any] | None = None,
    client: Client | None = None,
    count_tokens: Callable[[str], int] = estimate_tokens,
) -> list[RequestResult]:
    """Run ``concurrency`` workers back to back against ``base_url`` (ending in ``/v1``).

    Stops after ``duration`` seconds (then ``stop="cancel"`` abandons the requests in flight,
    recorded with ``error="cancelled"`` and their chunks so far; ``"drain"`` lets them end) or
    after ``requests`` requests in all, whichever comes first.

    ``desync``: worker ``i``'s *first* request asks for ``round(output_tokens * (i + 1) / n)``
    tokens (at least 2), so requests end, and their successors join the engine's batch, evenly
    spread from the start instead of in lock-step. Without it a deterministic engine keeps all
    requests in phase forever and every prefill lands in the same iteration.

    ``output_jitter``: each later request asks for a length drawn uniformly from
    ``output_tokens * (1 +- output_jitter)`` (seeded by ``seed``). With identical lengths, a
    deterministic engine and a client whose round trip sometimes outlasts a short iteration,
    requests drift into lock-step over time (once two join in the same iteration they stay
    together); varied lengths keep them apart. Rates that are linear in the length (all of
    ``router.sim.model``'s, to first order) keep their mean-length values.
    """
    if not 0 <= output_jitter < 1:
        raise ValueError("output_jitter must be in [0, 1)")
    if duration is None and requests is None:
        raise ValueError("give a duration, a request count, or both")
    work = Workload(
        prompt_tokens,
        output_tokens,
        endpoint,
        model,
        temperature,
        tuple((headers or {}).items()),
        tuple((extra_body or {}).items()),
        ignore_eos,
    )
    url = base_url.rstrip("/") + work.path
    results: list[RequestResult] = []
    tickets = itertools.count()
    own_client = client is None
    http = FastClient(concurrency + 8) if client is None else client
    deadline = math.inf if duration is None else time.monotonic() + duration

    async def worker(i: int) -> None:
        rng = random.Random(f"{seed}:{i}")
        lo = max(2, round(output_tokens * (1 - output_jitter)))
        hi = max(lo, round(output_tokens * (1 + output_jitter)))
        for seq in itertools.count():
            if next(tickets) >= (requests if requests is not None else math.inf):
                return
            if time.monotonic() >= deadline:
                return
            length = rng.randint(lo, hi) if output_jitter else output_tokens
            if desync and seq == 0:
                length = max(2, round(output_tokens * (i + 1) / concurrency))
            result = RequestResult(i, seq, time.monotonic(), length)
            results.append(result)
            body = work.body(i, seq, length)
            await send_one(http, url, body, result, headers=headers, count_tokens=count_tokens)

    tasks = [asyncio.create_task(worker(i)) for i in range(concurrency)]
    try:
        if duration is not None and stop == "cancel":
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
            for task in pending:
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for task in tasks:
            task.cancel()
        if own_client:
            await http.aclose()
    return results


# --- statistics (pure) -------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100]; NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def decode_tps(result: RequestResult) -> float | None:
    """``(output_tokens - 1) / (t_last - t_first)`` of a finished request, else None (also when
    its tokens arrived in one burst: no decode time was seen)."""
    n = result.output_tokens
    first, last = result.first_token, result.last_token
    if not result.ok or n is None or n < 2 or first is None or last is None:
        return None
    if last - first < BURST_GAP:
        return None
    return (n - 1) / (last - first)


def bursts(times: Sequence[float], tokens: Sequence[float]) -> list[tuple[float, float]]:
    """(arrival of its first event, tokens) of each burst: events less than ``BURST_GAP`` after
    the previous one join its burst."""
    out: list[tuple[float, float]] = []
    last = -math.inf
    for t, n in zip(times, tokens, strict=True):
        if out and t - last < BURST_GAP:
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((t, n))
        last = t
    return out


@dataclass(frozen=True)
class WindowStats:
    start: float
    end: float
    tokens: float  # tokens that arrived in the window
    total_tps: float
    per_request_tps: float  # decode tokens / decode time, summed over requests
    requests: int  # requests with at least two bursts in the window
    mean_request_tps: float  # unweighted mean of the same per request


def window_stats(results: Sequence[RequestResult], start: float, end: float) -> WindowStats:
    """Rates inside ``[start, end)``.

    For each request, its decode span in the window runs from its first burst in the window to
    its last; the tokens of the bursts after the first one are the decode tokens. A request's
    own first burst is never decode tokens, so time to first token stays out, and the gaps
    inside a burst are never a span of their own.
    """
    tokens = 0.0
    dec_tokens = 0.0
    dec_time = 0.0
    rates = []
    for r in results:
        counts = r.token_counts()
        idx = [i for i, t in enumerate(r.chunk_times) if start <= t < end]
        tokens += sum(counts[i] for i in idx)
        seen = bursts([r.chunk_times[i] for i in idx], [counts[i] for i in idx])
        if len(seen) < 2:
            continue
        n = sum(k for _, k in seen[1:])
        span = seen[-1][0] - seen[0][0]
        dec_tokens += n
        dec_time += span
        rates.append(n / span)
    return WindowStats(
        start=start,
        end=end,
        tokens=tokens,
        total_tps=tokens / (end - start),
        per_request_tps=dec_tokens / dec_time if dec_time else math.nan,
        requests=len(rates),
        mean_request_tps=sum(rates) / len(rates) if rates else math.nan,
    )


@dataclass(frozen=True)
class Summary:
    requests: int
    ok: int
    errors: dict[str, int]
    pools: dict[str, int]
    output_tokens: int
    ttft_p50: float
    ttft_p99: float
    decode_tps_p50: float
    decode_tps_mean: float


def summarize(results: Sequence[RequestResult]) -> Summary:
    done = [r for r in results if r.ok]
    rates = [x for x in map(decode_tps, done) if x is not None]
    ttfts = [x for x in (r.ttft for r in done) if x is not None]
    errors = Counter((r.error or "").split(":")[0] for r in results if not r.ok)
    return Summary(
        requests=len(results),
        ok=len(done),
        errors=dict(errors),
        pools=dict(Counter(r.pool or "-" for r in done)),
        output_tokens=sum(r.output_tokens or 0 for r in done),
        ttft_p50=percentile(ttfts, 50),
        ttft_p99=percentile(ttfts, 99),
        decode_tps_p50=percentile(rates, 50),
        decode_tps_mean=sum(rates) / len(rates) if rates else math.nan,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m router.calibrate.loadgen", description=__doc__)
    parser.add_argument("--url", required=True, help="base URL ending in /v1")
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=256)
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds left out of rates")
    parser.add_argument("--model", default="default")
    parser.add_argument(
        "--ignore-eos", action="store_true", help="ask for exactly --output-tokens (ignore_eos)"
    )
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    results = asyncio.run(
        run_closed_loop(
            args.url,
            concurrency=args.concurrency,
            prompt_tokens=args.prompt_tokens,
            output_tokens=args.output_tokens,
            duration=args.duration,
            model=args.model,
            ignore_eos=args.ignore_eos,
        )
    )
    window = window_stats(results, t0 + args.warmup, t0 + args.duration)
    print(json.dumps({"window": asdict(window), "summary": asdict(summarize(results))}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
