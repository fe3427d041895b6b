"""A closed-loop HTTP/1.1 load generator that measures what wrk cannot.

``--concurrency`` keep-alive connections each send a chat-completion request, wait for the whole
response, and send the next one at once. Per request it records the latency and, for streams,
the time to the first body chunk (TTFC: from writing the request to the first body byte). The
window starts ``--warmup`` seconds after all connections are open and lasts ``--duration``
seconds; a request counts if it completes inside the window. At the end no new request is sent
and the ones in flight are allowed to finish (up to ``--drain`` seconds), so a slow proxy is
never left with half-read streams that would cost it CPU during the next run.

Every response is checked: status 200, the same body length as the first one, and for streams
the final ``data: [DONE]``. Failures are counted as errors, never as latency samples.

``--new-connections`` closes each connection after its response and opens a new one for the
next request (no client keep-alive). ``--cpu-pid`` samples ``/proc/PID/stat`` (utime + stime)
at the window's edges, so the CPU used by the process under test and the backend is measured
over exactly the same interval; each CPU's busy time from /proc/stat is reported too, so load
from other processes shows.

It is built like the fake backend (uvloop, raw Protocol, httptools' C parser, callbacks, no
task per request) so it stays cheap on the core it shares with the backend. Prints one JSON
object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    # fields[0] is the state (field 3); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpus_busy() -> dict[int, float]:
    """Seconds each CPU has spent busy, from /proc/stat: user, nice, system and steal.

    Interrupt time is left out: loopback traffic is processed in softirqs that the kernel
    charges to no process, so counting it would make a busy proxy look like a stranger's load.
    """
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                fields = line.split()
                busy = int(fields[1]) + int(fields[2]) + int(fields[3]) + int(fields[8])
                out[int(fields[0][3:])] = busy / CLK_TCK
    return out


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_values:
        return float("nan")
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summary_ms(values: list[float]) -> dict[str, float]:
    v = sorted(values)
    if not v:
        return {}
    return {
        "p50": percentile(v, 0.50) * 1e3,
        "p90": percentile(v, 0.90) * 1e3,
        "p99": percentile(v, 0.99) * 1e3,
        "mean": sum(v) / len(v) * 1e3,
        "max": v[-1] * 1e3,
    }


class Connection(asyncio.Protocol):
    """One keep-alive connection; httptools calls the on_* methods while parsing."""

    def __init__(self, gen: LoadGen) -> None:
        self.gen = gen
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.in_flight = False
        self.t0 = 0.0
        self.t_first = 0.0
        self.status = 0
        self.nbytes = 0
        self.tail = b""
        self.keep = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, hence the cast.
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self) -> None:
        assert self.transport is not None
        self.in_flight = True
        self.t_first = 0.0
        self.status = 0
        self.nbytes = 0
        self.tail = b""
        self.t0 = time.perf_counter()
        self.transport.write(self.gen.request)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.gen.failed(self, "parse error")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if not self.t_first:
            self.t_first = time.perf_counter()
        self.nbytes += len(body)
        self.tail = (self.tail + body)[-32:]
        if self.gen.capture is self:
            self.keep += body

    def on_message_complete(self) -> None:
        self.in_flight = False
        self.gen.completed(self, time.perf_counter())

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.gen.lost(self)


class LoadGen:
    def __init__(self, args: argparse.Namespace) -> None:
        url = urlsplit(args.url)
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port or 80
        self.stream: bool = args.stream
        body = json.dumps(
            {
                "model": args.model,
                "messages": [{"role": "user", "content": "Say hello."}],
                "max_tokens": 16,
                "stream": self.stream,
            }
        ).encode()
        self.request = (
            f"POST {url.path or '/'} HTTP/1.1\r\nHost: {url.netloc}\r\n"
            f"Authorization: Bearer sk-bench\r\nContent-Type: application/json\r\n"
            f"Accept: */*\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.concurrency: int = args.concurrency
        self.new_connections: bool = args.new_connections
        self.warmup: float = args.warmup
        self.duration: float = args.duration
        self.drain: float = args.drain
        self.cpu_pids: list[int] = args.cpu_pid
        self.loop = asyncio.get_running_loop()
        self.conns: set[Connection] = set()
        self.stopping = False
        self.window: tuple[float, float] | None = None
        self.window_start = float("inf")
        self.latencies: list[float] = []
        self.ttfcs: list[float] = []
        self.errors: dict[str, int] = {}
        self.expected_bytes = -1
        self.capture: Connection | None = None
        self.first_body = b""
        self.drained = self.loop.create_future()
        self.cpu_start: dict[int, float] = {}
        self.cpu_used: dict[int, float] = {}

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def completed(self, conn: Connection, now: float) -> None:
        if conn.status != 200:
            self.error(f"status {conn.status}")
        elif self.stream and not conn.tail.endswith(b"data: [DONE]\n\n"):
            self.error("stream without [DONE]")
        elif self.expected_bytes < 0:
            self.expected_bytes = conn.nbytes
        elif conn.nbytes != self.expected_bytes:
            self.error("body length differs")
        elif self.window_start <= now and self.window is None:
            self.latencies.append(now - conn.t0)
            self.ttfcs.append(conn.t_first - conn.t0)
        if conn is self.capture:
            self.first_body = conn.keep
            self.capture = None
        if self.new_connections or not conn.parser.should_keep_alive():
            assert conn.transport is not None
            conn.transport.close()  # connection_lost reconnects
        elif self.stopping:
            self._check_drained()
        else:
            conn.send()

    def failed(self, conn: Connection, kind: str) -> None:
        self.error(kind)
        conn.in_flight = False
        if conn.transport is not None:
            conn.transport.close()

    def lost(self, conn: Connection) -> None:
        self.conns.discard(conn)
        if conn.in_flight:
            conn.in_flight = False
            self.error("connection lost mid-response")
        if self.stopping:
            self._check_drained()
        else:
            self.loop.create_task(self._replace())

    async def _replace(self) -> None:
        try:
            conn = await self._open()
        except OSError:
            self.error("reconnect failed")
            await asyncio.sleep(0.05)
            if not self.stopping:
                self.loop.create_task(self._replace())
            return
        if not self.stopping:
            conn.send()

    async def _open(self) -> Connection:
        _, conn = await self.loop.create_connection(lambda: Connection(self), self.host, self.port)
        self.conns.add(conn)
        return conn

    def _check_drained(self) -> None:
        if not self.drained.done() and not any(c.in_flight for c in self.conns):
            self.drained.set_result(None)

    def _sample_cpu(self) -> dict[int, float]:
        out = {}
        for pid in self.cpu_pids:
            try:
                out[pid] = cpu_seconds(pid)
            except OSError:
                pass
        return out

    async def run(self) -> dict[str, Any]:
        sem = asyncio.Semaphore(64)

        async def open_one() -> Connection:
            async with sem:
                return await self._open()

        conns = await asyncio.gather(*(open_one() for _ in range(self.concurrency)))
        first = conns[0]
        self.capture = first
        first.send()
        for conn in conns[1:]:
            conn.send()
        await asyncio.sleep(self.warmup)
        self.cpu_start = self._sample_cpu()
        busy_start = cpus_busy()
        self.window_start = time.perf_counter()
        await asyncio.sleep(self.duration)
        end = time.perf_counter()
        self.window = (self.window_start, end)
        cpu_end = self._sample_cpu()
        busy_end = cpus_busy()
        self.stopping = True
        self._check_drained()
        not_drained = 0
        try:
            await asyncio.wait_for(asyncio.shield(self.drained), self.drain)
        except TimeoutError:
            not_drained = sum(1 for c in self.conns if c.in_flight)
        for conn in list(self.conns):
            if conn.transport is not None:
                conn.transport.close()
        wall = end - self.window_start
        n = len(self.latencies)
        result: dict[str, Any] = {
            "url": f"http://{self.host}:{self.port}",
            "stream": self.stream,
            "concurrency": self.concurrency,
            "window_s": wall,
            "completed": n,
            "rps": n / wall,
            "errors": sum(self.errors.values()),
            "error_kinds": self.errors,
            "not_drained": not_drained,
            "body_bytes": self.expected_bytes,
            "latency_ms": summary_ms(self.latencies),
            "cpu_cores": {
                str(pid): (cpu_end[pid] - self.cpu_start[pid]) / wall
                for pid in cpu_end
                if pid in self.cpu_start
            },
            # Whole-machine use per CPU, so the caller can tell load it did not start.
            "cpus_busy": {str(c): (busy_end[c] - busy_start[c]) / wall for c in busy_end},
        }
        if self.stream:
            events = self.first_body.count(b"data: ")
            result["ttfc_ms"] = summary_ms(self.ttfcs)
            result["events_per_stream"] = events
            result["events_per_s"] = n * events / wall
        return result


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    return await LoadGen(args).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="e.g. http://127.0.0.1:8000/v1/chat/completions")
    parser.add_argument("-c", "--concurrency", type=int, default=1)
    parser.add_argument("-d", "--duration", type=float, default=5.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before the window")
    parser.add_argument("--drain", type=float, default=15.0, help="max seconds to finish at end")
    parser.add_argument("--stream", action="store_true", help='send "stream": true')
    parser.add_argument("--model", default="bench-model")
    parser.add_argument(
        "--new-connections",
        action="store_true",
        help="close each connection after its response and open a new one for the next "
        "request (as ../shared/bench-independent/loadgen.py does: overhead-vs-tail.md)",
    )
    parser.add_argument(
        "--cpu-pid", type=int, action="append", default=[], help="sample this process's CPU"
    )
    args = parser.parse_args(argv)
    args.cpu_pid.append(os.getpid())
    try:
        import uvloop

        result = uvloop.run(amain(args))
    except ImportError:
        result = asyncio.run(amain(args))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
