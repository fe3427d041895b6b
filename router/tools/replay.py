"""``spec-router replay``: send a workload open-loop and score it under TTFT/TPOT SLOs.

Each arrival is sent at its own time, whether or not earlier requests have been answered (real
traffic does not wait), as a streamed completion asking for exactly its output length
(``max_tokens`` plus ``ignore_eos``, which SGLang and vLLM accept) and carrying a prompt of
exactly its prompt length: that many words for chat (what ``router.sim`` counts), or that many
token ids with ``--endpoint completions`` (exact on real SGLang / vLLM). Every request becomes a
``router.tools.goodput.Result``; the run is written as JSON (every result) and markdown (the
summary).

Requests go out through the router's own HTTP/1.1 client (``router.upstream.client``:
asyncio protocols and httptools), and each stream keeps no state beyond a few instants, so
one Python process keeps up with hundreds of concurrent streams; the report shows how late it
sent requests (``lateness``), which is the check that it did.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import secrets
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from router.origin import Origin
from router.tools import goodput
from router.tools.goodput import Result
from router.tools.replay_args import build_parser, slos, workload
from router.tools.replay_report import Progress, Sent, run_meta, write_json, write_report
from router.tools.traffic import Arrival
from router.upstream.client import OriginPool, Timeouts, UpstreamError

Endpoint = Literal["chat", "completions"]
POOL_HEADER = b"x-spec-router-pool"
REASON_HEADER = b"x-spec-router-reason"
PREDICTED_TTFT = b"x-spec-router-predicted-ttft-ms"
PREDICTED_TPOT = b"x-spec-router-predicted-tpot-ms"
# No first-byte or idle deadline: a queued request may wait long, and the replay's drain
# deadline ends whatever is still running.
TIMEOUTS = Timeouts(connect=10.0, first_byte=1e9, idle=1e9)
# Token ids for --endpoint completions: a range every common vocabulary (32k and up) has.
TOKEN_IDS = (1000, 30000)


def request_body(
    arrival: Arrival, index: int, endpoint: Endpoint, model: str, nonce: str = ""
) -> dict[str, Any]:
    """The body of one request; a first word / token unique to the request and the run
    (``nonce``) keeps engines' prefix caches from making its prompt free, also on a second run."""
    n = max(1, arrival.prompt_tokens)
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": arrival.output_tokens,
        "ignore_eos": True,
        "temperature": arrival.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint == "chat":
        words = " ".join([f"{nonce}r{index}", *(["hello"] * (n - 1))])
        body["messages"] = [{"role": "user", "content": words}]
    else:
        rng = random.Random(f"{nonce}:{index}")
        body["prompt"] = [rng.randrange(*TOKEN_IDS) for _ in range(n)]
    return body


@dataclass
class Timing:
    """What one request measured, in ``time.monotonic()`` seconds."""

    sent: float | None = None
    status: int | None = None
    first: float | None = None
    last: float | None = None
    end: float | None = None
    output_tokens: int | None = None
    pool: str | None = None
    reason: str | None = None
    error: str | None = None
    predicted: tuple[float, float] | None = None  # the router's TTFT and TPOT, wall seconds


def _on_event(event: bytes, now: float, t: Timing) -> None:
    for line in event.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        chunk = json.loads(payload)
        if "error" in chunk:
            message = (chunk["error"] or {}).get("message", "")
            t.error = f"stream error: {message}"
        if usage := chunk.get("usage"):
            t.output_tokens = usage.get("completion_tokens")
        for choice in chunk.get("choices") or ():
            if (choice.get("delta") or {}).get("content") or choice.get("text"):
                if t.first is None:
                    t.first = now
                t.last = now


async def send(
    pool: OriginPool, target: bytes, body: bytes, headers: list[tuple[bytes, bytes]], t: Timing
) -> None:
    """Send one streamed request and fill in ``t`` as the answer arrives."""
    t.sent = time.monotonic()
    conn = None
    try:
        conn = await pool.request(b"POST", target, headers, body, TIMEOUTS)
        t.status = conn.status
        got = dict(conn.headers)
        pool_name, reason = got.get(POOL_HEADER), got.get(REASON_HEADER)
        t.pool = None if pool_name is None else pool_name.decode("latin-1")
        t.reason = None if reason is None else reason.decode("latin-1")
        ttft, tpot = got.get(PREDICTED_TTFT), got.get(PREDICTED_TPOT)
        if ttft is not None and tpot is not None:
            t.predicted = (float(ttft) / 1000, float(tpot) / 1000)
        if conn.status != 200:
            text = await conn.read_all()
            t.error = f"HTTP {conn.status}: {text[:200].decode(errors='replace')}"
            return
        buffer = b""
        while data := await conn.read():
            now = time.monotonic()
            buffer += data.replace(b"\r\n", b"\n")
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                _on_event(event, now, t)
    except asyncio.CancelledError:
        t.error = "unfinished: still running when the replay ended"
        raise
    except UpstreamError as exc:
        t.error = f"{exc.kind}: {exc}"
    except ValueError as exc:  # an event that is not JSON
        t.error = f"protocol: {exc}"
    finally:
        t.end = time.monotonic()
        if conn is not None:
            conn.release()


