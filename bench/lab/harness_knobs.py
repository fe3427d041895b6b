"""Where tail.py and bench/overhead.py disagree: the streaming tail with one knob changed at a time.

Runs ../shared/bench-independent/tail.py's scenario (256 streams of 20 SSE chunks 10 ms apart,
the router and nginx on one core, backends and load generator on the other), but with each of
the things the two harnesses do differently as a knob, and several variants in one run,
repetitions interleaved (rep 1 of every variant, then rep 2, ...), so that drift hits all alike.
Each router run starts a fresh router, as tail.py does. nginx is measured once per repetition
for each (backend, load generator) pair the variants use.

A variant is ``NAME:knob=value,knob=value``; the knobs (default: tail.py's own choice):

- ``server``: ``uvicorn`` (``uvicorn router.app:app --log-level warning --no-access-log``, the
  README's command and tail.py's), ``serve`` (``python -m router serve``, bench/overhead.py's)
  or ``candidate/NAME`` (bench/candidates/NAME.py, e.g. ``http_floor`` or ``router_callbacks``,
  in front of the first backend alone);
- ``table``: a calibrated table to start from (default tail.py's table.json; ``none``: none);
- ``env``: router settings, ``K=V`` joined by ``+`` (``SPEC_ROUTER_POLICY=spillover``);
- ``backend``: ``tail`` (bench-independent/fake_backend.py) or ``ours`` (bench/fake_backend.py);
- ``loadgen``: ``tail`` (bench-independent/loadgen.py: 5,120 requests after ``warmup``
  requests), ``tail_keep`` (the same with its keep-alive read fixed, see ``keeping_loadgen``:
  one connection per client for the whole run) or ``ours`` (bench/loadgen_raw.py: ``duration``
  seconds after ``warmup`` seconds);
- ``tokens``: chunks per stream for tail's load generators (default 20; the fake backend sends
  one per requested token), e.g. 1 to weigh a request's own cost against its chunks';
- ``warmup``: see ``loadgen`` (default 256 requests, tail.py's, or 1 s for ``ours``);
- ``ref``: a checkout whose router runs (its own ``router`` package first on the path);
- ``newconn``: ``ours`` opens a new connection per request, as tail's load generator does (it
  reads httptools' ``should_keep_alive()`` after the parser has reset it, and so reconnects).

    python bench/lab/harness_knobs.py --reps 3 tail: serve:server=serve notable:table=none

Prints one JSON line per run and a table of medians (router against the same rep's nginx).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# ../shared/bench-independent from the main checkout (and from a worktree one level deeper)
TAIL = next(
    (d for d in (ROOT.parent / "shared" / "bench-independent",
                 ROOT.parent.parent / "shared" / "bench-independent") if d.is_dir()),
    ROOT.parent / "shared" / "bench-independent",
)  # fmt: skip
PY = sys.executable
BIN = Path(PY).parent
ROUTER_CPU, LOAD_CPU = 1, 0  # as tail.py pins them
CLK_TCK = os.sysconf("SC_CLK_TCK")
BACKEND_PIDS: list[int] = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_http(url: str, deadline: float = 30.0) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} never answered 200")


def start(
    args: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.Popen[bytes]:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.Popen(
        args, env=e, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


def stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def busy() -> float:
    """Seconds the machine's CPUs have been busy (user, nice, system, steal), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return sum(int(fields[i]) for i in (1, 2, 3, 8)) / CLK_TCK


def cpu_of(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(parts[11]) + int(parts[12])) / CLK_TCK


PATIENCE = 3600.0  # --patience: the longest wait for a quiet machine before a run


def wait_quiet(limit: float = 0.15, patience: float | None = None) -> float:
    """Wait (up to ``patience`` s, default ``PATIENCE``) until the machine is idle; the load
    seen last, in cores."""
    end = time.monotonic() + (PATIENCE if patience is None else min(patience, PATIENCE))
    while True:
        b0, t0 = busy(), time.monotonic()
        time.sleep(1.0)
        load = (busy() - b0) / (time.monotonic() - t0)
        if load <= limit or time.monotonic() > end:
            return load
        print(f"waiting: other processes use {load:.2f} cores", file=sys.stderr, flush=True)


LOCK: Path | None = None  # --lock: taken (exclusively) around each run, not while waiting


HELD = False  # the lock is held for the whole repetition (--lock-per rep)


