"""Scale figures (issue 14): the router against nginx in the same run, on the same backends.

Three sections, each a table in bench/results/scale.md (and scale.json):

- ``events``: SSE events relayed per second per core, chunks with no gap (``--chunks`` 200 at
  0 ms): the proxy pinned to one core, the fake backends and bench/loadgen_raw.py on the other;
  events/s divided by the proxy's measured CPU gives events per core-second.
- ``rss``: memory at 1,000 and 5,000 concurrent idle-ish streams (one chunk a second): the
  proxy's RSS (``/proc/PID/status``) before and at the peak during the window, per stream.
- ``workers``: non-streaming req/s (64 connections) and streaming events/s (64 streams, no gap)
  with ``spec-router serve --workers 1`` and ``--workers 2``, nginx with 1 and 2 worker
  processes; nothing pinned (on a 2-core machine the proxy's processes, the backends and the
  load generator share both cores, and the table says how much CPU each used). The scaling
  ratio is workers 2 over workers 1.

    python bench/scale.py                       # all three, ~5 minutes
    python bench/scale.py --sections rss --streams 1000,5000

Each number is one run (``--reps`` for more, medians then); the machine's other load during each
window is reported next to it (``other``), as in bench/overhead.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loadgen_raw import cpus_busy
from overhead import PY, Proc, StartError, _drain, free_port, machine, spawn, wait_port, wait_ready

from router.tools.processes import pinned

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CHAT = "/v1/chat/completions"
SECTIONS = ["events", "rss", "workers"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


# -- processes ---------------------------------------------------------------------------------
def backends(chunks: int, interval_ms: float, core: int | None) -> tuple[Proc, Proc]:
    cmd = [PY, str(HERE / "fake_backend.py"), "--port", "0", "--chunks", str(chunks)]
    cmd += ["--interval-ms", str(interval_ms)]
    a = spawn("backend", cmd, core)
    try:
        return a, spawn("backend_b", cmd, core)
    except StartError:
        a.stop()
        raise


def start_router(a: Proc, b: Proc, core: int | None, workers: int) -> tuple[Proc, list[int]]:
    env = {"SPEC_ROUTER_SPECULATIVE_URLS": a.url, "SPEC_ROUTER_BASELINE_URLS": b.url}
    if core is None:  # sharing cores with the load: no busy polling (README)
        env["SPEC_ROUTER_BUSY_POLL_US"] = "0"
    cmd = [PY, "-m", "router", "serve", "--port", "0", "--workers", str(workers)]
    proc = spawn(f"router-w{workers}", cmd, core, env)
    wait_ready(proc.url)
    pids = children(proc.measured_pid) if workers > 1 else [proc.measured_pid]
    return proc, pids


def start_nginx(tmp: Path, upstream: str, core: int | None, workers: int) -> tuple[Proc, list[int]]:
    port = free_port()
    conf = (HERE / "nginx.conf.template").read_text()
    conf = conf.replace("worker_processes 1;", f"worker_processes {workers};")
    conf = conf.replace("@PREFIX@", str(tmp)).replace("@LISTEN@", f"127.0.0.1:{port}")
    conf = conf.replace("@UPSTREAM@", upstream.removeprefix("http://"))
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "nginx.conf").write_text(conf)
    binary = "/usr/sbin/nginx"
    cmd = [*pinned(core), binary, "-p", str(tmp), "-c", str(tmp / "nginx.conf")]
    popen = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True
    )
    proc = Proc(f"nginx-w{workers}", popen, url=f"http://127.0.0.1:{port}")
    threading.Thread(target=_drain, args=(proc,), daemon=True).start()
    if not wait_port(port):
        proc.stop()
        raise StartError(f"nginx did not listen on {port}: {proc.tail()}")
    deadline = time.monotonic() + 5
    while len(children(popen.pid)) < workers and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.measured_pid = popen.pid
    return proc, children(popen.pid)


@contextlib.contextmanager
def target(
    kind: str, workers: int, a: Proc, b: Proc, core: int | None, tmp: Path
) -> Iterator[tuple[str, list[int]]]:
    if kind == "direct":
        yield a.url, []
        return
    if kind == "nginx":
        where = tmp / f"nginx-{workers}-{time.monotonic_ns()}"
        proc, pids = start_nginx(where, a.url, core, workers)
    else:
        proc, pids = start_router(a, b, core, workers)
    try:
        yield proc.url, pids
    finally:
        proc.stop()


# -- load --------------------------------------------------------------------------------------
def loadgen(
    url: str,
    *,
    stream: bool,
    concurrency: int,
    args: argparse.Namespace,
    pids: list[int],
    core: int | None,
    warmup: float | None = None,
    watch_rss: bool = False,
) -> dict[str, Any]:
    warm = args.warmup if warmup is None else warmup
    cmd = [*pinned(core), PY, str(HERE / "loadgen_raw.py"), url + CHAT, "-c", str(concurrency)]
    cmd += ["-d", str(args.duration), "--warmup", str(warm), "--drain", "20"]
    if stream:
        cmd.append("--stream")
    for pid in pids:
        cmd += ["--cpu-pid", str(pid)]
    peak = [0]
    before = rss_kib(pids)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.25):
            peak[0] = max(peak[0], rss_kib(pids))

    sampler = threading.Thread(target=sample, daemon=True)
    if watch_rss:
        sampler.start()
    busy0 = cpus_busy()
    t0 = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=warm + args.duration + 90)
    wall = time.monotonic() - t0
    busy = sum(cpus_busy().values()) - sum(busy0.values())
    done.set()
    if run.returncode != 0:
        return {"failed": run.stderr.strip()[-300:]}
    raw = json.loads(run.stdout)
    cores = raw["cpu_cores"]
    cpu_target = sum(cores.get(str(p), 0.0) for p in pids)
    ours = cpu_target + sum(v for k, v in cores.items() if int(k) not in pids)
    result = {
        "rps": raw["rps"],
        "events_per_s": raw.get("events_per_s"),
        "errors": raw["errors"],
        "cpu_target": cpu_target if pids else None,
        "cpu_other_measured": sum(v for k, v in cores.items() if int(k) not in pids),
        # what the machine did besides our processes over the window (an over-estimate: the
        # backends' CPU is not sampled here, and the whole run is longer than the window)
        "machine_busy": busy / wall,
        "ours_sampled": ours,
        "ttfc_p99_ms": raw.get("ttfc_ms", {}).get("p99"),
        "p50_ms": raw.get("latency_ms", {}).get("p50"),
    }
    if watch_rss:
        result.update(rss_before_kib=before, rss_peak_kib=peak[0])
    return result


# -- sections ----------------------------------------------------------------------------------
def section_events(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    rows = []
    a, b = backends(args.burst_chunks, 0.0, args.load_core)
    try:
        for kind in ("direct", "nginx", "router"):
            for rep in range(args.reps):
                with target(kind, 1, a, b, args.proxy_core, tmp) as (url, pids):
                    r = loadgen(
                        url, stream=True, concurrency=64, args=args, pids=pids, core=args.load_core
                    )
                r.update(kind=kind, rep=rep)
                if r.get("cpu_target"):
                    r["events_per_core_s"] = r["events_per_s"] / r["cpu_target"]
                log(f"events {kind}: {json.dumps(r)}")
                rows.append(r)
    finally:
        a.stop()
        b.stop()
    return rows


def section_rss(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    rows = []
    a, b = backends(args.idle_chunks, 1000.0, args.load_core)
    try:
        for n in args.streams:
            for kind in ("nginx", "router"):
                with target(kind, 1, a, b, args.proxy_core, tmp) as (url, pids):
                    # connections open 64 at a time: let them all be streaming before the window
                    r = loadgen(
                        url, stream=True, concurrency=n, args=args, pids=pids,
                        core=args.load_core, warmup=max(args.warmup, n / 1000), watch_rss=True,
                    )  # fmt: skip
                r.update(kind=kind, streams=n)
                if "rss_peak_kib" in r:
                    r["kib_per_stream"] = (r["rss_peak_kib"] - r["rss_before_kib"]) / n
                log(f"rss {kind} {n}: {json.dumps(r)}")
                rows.append(r)
    finally:
        a.stop()
        b.stop()
    return rows


def section_workers(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    rows = []
    for stream in (False, True):
        a, b = backends(args.burst_chunks, 0.0, None)
        try:
            for rep in range(args.reps):
                for kind in ("nginx", "router"):
                    for workers in (1, 2):
                        with target(kind, workers, a, b, None, tmp) as (url, pids):
                            r = loadgen(
                                url, stream=stream, concurrency=64, args=args, pids=pids, core=None
                            )
                        r.update(kind=kind, workers=workers, stream=stream, rep=rep)
                        log(f"workers {kind} w{workers} stream={stream}: {json.dumps(r)}")
                        rows.append(r)
        finally:
            a.stop()
            b.stop()
    return rows


# -- report ------------------------------------------------------------------------------------
def med(rows: list[dict[str, Any]], key: str, **match: Any) -> float | None:
    values = [
        r[key]
        for r in rows
        if all(r.get(k) == v for k, v in match.items()) and r.get(key) is not None
    ]
    return statistics.median(values) if values else None


def fmt(v: float | None, spec: str = ",.0f") -> str:
    return "–" if v is None else format(v, spec)


def render(report: dict[str, Any]) -> str:
    m, cfg = report["machine"], report["config"]
    out = [
        "# Scale",
        "",
        *([f"**{report['note']}**", ""] if report.get("note") else []),
        "Generated by `bench/scale.py`. The router against nginx in the same run, on the same "
        "fake backends (bench/fake_backend.py) and load generator (bench/loadgen_raw.py).",
        "",
        f"- Command: `{report['command']}`",
        f"- Machine: {m['nproc']} CPUs, {m['cpu_model']}, Linux {m['kernel']}, Python "
        f"{m['python']}, {m['nginx']}",
        f"- Commit: `{m['commit']}`, {m['date']}; {cfg['reps']} rep(s) of {cfg['duration']:g} s "
        "each (medians)",
        "",
    ]
    s = report["sections"]
    if "events" in s:
        rows = s["events"]
        out += [
            f"## SSE events per core ({cfg['burst_chunks']} chunks per stream, no gap, 64 streams)",
            "",
            f"The proxy pinned to CPU {cfg['proxy_core']}; backends and load generator on CPU "
            f"{cfg['load_core']}. Events per core-second = events/s ÷ the proxy's CPU.",
            "",
            "| stack | events/s | proxy CPU (cores) | events per core-second | errors |",
            "|---|---|---|---|---|",
        ]
        for kind in ("direct", "nginx", "router"):
            out.append(
                f"| {kind} | {fmt(med(rows, 'events_per_s', kind=kind))} | "
                f"{fmt(med(rows, 'cpu_target', kind=kind), '.2f')} | "
                f"{fmt(med(rows, 'events_per_core_s', kind=kind))} | "
                f"{fmt(med(rows, 'errors', kind=kind))} |"
            )
        out.append("")
    if "rss" in s:
        rows = s["rss"]
        out += [
            "## Memory at many idle-ish streams (one chunk a second)",
            "",
            "RSS of the proxy process (nginx: its one worker) before the load and at its "
            "peak while the streams were open.",
            "",
            "| stack | streams | RSS before (MiB) | RSS peak (MiB) | KiB per stream | errors |",
            "|---|---|---|---|---|---|",
        ]
        for r in rows:
            before, peak = r.get("rss_before_kib", 0) / 1024, r.get("rss_peak_kib", 0) / 1024
            out.append(
                f"| {r['kind']} | {r['streams']:,} | {fmt(before, '.1f')}"
                f" | {fmt(peak, '.1f')} | "
                f"{fmt(r.get('kib_per_stream'), '.1f')} | {r.get('errors', '–')} |"
            )
        out.append("")
    if "workers" in s:
        rows = s["workers"]
        out += [
            "## One worker and two, on this 2-core machine",
            "",
            "Nothing pinned: the proxy's processes, the two backends and the load generator "
            "share both cores (the router without busy polling, which only helps on a core of "
            "its own). Non-streaming: 64 keep-alive connections; streaming: 64 streams of "
            f"{cfg['burst_chunks']} chunks with no gap. Ratio: 2 workers ÷ 1.",
            "",
            "| stack | workers | req/s | proxy CPU | events/s (streaming) | proxy CPU | "
            "machine busy (cores) |",
            "|---|---|---|---|---|---|---|",
        ]
        for kind in ("nginx", "router"):
            for w in (1, 2):
                out.append(
                    f"| {kind} | {w} | {fmt(med(rows, 'rps', kind=kind, workers=w, stream=False))}"
                    f" | {fmt(med(rows, 'cpu_target', kind=kind, workers=w, stream=False), '.2f')}"
                    f" | {fmt(med(rows, 'events_per_s', kind=kind, workers=w, stream=True))}"
                    f" | {fmt(med(rows, 'cpu_target', kind=kind, workers=w, stream=True), '.2f')}"
                    f" | {fmt(med(rows, 'machine_busy', kind=kind, workers=w), '.2f')} |"
                )
        out += ["", "| stack | req/s ratio | events/s ratio |", "|---|---|---|"]
        for kind in ("nginx", "router"):
            ratios = []
            for key, stream in (("rps", False), ("events_per_s", True)):
                one = med(rows, key, kind=kind, workers=1, stream=stream)
                two = med(rows, key, kind=kind, workers=2, stream=stream)
                ratios.append(fmt(two / one if one and two else None, ".2f"))
            out.append(f"| {kind} | {ratios[0]} | {ratios[1]} |")
        out.append("")
    return "\n".join(out) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"of {','.join(SECTIONS)}")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--burst-chunks", type=int, default=200, help="chunks per no-gap stream")
    p.add_argument("--idle-chunks", type=int, default=12, help="chunks per idle-ish stream")
    p.add_argument("--streams", default="1000,5000", help="idle-ish stream counts")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--name", default="scale")
    p.add_argument("--note", help="a line to put at the top (e.g. how loaded the machine was)")
    args = p.parse_args(argv)
    args.sections = [s for s in args.sections.split(",") if s]
    args.streams = [int(n) for n in args.streams.split(",") if n]
    args.proxy_core, args.load_core = 0, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python bench/scale.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    sections: dict[str, list[dict[str, Any]]] = {}
    runners = {"events": section_events, "rss": section_rss, "workers": section_workers}
    with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
        for name in args.sections:
            sections[name] = runners[name](args, Path(tmp))
    config = {
        k: getattr(args, k)
        for k in ("reps", "duration", "warmup", "burst_chunks", "idle_chunks", "streams")
    }
    config.update(proxy_core=args.proxy_core, load_core=args.load_core)
    report = {
        "command": command.strip(),
        "machine": machine(),
        "config": config,
        "note": args.note,
        "sections": sections,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / f"{args.name}.md").write_text(render(report))
    log(f"wrote {args.out / args.name}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
