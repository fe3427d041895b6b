"""A fast fake OpenAI backend for the overhead benchmark.

It shares a core with the load generator, so it must cost as little as possible per request:
a raw asyncio Protocol on uvloop, hand-rolled parsing of only what it needs (request line,
Content-Length or a chunked body, ``"stream": true``), responses prebuilt as bytes at start-up,
and one ``loop.call_at`` timer per stream in flight (no task per request, none per chunk).

``POST /v1/chat/completions`` (and any other POST) answers a small ``chat.completion`` JSON, or
with ``"stream": true`` an SSE stream of ``--chunks`` chunks ``--interval-ms`` apart, the first
one sent together with the headers (or, with ``--first-delay-ms``, the headers alone and the
first chunk that long after, as a server that flushes its headers first does), ending with
``data: [DONE]``. ``GET /metrics`` answers an
SGLang-shaped gauge of the streams in flight; any other GET answers a small JSON object, so
health pollers are content.

    python bench/fake_backend.py --port 0 --chunks 20 --interval-ms 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import socket
import sys
from typing import Any, cast

LISTENING_PREFIX = "spec-router: listening on "
MAX_HEAD = 64 * 1024
_STREAM_RE = re.compile(rb'"stream"\s*:\s*true')


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _plain(status: bytes, ctype: bytes, body: bytes, close: bool = False) -> bytes:
    conn = b"connection: close\r\n" if close else b""
    return b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n%s" % (
        status,
        ctype,
        len(body),
        conn,
        body,
    )


class Responses:
    """Every response the backend sends, built once."""

    def __init__(self, chunks: int, model: str) -> None:
        completion = {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1700000000,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hello from the fake backend."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 8, "completion_tokens": 7, "total_tokens": 15},
        }
        self.completion = _plain(
            b"200 OK", b"application/json", json.dumps(completion, separators=(",", ":")).encode()
        )
        self.stream_head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        frames = []
        for i in range(chunks):
            delta: dict[str, Any] = {"content": f" tok{i}"}
            if i == 0:
                delta["role"] = "assistant"
            event = {
                "id": "chatcmpl-bench",
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "delta": delta,
                        "finish_reason": "stop" if i == chunks - 1 else None,
                    }
                ],
            }
            frames.append(
                _chunk(b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")
            )
        frames[-1] += _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        self.frames = frames
        models = {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "bench"}]}
        self.models = json.dumps(models).encode()


class Backend(asyncio.Protocol):
    """One client connection; requests are served in order (pipelining-safe)."""

    active_streams = 0

    def __init__(
        self, responses: Responses, interval: float, first_delay: float = 0.0, jitter: float = 0.0
    ) -> None:
        self.r = responses
        self.base_interval = interval
        self.interval = interval
        self.jitter = jitter
        self.first_delay = first_delay
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.streaming = False
        self.frame = 0
        self.t0 = 0.0
        self.close_after = False
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, hence the cast.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.streaming:
            self.streaming = False
            Backend.active_streams -= 1
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.streaming:
            self._serve()

    def _serve(self) -> None:
        buf = self.buf
        while not self.streaming and self.transport is not None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self.transport.close()
                return
            head = bytes(buf[:end]).lower()
            start = end + 4
            i = head.find(b"\r\ncontent-length:")
            if i >= 0:
                j = head.find(b"\r\n", i + 2)
                n = int(head[i + 17 : j if j >= 0 else len(head)])
                if len(buf) < start + n:
                    return
                body = bytes(buf[start : start + n])
                del buf[: start + n]
            elif b"\r\ntransfer-encoding: chunked" in head:
                parsed = _dechunk(buf, start)
                if parsed is None:
                    return
                body, consumed = parsed
                del buf[:consumed]
            else:
                body = b""
                del buf[:start]
            eol = head.find(b"\r\n")
            first = head[:eol] if eol >= 0 else head
            self.close_after = b"\r\nconnection: close" in head or first.endswith(b"http/1.0")
            self._respond(first, body)

    def _respond(self, request_line: bytes, body: bytes) -> None:
        assert self.transport is not None
        method, _, rest = request_line.partition(b" ")
        path = rest.partition(b" ")[0]
        close = self.close_after
        if method == b"post":
            if _STREAM_RE.search(body):
                self._start_stream()
                return
            if close:
                self.transport.write(
                    self.r.completion.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n", 1)
                )
            else:
                self.transport.write(self.r.completion)
        elif path.startswith(b"/metrics"):
            text = b"sglang:num_running_reqs %d\nsglang:num_queue_reqs 0\n" % Backend.active_streams
            self.transport.write(_plain(b"200 OK", b"text/plain; version=0.0.4", text, close))
        elif path.startswith(b"/v1/models"):
            self.transport.write(_plain(b"200 OK", b"application/json", self.r.models, close))
        else:
            self.transport.write(_plain(b"200 OK", b"application/json", b"{}", close))
        if close:
            self.transport.close()

    def _start_stream(self) -> None:
        assert self.transport is not None
        self.streaming = True
        Backend.active_streams += 1
        if self.jitter:  # this stream's own pace, so streams that start together drift apart
            self.interval = self.base_interval * random.uniform(1 - self.jitter, 1 + self.jitter)
        if self.first_delay:
            self.transport.write(self.r.stream_head)
            self.frame = 0
            self.t0 = self.loop.time() + self.first_delay
        else:
            self.transport.write(self.r.stream_head + self.r.frames[0])
            self.frame = 1
            self.t0 = self.loop.time()
        self._next_or_end()

    def _next_or_end(self) -> None:
        if self.frame < len(self.r.frames):
            # Absolute deadlines, so timer lateness does not accumulate over the stream.
            self.timer = self.loop.call_at(self.t0 + self.frame * self.interval, self._tick)
            return
        self.streaming = False
        Backend.active_streams -= 1
        if self.close_after and self.transport is not None:
            self.transport.close()
        elif self.buf:
            self._serve()

    def _tick(self) -> None:
        self.timer = None
        if self.transport is None:
            return
        self.transport.write(self.r.frames[self.frame])
        self.frame += 1
        self._next_or_end()


def _dechunk(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    """Decode a chunked body starting at ``pos``; None until it is complete."""
    out = bytearray()
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
        pos = eol + 2
        if size == 0:
            end = buf.find(b"\r\n\r\n", pos - 2)  # trailers (usually none) end with a blank line
            if end < 0:
                return None
            return bytes(out), end + 4
        if len(buf) < pos + size + 2:
            return None
        out += buf[pos : pos + size]
        pos += size + 2


async def serve(
    host: str,
    port: int,
    chunks: int,
    interval_ms: float,
    model: str,
    first_delay_ms: float = 0.0,
    jitter: float = 0.0,
) -> None:
    loop = asyncio.get_running_loop()
    responses = Responses(chunks, model)
    interval, first = interval_ms / 1000.0, first_delay_ms / 1000.0
    server = await loop.create_server(
        lambda: Backend(responses, interval, first, jitter),
        host,
        port,
        backlog=4096,
        reuse_address=True,
    )
    sock_host, sock_port = server.sockets[0].getsockname()[:2]
    print(f"{LISTENING_PREFIX}http://{sock_host}:{sock_port}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--chunks", type=int, default=20, help="SSE chunks per stream")
    parser.add_argument("--interval-ms", type=float, default=10.0, help="gap between chunks")
    parser.add_argument(
        "--first-delay-ms",
        type=float,
        default=0.0,
        help="send the headers alone, then the first chunk this much later (default 0: together)",
    )
    parser.add_argument(
        "--jitter",
        type=float,
        default=0.0,
        help="each stream's gap drawn uniformly from interval x (1 +- JITTER) (default 0: all "
        "streams keep the same pace, so streams that start together end together)",
    )
    parser.add_argument("--model", default="bench-model")
    args = parser.parse_args(argv)
    if not 0 <= args.jitter < 1:
        parser.error("--jitter must be in [0, 1)")
    if args.chunks < 1:
        parser.error("--chunks must be at least 1")
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # still works, just slower
        runner = asyncio.run
    try:
        runner(
            serve(
                args.host,
                args.port,
                args.chunks,
                args.interval_ms,
                args.model,
                args.first_delay_ms,
                args.jitter,
            )
        )
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