@contextlib.contextmanager
def quiet_and_locked() -> Iterator[None]:
    """Wait for a quiet machine, then hold ``LOCK`` exclusively (when set) for one run (or
    for the repetition, when it already does)."""
    if not RT:
        wait_quiet()
    if LOCK is None or HELD:
        yield
        return
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            if not RT:
                wait_quiet()
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --rt: every process of a run at the highest nice priority (-20: CFS gives a nice-0 process
# about 1% of a core against it), for a machine where others' CPU-bound jobs will not stop: they
# then run mostly in the gaps the run leaves. (Not SCHED_FIFO: among the run's own processes on
# one core, equal FIFO priorities would not preempt each other.)
RT: list[str] = []


def pinned(cpu: int, args: list[str]) -> list[str]:
    return [*RT, "taskset", "-c", str(cpu), *args]


@dataclass
class Variant:
    name: str
    server: str = "uvicorn"
    table: str = str(TAIL / "table.json")
    env: dict[str, str] = field(default_factory=dict)
    backend: str = "tail"
    loadgen: str = "tail"
    warmup: float | None = None
    ref: Path | None = None
    newconn: bool = False
    tokens: int = 20

    @property
    def gen(self) -> str:
        """The load generator, as ``_load`` and the nginx references name it."""
        gen = self.loadgen + ("+new" if self.newconn else "")
        return gen if self.tokens == 20 else f"{gen}@{self.tokens}"

    @classmethod
    def parse(cls, text: str) -> Variant:
        name, _, knobs = text.partition(":")
        v = cls(name)
        for knob in filter(None, knobs.split(",")):
            key, _, value = knob.partition("=")
            if key == "env":
                v.env.update(kv.split("=", 1) for kv in value.split("+"))  # type: ignore[misc]
            elif key == "table":
                v.table = "" if value == "none" else value
            elif key == "warmup":
                v.warmup = float(value)
            elif key == "newconn":
                v.newconn = value not in ("", "0", "no", "false")
            elif key == "ref":
                v.ref = Path(value).resolve()
            elif key == "tokens":
                v.tokens = int(value)
            elif key in ("server", "backend", "loadgen"):
                setattr(v, key, value)
            else:
                raise SystemExit(f"unknown knob {key!r}")
        return v


class Backends:
    """Two fake backends of one kind, on LOAD_CPU, for the whole run."""

    def __init__(self, kind: str) -> None:
        self.ports = [free_port(), free_port()]
        self.procs = []
        for port in self.ports:
            if kind == "tail":
                cmd = [PY, str(TAIL / "fake_backend.py"), "--port", str(port)]
            else:
                cmd = [PY, str(ROOT / "bench" / "fake_backend.py"), "--port", str(port)]
                cmd += ["--chunks", "20", "--interval-ms", "10"]
            self.procs.append(start(pinned(LOAD_CPU, cmd)))
            BACKEND_PIDS.append(self.procs[-1].pid)
            wait_http(f"http://127.0.0.1:{port}/health")

    def stop(self) -> None:
        for p in self.procs:
            stop(p)


def load(
    kind: str, port: int, pid: int, warmup: float | None, args: argparse.Namespace
) -> dict[str, Any]:
    """One measured run; ``other``: the cores processes outside the run used meanwhile."""
    result = _accounted(kind, port, pid, warmup, args)
    for _ in range(0 if RT else args.retries):
        if result["other"] <= args.max_other:
            break
        print(f"other processes used {result['other']:.2f} cores: again", file=sys.stderr)
        wait_quiet(patience=30.0)
        result = _accounted(kind, port, pid, warmup, args)
    return result


def _accounted(
    kind: str, port: int, pid: int, warmup: float | None, args: argparse.Namespace
) -> dict[str, Any]:
    ours = [pid, *BACKEND_PIDS]
    before, b0, t0 = [cpu_of(p) for p in ours], busy(), time.monotonic()
    c0 = os.times()
    result = _load(kind, port, pid, warmup, args)
    c1 = os.times()
    spent = busy() - b0
    mine = sum(cpu_of(p) - b for p, b in zip(ours, before, strict=True))
    mine += (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)
    result["other"] = round(max(0.0, spent - mine) / (time.monotonic() - t0), 3)
    return result


def _load(
    kind: str, port: int, pid: int, warmup: float | None, args: argparse.Namespace
) -> dict[str, Any]:
    kind, _, tokens = kind.partition("@")
    if kind in ("tail", "tail_keep"):
        requests = int(warmup if warmup is not None else args.concurrency)
        gen = TAIL / "loadgen.py" if kind == "tail" else keeping_loadgen()
        cmd = [PY, str(gen), "--target", f"127.0.0.1:{port}",
               "-c", str(args.concurrency), "-n", str(args.requests), "--warmup", str(requests),
               "--max-seconds", "60", "--max-tokens", tokens or "20", "--stream",
               "--watch-pids", str(pid)]  # fmt: skip
        r = subprocess.run(pinned(LOAD_CPU, cmd), capture_output=True, text=True, timeout=180)
        if r.returncode:
            raise SystemExit(f"load generator failed: {r.stderr[-300:]}")
        out = json.loads(r.stdout.strip().splitlines()[-1])
        return {
            "rps": out["rps"],
            "ttft_p50": out["ttft_p50_ms"],
            "ttft_p99": out["ttft_p99_ms"],
            "cpu_ms": out["proxy_cpu_us_per_req"] / 1000,
            "errors": out["errors"],
        }
    warm = warmup if warmup is not None else 1.0
    new = ["--new-connections"] if kind == "ours+new" else []
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    cmd = [PY, str(ROOT / "bench" / "loadgen_raw.py"), url, "-c", str(args.concurrency),
           "-d", str(args.duration), "--warmup", str(warm), "--stream",
           "--cpu-pid", str(pid), *new]  # fmt: skip
    r = subprocess.run(pinned(LOAD_CPU, cmd), capture_output=True, text=True, timeout=180)
    if r.returncode:
        raise SystemExit(f"load generator failed: {r.stderr[-300:]}")
    out = json.loads(r.stdout)
    cores = out["cpu_cores"][str(pid)]
    return {
        "rps": out["rps"],
        "ttft_p50": out["ttfc_ms"]["p50"],
        "ttft_p99": out["ttfc_ms"]["p99"],
        "cpu_ms": cores / out["rps"] * 1000 if out["rps"] else None,
        "errors": out["errors"],
    }


# tail's load generator asks httptools' parser whether to keep the connection only after
# ``feed_data`` returned, when llhttp has already reset the message's flags (True inside
# ``on_message_complete``, False after), so it reconnects after every response; the fix reads it
# inside the callback. Applied to a copy, word for word, or not at all.
_KEEP_FROM = (
    "        self.tend = pc()\n",
    "self.events, self.parser.should_keep_alive()",
)
_KEEP_TO = (
    "        self.tend = pc()\n        self.keep = self.parser.should_keep_alive()\n",
    "self.events, self.keep",
)


def keeping_loadgen() -> Path:
    """A copy of tail's loadgen.py that keeps its connections (see ``_KEEP_FROM``)."""
    text = (TAIL / "loadgen.py").read_text()
    for old, new in zip(_KEEP_FROM, _KEEP_TO, strict=True):
        if text.count(old) != 1:
            raise SystemExit(f"tail's loadgen.py changed: the keep-alive fix ({old!r}) fails")
        text = text.replace(old, new)
    path = Path(tempfile.gettempdir()) / "harness_knobs_loadgen_keep.py"
    path.write_text(text)
    return path


def run_router(v: Variant, b: Backends, args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    env = {"SPEC_ROUTER_SPECULATIVE_URLS": f"http://127.0.0.1:{b.ports[0]}",
           "SPEC_ROUTER_BASELINE_URLS": f"http://127.0.0.1:{b.ports[1]}"}  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="knobs-"))
    if v.table:
        shutil.copy(v.table, tmp / "table.json")
        env["SPEC_ROUTER_TABLE_PATH"] = str(tmp / "table.json")
    env.update(v.env)
    cwd = ROOT
    if v.ref is not None:
        cwd = v.ref
        env["PYTHONPATH"] = str(v.ref)
    if v.server == "uvicorn":
        cmd = [str(BIN / "uvicorn"), "router.app:app", "--host", "127.0.0.1", "--port", str(port),
               "--log-level", "warning", "--no-access-log"]  # fmt: skip
    elif v.server.startswith("candidate/"):
        script = ROOT / "bench" / "candidates" / f"{v.server.split('/', 1)[1]}.py"
        upstream = f"http://127.0.0.1:{b.ports[0]}"
        cmd = [PY, str(script), "--upstream", upstream, "--host", "127.0.0.1", "--port", str(port)]
    else:
        cmd = [PY, "-m", "router", "serve", "--host", "127.0.0.1", "--port", str(port)]
    try:
        with quiet_and_locked():
            p = start(pinned(ROUTER_CPU, cmd), env, cwd)
            try:
                wait_http(f"http://127.0.0.1:{port}/health")
                return load(v.gen, port, p.pid, v.warmup, args)
            finally:
                stop(p)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_nginx(b: Backends, loadgen: str, args: argparse.Namespace) -> dict[str, Any]:
    d = Path(tempfile.mkdtemp(prefix="knobs-nginx-"))
    port = free_port()
    conf = f"""worker_processes 1; daemon off; pid {d}/pid; error_log {d}/err;
events {{ worker_connections 4096; }}
http {{ access_log off; client_body_temp_path {d}; proxy_temp_path {d};
 upstream b {{ server 127.0.0.1:{b.ports[0]}; server 127.0.0.1:{b.ports[1]}; keepalive 512; }}
 server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://b; proxy_http_version 1.1;
   proxy_set_header Connection ""; proxy_buffering off; }} }} }}"""
    (d / "nginx.conf").write_text(conf)
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    try:
        with quiet_and_locked():
            p = start(pinned(ROUTER_CPU, [nginx, "-c", str(d / "nginx.conf"), "-p", str(d)]))
            try:
                time.sleep(0.5)
                children = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
                return load(loadgen, port, int(children[0]) if children else p.pid, None, args)
            finally:
                stop(p)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+", help="NAME:knob=value,... (see the module's doc)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--requests", type=int, default=5120, help="tail's load generator")
    ap.add_argument("--duration", type=float, default=4.0, help="our load generator, seconds")
    ap.add_argument("--max-other", type=float, default=0.1, help="cores others may use")
    ap.add_argument("--retries", type=int, default=2, help="repeats of a disturbed run")
    ap.add_argument(
        "--lock", type=Path, help="a lock file held exclusively around each run (flock)"
    )
    ap.add_argument("--rt", action="store_true", help="run every process of a run at nice -20")
    ap.add_argument(
        "--lock-per",
        choices=["run", "rep"],
        default="run",
        help="hold --lock around each run, or around each repetition (a few minutes: fewer "
        "waits where others keep taking it shared)",
    )
    ap.add_argument(
        "--patience",
        type=float,
        default=3600.0,
        help="seconds to wait for a quiet machine before each run (then run anyway)",
    )
    ap.add_argument("--out", type=Path, help="also write every run as JSON here")
    args = ap.parse_args()
    # SIGTERM (a killed job) ends the run through the ``finally`` below, which stops everything
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    global LOCK, PATIENCE
    LOCK, PATIENCE = args.lock, args.patience
    if args.rt:
        RT[:] = ["nice", "-n", "-20"]
    variants = [Variant.parse(t) for t in args.variants]
    refs = sorted({(v.backend, v.gen) for v in variants})
    backends = {kind: Backends(kind) for kind in {v.backend for v in variants}}
    runs: list[dict[str, Any]] = []
    try:
        for rep in range(args.reps):
            with rep_locked(args.lock_per == "rep"):
                runs += one_rep(rep, refs, variants, backends, args)
    finally:
        for b in backends.values():
            b.stop()
    if args.out:
        args.out.write_text(json.dumps({"argv": sys.argv[1:], "runs": runs}, indent=1) + "\n")
    print(table(runs, [v.name for v in variants] + [f"nginx[{k},{g}]" for k, g in refs]))
    return 0


@contextlib.contextmanager
def rep_locked(whole: bool) -> Iterator[None]:
    global HELD
    if not whole or LOCK is None:
        yield
        return
    with quiet_and_locked():
        HELD = True
        try:
            yield
        finally:
            HELD = False


def one_rep(
    rep: int,
    refs: list[tuple[str, str]],
    variants: list[Variant],
    backends: dict[str, Backends],
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    for kind, gen in refs:
        r = {"rep": rep, "variant": f"nginx[{kind},{gen}]", **run_nginx(backends[kind], gen, args)}
        runs.append(r)
        print(json.dumps(r), flush=True)
    for v in variants:
        r = {"rep": rep, "variant": v.name, **run_router(v, backends[v.backend], args)}
        r["nginx"] = f"nginx[{v.backend},{v.gen}]"
        runs.append(r)
        print(json.dumps(r), flush=True)
    return runs


def table(runs: list[dict[str, Any]], names: list[str]) -> str:
    """Medians per variant, and each router run against the same rep's nginx (medians of those)."""
    ref = {(r["rep"], r["variant"]): r for r in runs}
    columns = ["variant", "req/s", "vs nginx", "TTFT p50 ms", "TTFT p99 ms",
               "p99 over nginx ms (each rep)", "CPU ms/stream", "errors",
               "other load (max)"]  # fmt: skip
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for name in names:
        rs = [r for r in runs if r["variant"] == name]
        if not rs:
            continue
        ratio, over = "", ""
        if "nginx" in rs[0]:
            ns = [ref[(r["rep"], r["nginx"])] for r in rs]
            ratio = (
                f"{statistics.median(r['rps'] / n['rps'] for r, n in zip(rs, ns, strict=True)):.0%}"
            )
            extra = [r["ttft_p99"] - n["ttft_p99"] for r, n in zip(rs, ns, strict=True)]
            over = f"{statistics.median(extra):+.1f} ({', '.join(f'{e:+.0f}' for e in extra)})"
        cpu = [r["cpu_ms"] for r in rs if r["cpu_ms"] is not None]
        lines.append(
            f"| {name} | {statistics.median(r['rps'] for r in rs):,.0f} | {ratio} | "
            f"{statistics.median(r['ttft_p50'] for r in rs):.1f} | "
            f"{statistics.median(r['ttft_p99'] for r in rs):.1f} | {over} | "
            f"{statistics.median(cpu) if cpu else float('nan'):.2f} | "
            f"{sum(r['errors'] for r in rs)} | "
            f"{max(r['other'] for r in rs):.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
