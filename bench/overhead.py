"""Router overhead benchmark: the router against direct, nginx and typical Python stacks.

Everything is measured in ONE run against the same fast fake backend (bench/fake_backend.py):

- the process under test (nginx, each candidate in bench/candidates/, the router) is pinned to
  one core; the fake backend and the load generator share the other;
- the router runs as users run it: ``uvicorn router.app:app`` with default settings, started
  from a calibrated table (``--table``; '' for none), so the default policy decides with its
  curves; ``router_serve`` is the same under ``spec-router serve``;
- "direct" (no proxy) is measured too, so the latency a proxy adds is a difference of two numbers
  taken minutes apart on the same machine, and nginx (one worker, ``proxy_buffering off``,
  upstream keep-alive) is the reference the streaming targets are stated against;
- scenarios: (a) non-streaming, concurrency 1 (latency, bench/loadgen_raw.py); (b) 256
  concurrent streams of 20 chunks 10 ms apart (req/s and time to first chunk, loadgen_raw);
  (c) non-streaming, concurrency 64 (req/s, wrk);
- each (target, scenario) runs ``--reps`` times, interleaved (rep 1 of every target, then rep 2,
  ...), so drift on the machine hits every target alike; the report gives medians;
- CPU of the process under test, the backend and the load generator comes from
  /proc/PID/stat over the measured window.

Writes bench/results/overhead.md and overhead.json (see bench/overhead_report.py).

    python bench/overhead.py                     # the full run, ~15 minutes
    python bench/overhead.py --reps 2 --duration 2 --targets direct,nginx,router

The knobs by which another harness's streaming run can differ from this one (issue 14), one
at a time: ``--loadgen aiohttp`` (bench/loadgen_aiohttp.py: TTFT at the first parsed ``data:``
line, as aiohttp clients measure it; ``--new-connections``: no client keep-alive),
``--first-delay-ms`` (the backend sends its headers alone, the first chunk that much later),
``--unpinned`` (backend and load generator free to run on either core, the proxy's too), and
``--name`` to write the report under another name:

    python bench/overhead.py --scenarios stream --targets direct,nginx,router \
        --loadgen aiohttp --first-delay-ms 10 --name overhead-aiohttp
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadgen_raw import cpu_seconds, cpus_busy
from overhead_report import render_markdown, summarize

from router.tools.processes import pinned, spawn_command

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable
CHAT = "/v1/chat/completions"
START_TIMEOUT = 30.0

CANDIDATES = {
    "fastapi_httpx": "FastAPI + httpx, StreamingResponse (the typical pass-through)",
    "fastapi_aiohttp": "FastAPI + aiohttp, StreamingResponse",
    "starlette_aiohttp": "Starlette routing + StreamingResponse + aiohttp",
    "asgi_httpx": "raw ASGI handler + httpx",
    "asgi_aiohttp": "raw ASGI handler + aiohttp",
    "tcp_pipe": "a TCP pipe on uvloop, no HTTP at all: the floor of any Python proxy",
    "http_floor": "uvloop + httptools callbacks: parse, count, forward, re-frame; nothing else",
    "router_callbacks": "http_floor's callbacks calling the router's own per-request code",
}
# http_floor with N us of busy CPU per request (HTTP_FLOOR_WORK_US): how much per-request work
# the callback shape carries before the streaming tail opens (overhead-harnesses.md)
FLOOR_WORK = {f"http_floor_w{n}": n for n in (50, 100, 150, 200, 300, 400)}
CANDIDATES.update(
    {name: f"http_floor plus {n} us of busy CPU per request" for name, n in FLOOR_WORK.items()}
)
# router: the router as the README tells users to run it, `uvicorn router.app:app` with default
# settings, started from a calibrated table (--table), so the default policy decides with its
# curves (tail.py in ../shared/bench-independent measures the same; overhead-vs-tail.md)
# router_serve: the same under `spec-router serve` (serve's protocol: request deadlines, limits)
# router_no_busy_poll: the same router with SPEC_ROUTER_BUSY_POLL_US=0 (router/fastpath/busypoll.py)
# router_ref: the router of another checkout (--router-ref DIR, e.g. a `git worktree` of the
# commit an older report was measured at), with its default settings, in the same run
# router_ui: the same router with its live page's feed (/router/ui/events) read all along, as an
# open browser tab would (bench/results/ui-overhead.md)
# router_spin: busy polling that never holds, even on a shared core
# (SPEC_ROUTER_BUSY_POLL_YIELD=false)
ROUTERS = (
    "router", "router_serve", "router_no_busy_poll", "router_spin", "router_ref", "router_ui"
)  # fmt: skip
# The table a router starts from (a copy: it writes what it learns there): written by
# `spec-router calibrate` against the simulated engines (bench/results/calibration.md)
TABLE = HERE / "results" / "calibration-1024-256.json"
# The router targets that differ from the router only in settings: the settings.
ROUTER_ENV: dict[str, dict[str, str]] = {
    "router": {},
    "router_no_busy_poll": {"SPEC_ROUTER_BUSY_POLL_US": "0"},
    "router_spin": {"SPEC_ROUTER_BUSY_POLL_YIELD": "false"},
    "router_serve": {},
}
TARGETS = ["direct", "nginx", *ROUTERS, *CANDIDATES]
SCENARIOS = ["c1", "stream", "c64"]
# --priority: every process of the run at nice -20 (needs root), for a machine where others'
# CPU-bound jobs will not stop: CFS then gives such a job about 1% of a core against the run
PRIORITY: list[str] = []


class StartError(RuntimeError):
    pass


class FeedReader:
    """Reads the router's live-page feed in a thread for as long as it runs, as a tab would."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.sendall(b"GET /router/ui/events HTTP/1.1\r\nhost: bench\r\n\r\n")
        self.events = 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        self.sock.settimeout(None)
        with contextlib.suppress(OSError):
            while chunk := self.sock.recv(65536):
                self.events += chunk.count(b"\ndata: ")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(timeout=5)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)
    url: str = ""
    measured_pid: int = 0  # the process whose CPU is measured (nginx: its worker)
    feed: FeedReader | None = None  # router_ui: the live page's feed, read all along

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 15) -> str:
        return "\n".join(self.output[-n:])

    def stop(self) -> None:
        """SIGTERM by PID, then SIGKILL; never by name."""
        if self.feed is not None:
            self.feed.close()
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)


