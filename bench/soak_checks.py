"""The soak's engines (start, SIGKILL, restart on the same port) and its checks: how a request
ended, what the router holds (RSS, fds, upstream connections), and a client that reads slowly."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import socket
import time
from typing import Any

import httptools
import httpx

from router.health import engines as engine_metrics
from router.sim.protocol import filler
from router.tools.processes import Proc, spawn

PRESETS = ("eagle3", "eagle3", "baseline", "baseline")
# Long enough for the engine to fill the kernel's socket buffers (up to 4 MiB each way on
# loopback here) and the router's 256 KiB, so that the router must stop reading from it.
STALL = 35.0


def classify(status: int, raw: bytes, body: dict[str, Any]) -> str:
    """``complete``, ``failed`` (visibly) or ``silent`` (a 200 that is not the whole answer)."""
    if status != 200:
        return "failed"  # an error status is visible (the router's are OpenAI-shaped)
    want = filler(0, body["max_tokens"])
    if not body["stream"]:
        try:
            content = json.loads(raw)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            return "silent"
        return "complete" if content == want else "silent"
    text, done, error, finished = [], False, False, False
    for event in raw.split(b"\n\n"):
        if not event.startswith(b"data: "):
            continue
        data = event[6:].strip()
        if data == b"[DONE]":
            done = True
            continue
        obj = json.loads(data)
        if "error" in obj:
            error = True
            continue
        for choice in obj.get("choices") or []:
            text.append(choice["delta"].get("content") or "")
            finished |= choice.get("finish_reason") == "length"
    if error and not done:
        return "failed"  # an error event ends the stream: visible
    if done and not error and finished and "".join(text) == want:
        return "complete"
    return "silent"


class _Response:
    def __init__(self) -> None:
        self.body = bytearray()
        self.done = False

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.done = True


async def slow_read(router: str, tokens: int) -> str:
    """One long stream through a 4 KiB socket buffer, not read at all for its first ``STALL`` s (the
    router must stop reading from the engine, not buffer without bound), then 16 KiB every 5
    ms."""
    host, port = router.removeprefix("http://").rsplit(":", 1)
    body = {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    body["max_tokens"] = tokens
    payload = json.dumps(body).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    response = _Response()
    parser = httptools.HttpResponseParser(response)
    try:
        async with asyncio.timeout(STALL + 120):
            parser.feed_data(await reader.read(1024))
            await asyncio.sleep(STALL)
            while not response.done:
                chunk = await reader.read(16384)
                if not chunk:
                    return "failed"  # cut: visible
                parser.feed_data(chunk)
                await asyncio.sleep(0.005)
    except (OSError, httptools.HttpParserError, TimeoutError):
        return "failed"
    finally:
        writer.close()
    return classify(parser.get_status_code(), bytes(response.body), body)


def footprint(pid: int, router: str) -> dict[str, int]:
    """The router process's RSS and open fds, its upstream connections and in-flight count."""
    with open(f"/proc/{pid}/status") as fh:
        rss = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
    status = httpx.get(f"{router}/router/status", timeout=10).json()
    backends = [b for p in status["pools"].values() for b in p["backends"]]
    return {
        "rss_kib": rss,
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "open_connections": sum(b["connections"]["open"] for b in backends),
        "busy_connections": sum(b["connections"]["busy"] for b in backends),
        "in_flight": status["in_flight"]["total"],
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Engines:
    """Four sims, two per preset, each on a port of its own that survives its restarts."""

    def __init__(self, time_scale: float, prefix: list[str]) -> None:
        self.time_scale = time_scale
        self.prefix = prefix
        self.urls: dict[str, str] = {}
        self.presets: dict[str, str] = {}
        self.procs: dict[str, Proc] = {}
        self.last_pid: dict[str, int] = {}
        self.kills: collections.Counter[str] = collections.Counter()
        for i, preset in enumerate(PRESETS):
            name = f"{preset}-{i % 2 + 1}"
            self.presets[name] = preset
            self.urls[name] = f"http://127.0.0.1:{_free_port()}"

    def _spawn(self, name: str) -> None:
        port = self.urls[name].rsplit(":", 1)[1]
        args = ["-m", "router.sim", "--preset", self.presets[name], "--port", port]
        args += ["--time-scale", str(self.time_scale), "--seed", str(len(self.procs))]
        self.procs[name] = spawn(args, prefix=self.prefix)

    def start_all(self) -> None:
        for name in self.urls:
            self._spawn(name)

    def pool(self, preset: str) -> list[str]:
        return [url for name, url in self.urls.items() if self.presets[name] == preset]

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        self.last_pid[name] = proc.pid
        proc.kill()  # SIGKILL by PID
        self.kills[name] += 1

    def restart(self, name: str) -> None:
        self._spawn(name)

    def configure(self, name: str, fault: str) -> None:
        httpx.post(f"{self.urls[name]}/sim/config", json={"fault": fault}, timeout=10)

    def idle(self) -> dict[str, float]:
        out = {}
        for name, url in self.urls.items():
            sample = engine_metrics.parse(httpx.get(f"{url}/metrics", timeout=10).text)
            out[name] = sample.running + sample.queued
        return out

    async def wait_usable(self, router: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = httpx.get(f"{router}/router/status", timeout=10).json()
            backends = [b for p in status["pools"].values() for b in p["backends"]]
            if all(b["state"] == "healthy" and b["usable"] for b in backends):
                return
            await asyncio.sleep(0.2)
        raise RuntimeError("the backends did not all become usable")

    async def settle(self, router: str) -> None:
        """Wait until nothing is in flight, every engine is idle and every backend usable."""
        await self.wait_usable(router)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if footprint_idle(router) and not any(self.idle().values()):
                return
            await asyncio.sleep(0.2)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.stop()


def footprint_idle(router: str) -> bool:
    status = httpx.get(f"{router}/router/status", timeout=10).json()
    return bool(status["in_flight"]["total"] == 0)