async def replay(
    arrivals: Sequence[Arrival],
    url: str,
    *,
    endpoint: Endpoint = "chat",
    model: str = "default",
    headers: dict[str, str] | None = None,
    time_scale: float = 1.0,
    drain: float = 120.0,
    watch: Callable[[Sent], Coroutine[Any, Any, None]] | None = None,
    stop: asyncio.Event | None = None,
) -> list[Result]:
    """Send every arrival at ``start + at * time_scale`` (wall clock) to ``url`` (a base URL,
    with or without ``/v1``); after the last one, wait up to ``drain`` model seconds for the
    rest, then cancel them (recorded as unfinished). Once ``stop`` is set no more are sent
    (those are recorded as not sent), and the ones sent finish as after the last."""
    base = url.rstrip("/").removesuffix("/v1")
    target = b"/v1/chat/completions" if endpoint == "chat" else b"/v1/completions"
    head = [(b"content-type", b"application/json"), (b"accept", b"text/event-stream")]
    head += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    timings = [Timing() for _ in arrivals]
    state = Sent(len(arrivals))
    # Hundreds of concurrent streams: the router's own HTTP/1.1 client (asyncio protocol +
    # httptools). httpx's pool scans every connection on every event, which at 300+ streams
    # made the replay send requests up to 0.6 s (wall) late on this machine.
    nonce = secrets.token_hex(3)  # per run
    pool = OriginPool(Origin.parse(base), max_connections=1 << 20, max_idle=1024,
                      keepalive_expiry=4.0)  # fmt: skip
    tasks: list[asyncio.Task[None]] = []

    def finished(_: object) -> None:
        state.done += 1

    watcher = asyncio.create_task(watch(state)) if watch else None
    start = time.monotonic() + 0.05  # a moment to set up before the first request is due
    try:
        for i, (arrival, t) in enumerate(zip(arrivals, timings, strict=True)):
            delay = start + arrival.at * time_scale - time.monotonic()
            if delay > 0 and stop is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            elif delay > 0:
                await asyncio.sleep(delay)
            if stop is not None and stop.is_set():
                break
            body = json.dumps(request_body(arrival, i, endpoint, model, nonce)).encode()
            task = asyncio.create_task(send(pool, target, body, head, t))
            task.add_done_callback(finished)
            tasks.append(task)
            state.sent += 1
            lag = (time.monotonic() - start) / time_scale - arrival.at
            state.worst_late = max(state.worst_late, lag)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=drain * time_scale)
            for task in pending:
                task.cancel()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        pool.close()
    return [
        goodput.timed_result(
            a,
            start=start,
            sent=t.sent,
            status=t.status,
            first_token=t.first,
            last_token=t.last,
            end=t.end,
            output_tokens=t.output_tokens,
            pool=t.pool,
            reason=t.reason,
            error=t.error if t.sent is not None else "not sent",
            time_scale=time_scale,
            predicted=t.predicted,
        )  # fmt: skip
        for a, t in zip(arrivals, timings, strict=True)
    ]


# --- the command -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.time_scale <= 0:
        parser.error("--time-scale must be > 0")
    try:
        arrivals = workload(ns)
    except (OSError, ValueError, KeyError) as exc:
        parser.error(f"cannot build the workload: {exc}")
    if not arrivals:
        parser.error("the workload is empty (check --start, --duration and --rate)")
    headers = dict(h.split(":", 1) for h in ns.header)
    headers = {k.strip(): v.strip() for k, v in headers.items()}
    if ns.api_key:
        headers["Authorization"] = f"Bearer {ns.api_key}"
    progress = Progress(sys.stderr, ns.time_scale)
    began = time.time()
    results = _run(
        replay(
            arrivals, ns.url, endpoint=ns.endpoint, model=ns.model, headers=headers,
            time_scale=ns.time_scale, drain=ns.drain, watch=progress.watch,
        )
    )  # fmt: skip
    chosen = slos(ns)
    summary = goodput.summarize(goodput.scored(results, ns.warmup), chosen)
    progress.done(summary)
    meta = run_meta(ns, argv if argv is not None else sys.argv[1:], arrivals, chosen, began)
    if ns.out:
        write_json(ns.out, meta, summary, results)
    if ns.report:
        write_report(ns.report, meta, summary, chosen)
    return 0


def _run(coro: Awaitable[list[Result]]) -> list[Result]:
    async def wrapped() -> list[Result]:
        return await coro

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        return asyncio.run(wrapped())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(wrapped())


if __name__ == "__main__":
    raise SystemExit(main())