def spawn(
    name: str,
    cmd: list[str],
    core: int | None,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> Proc:
    """Start ``cmd`` pinned to ``core`` and wait for its "listening on URL" line."""
    try:
        started = spawn_command([*PRIORITY, *pinned(core), *cmd], env, cwd=str(cwd))
    except RuntimeError as exc:
        raise StartError(f"{name}: {exc}") from None
    # (taskset execs: the PID is the measured process's own)
    return Proc(name, started.popen, started.output, started.url, measured_pid=started.pid)


def _drain(proc: Proc) -> None:
    """Keep nginx's output (it announces nothing: readiness is its port)."""
    assert proc.popen.stdout is not None
    for line in proc.popen.stdout:
        if len(proc.output) < 2000:
            proc.output.append(line.rstrip("\n"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_port(port: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return True
        time.sleep(0.05)
    return False


def start_nginx(tmp: Path, upstream: str, core: int, binary: str) -> Proc:
    port = free_port()
    conf = (HERE / "nginx.conf.template").read_text()
    conf = conf.replace("@PREFIX@", str(tmp)).replace("@LISTEN@", f"127.0.0.1:{port}")
    conf = conf.replace("@UPSTREAM@", upstream.removeprefix("http://"))
    (tmp / "nginx.conf").write_text(conf)
    cmd = [binary, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", str(tmp / "error.log")]
    popen = subprocess.Popen(
        [*PRIORITY, "taskset", "-c", str(core), *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    proc = Proc("nginx", popen, url=f"http://127.0.0.1:{port}")
    threading.Thread(target=_drain, args=(proc,), daemon=True).start()
    if not wait_port(port):
        proc.stop()
        errors = (tmp / "error.log").read_text() if (tmp / "error.log").exists() else ""
        raise StartError(f"nginx did not listen on {port}:\n{proc.tail()}\n{errors}")
    children = Path(f"/proc/{popen.pid}/task/{popen.pid}/children").read_text().split()
    proc.measured_pid = int(children[0]) if children else popen.pid  # the one worker
    return proc


def smoke(url: str) -> tuple[str | None, dict[str, str]]:
    """One plain and one streaming request; an error text, or None and the response headers."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    headers: dict[str, str] = {}
    for stream in (False, True):
        body = json.dumps({"model": "bench-model", "messages": [], "stream": stream})
        conn = http.client.HTTPConnection(host, int(port), timeout=15)
        try:
            conn.request("POST", CHAT, body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        except OSError as exc:
            return f"request failed: {exc}", headers
        finally:
            conn.close()
        if resp.status != 200:
            return f"status {resp.status}: {data[:300]!r}", headers
        if stream and not data.endswith(b"data: [DONE]\n\n"):
            return f"stream did not end with [DONE]: {data[-200:]!r}", headers
        headers = {k.lower(): v for k, v in resp.getheaders()}
    return None, headers


def wait_ready(url: str, timeout: float = 20.0) -> None:
    """Wait for the router's /ready (503 until a pool can take traffic); 404 means no such page."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        try:
            conn.request("GET", "/ready")
            status = conn.getresponse().status
        except OSError:
            status = 0
        finally:
            conn.close()
        if status in (200, 404):
            return
        time.sleep(0.1)


def wait_feed(url: str, timeout: float = 10.0) -> None:
    """Wait until the router counts one feed connection (``/router/status`` ``ui``)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        try:
            conn.request("GET", "/router/status")
            if json.loads(conn.getresponse().read())["ui"]["feed_connections"] == 1:
                return
        finally:
            conn.close()
        time.sleep(0.1)
    raise StartError("router_ui: the live page's feed did not connect")


def run_loadgen(
    url: str, *, stream: bool, concurrency: int, args: argparse.Namespace, pids: dict[str, int]
) -> dict[str, Any]:
    script = "loadgen_aiohttp.py" if stream and args.loadgen == "aiohttp" else "loadgen_raw.py"
    cmd = [
        *PRIORITY, *pinned(None if args.unpinned else args.load_core),
        PY, str(HERE / script), url + CHAT,
        "-c", str(concurrency), "-d", str(args.duration), "--warmup", str(args.warmup),
    ]  # fmt: skip
    if stream:
        cmd.append("--stream")
        if args.new_connections:
            cmd.append("--new-connections")
    for pid in pids.values():
        cmd += ["--cpu-pid", str(pid)]
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = popen.communicate(timeout=args.warmup + args.duration + 120)
    if popen.returncode != 0:
        return {"failed": err.strip().splitlines()[-1] if err.strip() else "loadgen failed"}
    raw = json.loads(out)
    cores = raw["cpu_cores"]
    result: dict[str, Any] = {
        "rps": raw["rps"],
        "completed": raw["completed"],
        "errors": raw["errors"],
        "error_kinds": raw["error_kinds"],
        "not_drained": raw["not_drained"],
        "p50_ms": raw["latency_ms"].get("p50"),
        "p99_ms": raw["latency_ms"].get("p99"),
        "cpu_loadgen": cores.get(str(popen.pid)),
    }
    for role, pid in pids.items():
        result[f"cpu_{role}"] = cores.get(str(pid))
    busy = {int(c): v for c, v in raw["cpus_busy"].items()}
    _account(result, busy, args)
    if stream:
        result["ttfc_p50_ms"] = raw["ttfc_ms"].get("p50")
        result["ttfc_p99_ms"] = raw["ttfc_ms"].get("p99")
        result["events_per_s"] = raw["events_per_s"]
    return result


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _wrk_ms(text: str, label: str) -> float | None:
    m = re.search(rf"^\s*{re.escape(label)}\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def run_wrk(url: str, *, args: argparse.Namespace, pids: dict[str, int]) -> dict[str, Any]:
    base = [*PRIORITY, "taskset", "-c", str(args.load_core), args.wrk, "-t1", f"-c{args.c64}"]
    script = ["-s", str(HERE / "wrk_post.lua"), url + CHAT]
    warm = subprocess.run([*base, f"-d{max(1, round(args.warmup))}s", *script], capture_output=True)
    if warm.returncode != 0:
        return {"failed": warm.stderr.decode(errors="replace").strip() or "wrk failed"}
    before = {role: cpu_seconds(pid) for role, pid in pids.items()}
    busy_before = cpus_busy()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    run = subprocess.run(
        [*base, f"-d{max(1, round(args.duration))}s", "--latency", *script],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    after = {role: cpu_seconds(pid) for role, pid in pids.items()}
    busy_after = cpus_busy()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = run.stdout
    m = re.search(r"Requests/sec:\s+([\d.]+)", text)
    if run.returncode != 0 or not m:
        return {"failed": (run.stderr or text).strip()[-300:] or "wrk failed"}
    errors = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses:\s+(\d+)", text))
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if sock:
        errors += sum(int(g) for g in sock.groups())
    result: dict[str, Any] = {
        "rps": float(m.group(1)),
        "errors": errors,
        "p50_ms": _wrk_ms(text, "50%"),
        "p99_ms": _wrk_ms(text, "99%"),
        "cpu_loadgen": (used.ru_utime + used.ru_stime - children.ru_utime - children.ru_stime)
        / wall,
    }
    for role in pids:
        result[f"cpu_{role}"] = (after[role] - before[role]) / wall
    _account(result, {c: (busy_after[c] - busy_before[c]) / wall for c in busy_after}, args)
    return result


def _account(result: dict[str, Any], busy: dict[int, float], args: argparse.Namespace) -> None:
    """Fold the second backend into "backend"; work out the CPU that none of ours used.

    This machine may be shared; a run during which other processes used the two cores is
    repeated (see ``measured``), and the load that remained is reported with the result.
    """
    second = result.pop("cpu_backend_b", None)
    if second is not None and result.get("cpu_backend") is not None:
        result["cpu_backend"] += second
    ours = sum(result.get(k) or 0.0 for k in ("cpu_target", "cpu_backend", "cpu_loadgen"))
    used = busy.get(args.proxy_core, 0.0) + busy.get(args.load_core, 0.0)
    result["other_load"] = max(0.0, used - ours)


def run_scenario(
    scenario: str, url: str, args: argparse.Namespace, pids: dict[str, int]
) -> dict[str, Any]:
    if scenario == "c64":
        return run_wrk(url, args=args, pids=pids)
    stream = scenario == "stream"
    concurrency = args.stream_concurrency if stream else 1
    return run_loadgen(url, stream=stream, concurrency=concurrency, args=args, pids=pids)


def wait_quiet(args: argparse.Namespace) -> float:
    """Wait (up to --quiet-wait s) until the two cores are idle; returns the load seen last."""
    deadline = time.monotonic() + args.quiet_wait
    while True:
        before = cpus_busy()
        time.sleep(0.5)
        after = cpus_busy()
        load = sum((after[c] - before[c]) / 0.5 for c in (args.proxy_core, args.load_core))
        if load <= args.max_other_load or time.monotonic() > deadline:
            return load
        log(f"    waiting: other processes are using {load:.2f} cores")


def measured(run: Callable[[], dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Run once on a quiet machine; repeat (--retries) if others used the cores meanwhile."""
    best: dict[str, Any] | None = None
    for attempt in range(1, args.retries + 2):
        wait_quiet(args)
        result = run()
        if "failed" in result:
            return result
        result["attempts"] = attempt
        if best is None or result["other_load"] < best["other_load"]:
            best = result
        if result["other_load"] <= args.max_other_load:
            break
        log(f"    other processes used {result['other_load']:.2f} cores during the run; again")
    assert best is not None
    return best


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break

    def version(cmd: list[str]) -> str:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        except OSError:
            return "?"
        return (p.stdout + p.stderr).strip().splitlines()[0] if (p.stdout + p.stderr) else "?"

    def git(*a: str) -> str:
        p = subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT)
        return p.stdout.strip()

    return {
        "nproc": os.cpu_count(),
        "cpu_model": model or platform.processor() or "?",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "nginx": version([shutil.which("nginx") or "/usr/sbin/nginx", "-v"]),
        "wrk": version(["wrk", "-v"]),
        "commit": git("rev-parse", "--short", "HEAD"),
        "router_changes_uncommitted": bool(git("status", "--porcelain", "--", "router")),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into SystemExit so the ``finally`` that stops every process runs."""

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def start_target(
    name: str, backend: Proc, backend_b: Proc, args: argparse.Namespace, tmp: Path
) -> Proc:
    core = args.proxy_core
    if name == "nginx":
        return start_nginx(tmp / "nginx", backend.url, core, args.nginx)
    if name in ROUTERS:
        # The router refuses one URL in both pools, so the baseline pool gets a second,
        # identical fake backend on the same core; its CPU is counted with the first's.
        env = {
            "SPEC_ROUTER_SPECULATIVE_URLS": backend.url,
            "SPEC_ROUTER_BASELINE_URLS": backend_b.url,
        }
        if args.table:
            table = tmp / name / "table.json"
            shutil.copy(args.table, table)
            env["SPEC_ROUTER_TABLE_PATH"] = str(table)
        env.update(args.router_env)
        env.update(ROUTER_ENV.get(name, {}))
        cwd = ROOT
        if name == "router_ref":  # its own package first: the cwd is on the path, and this
            cwd = args.router_ref
            env["PYTHONPATH"] = str(cwd)
        if name == "router_serve":
            cmd = [PY, "-m", "router", "serve", "--host", "127.0.0.1", "--port", "0"]
            proc = spawn(name, cmd, core, env, cwd)
        else:
            proc = start_uvicorn(name, core, env, cwd)
        wait_ready(proc.url)
        if name == "router_ui":
            proc.feed = FeedReader(proc.url)
            wait_feed(proc.url)
        return proc
    return start_candidate(name, backend.url, core)


def start_uvicorn(name: str, core: int | None, env: dict[str, str], cwd: Path) -> Proc:
    """The router as the README runs it: ``uvicorn router.app:app`` (it announces no URL: a
    free port, then its /health)."""
    port = free_port()
    cmd = [str(Path(PY).parent / "uvicorn"), "router.app:app", "--host", "127.0.0.1",
           "--port", str(port), "--log-level", "warning", "--no-access-log"]  # fmt: skip
    popen = subprocess.Popen(
        [*PRIORITY, *pinned(core), *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        cwd=str(cwd),
    )
    proc = Proc(name, popen, url=f"http://127.0.0.1:{port}", measured_pid=popen.pid)
    threading.Thread(target=_drain, args=(proc,), daemon=True).start()
    if not wait_port(port, START_TIMEOUT):
        proc.stop()
        raise StartError(f"{name}: uvicorn did not listen on {port}:\n{proc.tail()}")
    return proc


def start_candidate(name: str, upstream: str, core: int | None) -> Proc:
    """One of bench/candidates/ in front of ``upstream``, pinned to ``core``."""
    env, script_name = None, name
    if name in FLOOR_WORK:
        env, script_name = {"HTTP_FLOOR_WORK_US": str(FLOOR_WORK[name])}, "http_floor"
    script = str(HERE / "candidates" / f"{script_name}.py")
    return spawn(name, [PY, script, "--upstream", upstream, "--port", "0"], core, env)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    backend_cmd = [PY, str(HERE / "fake_backend.py"), "--port", "0"]
    backend_cmd += ["--chunks", str(args.chunks), "--interval-ms", str(args.interval_ms)]
    backend_cmd += ["--first-delay-ms", str(args.first_delay_ms), "--jitter", str(args.jitter)]
    procs: dict[str, Proc] = {}
    notes: dict[str, str] = {}
    headers: dict[str, dict[str, str]] = {}
    runs: list[dict[str, Any]] = []
    load_core = None if args.unpinned else args.load_core
    backend = spawn("backend", backend_cmd, load_core)
    try:
        backend_b = spawn("backend_b", backend_cmd, load_core)
    except StartError:
        backend.stop()
        raise
    try:
        for name in args.targets:
            if name == "direct":
                continue
            (tmp / name).mkdir()
            try:
                procs[name] = start_target(name, backend, backend_b, args, tmp)
            except (StartError, OSError) as exc:
                notes[name] = f"did not start: {exc}"
                log(f"skip {name}: {exc}")
                continue
            error, hdrs = smoke(procs[name].url)
            if error is not None:
                notes[name] = f"failed the smoke test: {error}"
                log(f"skip {name}: {error}\n{procs[name].tail()}")
                procs.pop(name).stop()
                continue
            headers[name] = {k: v for k, v in hdrs.items() if k.startswith("x-spec-router")}
            log(f"{name}: {procs[name].url} (pid {procs[name].measured_pid})")
        targets = [t for t in args.targets if t == "direct" or t in procs]
        for rep in range(args.reps):
            for scenario in args.scenarios:
                for name in targets:
                    proc = procs.get(name)
                    if proc is not None and not proc.alive():
                        notes.setdefault(name, f"exited during the run:\n{proc.tail()}")
                        continue
                    url = backend.url if proc is None else proc.url
                    pids = {"backend": backend.measured_pid, "backend_b": backend_b.measured_pid}
                    if proc is not None:
                        pids["target"] = proc.measured_pid
                    result = measured(
                        functools.partial(run_scenario, scenario, url, args, pids), args
                    )
                    runs.append({"rep": rep, "target": name, "scenario": scenario, **result})
                    log(_progress(rep, args.reps, scenario, name, result))
                    # A checkpoint, so an interrupted run still leaves its measurements.
                    args.out.mkdir(parents=True, exist_ok=True)
                    (args.out / "overhead.partial.json").write_text(json.dumps(runs) + "\n")
                    time.sleep(args.settle)
    finally:
        for name, proc in procs.items():
            if proc.feed is not None:
                read = f"live-page feed read all along: {proc.feed.events} snapshots"
                notes[name] = f"{notes[name]}; {read}" if name in notes else read
            proc.stop()
        backend.stop()
        backend_b.stop()
    return {"runs": runs, "notes": notes, "router_headers": headers.get("router", {})}


def _progress(rep: int, reps: int, scenario: str, name: str, r: dict[str, Any]) -> str:
    head = f"[{rep + 1}/{reps}] {scenario:<6} {name:<18}"
    if "failed" in r:
        return f"{head} FAILED {r['failed']}"
    text = f"{head} {r['rps']:9.1f} req/s  p50 {r.get('p50_ms') or 0:8.3f} ms"
    if r.get("ttfc_p50_ms") is not None:
        text += f"  ttfc p50 {r['ttfc_p50_ms']:7.2f} p99 {r['ttfc_p99_ms']:7.2f} ms"
    elif "ttfc_p50_ms" in r:  # (no stream completed: the errors below say why)
        text += "  ttfc –"
    cpu = r.get("cpu_target")
    text += f"  cpu {cpu:.2f}" if cpu is not None else ""
    text += f"  other {r['other_load']:.2f}" if r.get("other_load", 0) >= 0.02 else ""
    return text + (f"  errors {r['errors']}" if r.get("errors") else "")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5, help="repetitions per (target, scenario)")
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each")
    p.add_argument("--settle", type=float, default=0.5, help="pause between runs")
    p.add_argument(
        "--targets",
        default=",".join(t for t in TARGETS if t != "router_ref"),
        help=f"of {','.join(TARGETS)}",
    )
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"of {','.join(SCENARIOS)}")
    p.add_argument("--stream-concurrency", type=int, default=256)
    p.add_argument("--c64", type=int, default=64, help="connections for the wrk scenario")
    p.add_argument("--chunks", type=int, default=20)
    p.add_argument("--interval-ms", type=float, default=10.0)
    p.add_argument(
        "--max-other-load",
        type=float,
        default=0.10,
        help="cores other processes may use during a run before it is repeated",
    )
    p.add_argument("--retries", type=int, default=3, help="repeats of a run others disturbed")
    p.add_argument("--quiet-wait", type=float, default=60.0, help="max seconds to wait for quiet")
    p.add_argument("--out", type=Path, default=HERE / "results", help="directory for the report")
    p.add_argument("--name", default="overhead", help="report file names: NAME.md, NAME.json")
    p.add_argument(
        "--router-ref", type=Path, help="a checkout whose router is the target router_ref"
    )
    p.add_argument(
        "--priority",
        action="store_true",
        help="run every process of the run at nice -20 (root): others' CPU-bound jobs then "
        "take little from it; their load is still reported",
    )
    p.add_argument(
        "--table",
        default=str(TABLE),
        help="calibrated table the routers start from (a copy; '' for none: no curves yet)",
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="a setting for every router target (e.g. SPEC_ROUTER_POLICY=spillover); repeatable",
    )
    p.add_argument(
        "--loadgen",
        choices=["raw", "aiohttp"],
        default="raw",
        help="streaming load generator: loadgen_raw.py (C parser, callbacks) or "
        "loadgen_aiohttp.py (aiohttp, as independent harnesses use)",
    )
    p.add_argument(
        "--new-connections",
        action="store_true",
        help="a new connection per streamed request (no client keep-alive), as tail.py's load "
        "generator does",
    )
    p.add_argument(
        "--first-delay-ms",
        type=float,
        default=0.0,
        help="the backend sends its headers alone and the first chunk this much later",
    )
    p.add_argument(
        "--jitter",
        type=float,
        default=0.0,
        help="each stream's chunk gap drawn from interval x (1 +- JITTER): streams that start "
        "together drift apart instead of ending (and restarting) together",
    )
    p.add_argument(
        "--unpinned",
        action="store_true",
        help="backend and load generator not pinned (they may run on the proxy's core)",
    )
    args = p.parse_args(argv)
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if any("=" not in kv for kv in args.env):
        p.error("--env takes K=V")
    args.router_env = dict(kv.split("=", 1) for kv in args.env)
    if args.priority:
        PRIORITY[:] = ["nice", "-n", "-20"]
    if "router_ref" in args.targets and args.router_ref is None:
        p.error("the target router_ref needs --router-ref DIR")
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for t in args.targets:
        if t not in TARGETS:
            p.error(f"unknown target {t!r}; choose from {', '.join(TARGETS)}")
    for s in args.scenarios:
        if s not in SCENARIOS:
            p.error(f"unknown scenario {s!r}; choose from {', '.join(SCENARIOS)}")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        p.error("needs two CPUs: one for the proxy under test, one for backend + load generator")
    args.proxy_core, args.load_core = cpus[0], cpus[1]
    args.nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    args.wrk = shutil.which("wrk")
    if "nginx" in args.targets and not args.nginx:
        p.error("nginx not found (bench/run.sh installs it: apt-get install -y nginx-light)")
    if "c64" in args.scenarios and not args.wrk:
        p.error("wrk not found (bench/run.sh installs it: apt-get install -y wrk)")
    if not shutil.which("taskset"):
        p.error("taskset not found (util-linux)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python bench/overhead.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    log(f"proxy under test on CPU {args.proxy_core}; backend and load generator on CPU "
        f"{args.load_core}; {args.reps} reps x {args.duration:g} s")  # fmt: skip
    with terminate_on_sigterm(), tempfile.TemporaryDirectory(prefix="overhead-") as tmp:
        measured = measure(args, Path(tmp))
    config = {
        "reps": args.reps,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "stream_concurrency": args.stream_concurrency,
        "c64_connections": args.c64,
        "chunks": args.chunks,
        "interval_ms": args.interval_ms,
        "max_other_load": args.max_other_load,
        "retries": args.retries,
        "proxy_core": args.proxy_core,
        "load_core": args.load_core,
        "loadgen": args.loadgen + (" (new connections)" if args.new_connections else ""),
        "first_delay_ms": args.first_delay_ms,
        "jitter": args.jitter,
        "unpinned": args.unpinned,
        "table": args.table,
        "router_env": args.router_env,
        "priority": args.priority,
    }
    meta = {"command": command.strip(), "machine": machine(), "config": config}
    summary = summarize(measured["runs"], args.targets, args.scenarios)
    report = {**meta, "notes": measured["notes"], "router_headers": measured["router_headers"]}
    report.update(summary=summary, runs=measured["runs"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text(render_markdown(report))
    (args.out / "overhead.partial.json").unlink(missing_ok=True)
    log(f"wrote {args.out / args.name}.md and {args.name}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
