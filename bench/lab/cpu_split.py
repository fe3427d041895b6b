"""Where a proxy's CPU goes under bench/overhead.py's streaming load: user and system time per
stream, and how often the kernel preempted its event loop or kept it waiting for a core.

Starts two fake backends (bench/fake_backend.py), the target on CPU 0, and bench/loadgen_raw.py;
reads the target's ``/proc`` counters over the measured window. The targets are the router (with
its default settings, with busy polling off, or spinning whatever its neighbours do) and the
candidates of bench/candidates/: tcp_pipe.py, the floor of a Python proxy, http_floor.py, the
floor of an HTTP-aware one, and the typical Python stacks. ``--where``:

- ``pinned``: backends and load generator on CPU 1 (the target's core is its own);
- ``unpinned``: they may run on the target's core;
- ``hog``: as pinned, plus a busy loop pinned to the target's core.

    python bench/lab/cpu_split.py --target router --chunks 20
    python bench/lab/cpu_split.py --target router --where hog --concurrency 16

The switches and the waiting are the main thread's (the event loop's), from
``/proc/<pid>/status`` and ``/proc/<pid>/schedstat``: what router/fastpath/busypoll.py's
``ShareWatch`` reads to tell a shared core.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# (bench/lab/: the maintained benchmarks' modules are one folder up)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from overhead import CANDIDATES, CHAT, HERE, PY, ROUTER_ENV, spawn, start_candidate, wait_ready  # noqa: E402

from router.tools.processes import pinned  # noqa: E402


def counters(pid: int) -> tuple[float, float, int, float]:
    """User and system CPU seconds of the process; involuntary context switches and seconds
    runnable but waiting for a core, of its main thread."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    hz = os.sysconf("SC_CLK_TCK")
    status = dict(
        line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    waited = int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    return (
        int(stat[11]) / hz,
        int(stat[12]) / hz,
        int(status["nonvoluntary_ctxt_switches"]),
        waited,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=[*ROUTER_ENV, *CANDIDATES], default="router")
    p.add_argument("--where", choices=["pinned", "unpinned", "hog"], default="pinned")
    p.add_argument("--chunks", type=int, default=20)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--seconds", type=float, default=6.0, help="measured window")
    p.add_argument(
        "--first-delay-ms",
        type=float,
        default=0.0,
        help="the backends send the headers alone and the first chunk this much later",
    )
    args = p.parse_args(argv)
    others = None if args.where == "unpinned" else 1
    backend_cmd = [PY, str(HERE / "fake_backend.py"), "--port", "0", "--chunks", str(args.chunks)]
    backend_cmd += ["--first-delay-ms", str(args.first_delay_ms)]
    backends = [spawn(f"backend{i}", backend_cmd, others) for i in (1, 2)]
    procs = list(backends)
    hog = None
    try:
        if args.target in CANDIDATES:
            target = start_candidate(args.target, backends[0].url, 0)
        else:
            env = {
                "SPEC_ROUTER_SPECULATIVE_URLS": backends[0].url,
                "SPEC_ROUTER_BASELINE_URLS": backends[1].url,
                **ROUTER_ENV[args.target],
            }
            cmd = [PY, "-m", "router", "serve", "--port", "0"]
            target = spawn(args.target, cmd, 0, env)
            wait_ready(target.url)
        procs.append(target)
        if args.where == "hog":
            hog = subprocess.Popen([*pinned(0), PY, "-c", "while True: pass"])
        pid = target.popen.pid
        load = [PY, str(HERE / "loadgen_raw.py"), target.url + CHAT, "--stream"]
        load += ["-c", str(args.concurrency), "--warmup", "2", "-d", str(args.seconds + 2)]
        loadgen = subprocess.Popen([*pinned(others), *load], stdout=subprocess.PIPE, text=True)
        time.sleep(3)  # the load generator's warm-up, and a second of load
        before, t0 = counters(pid), time.monotonic()
        time.sleep(args.seconds)
        after, span = counters(pid), time.monotonic() - t0
        out, _ = loadgen.communicate(timeout=60)
        result = json.loads(out.strip().splitlines()[-1])
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        for proc in procs:
            proc.stop()
    user, system, switches, waited = ((a - b) / span for a, b in zip(after, before, strict=True))
    rate = result["rps"]
    print(
        f"{args.target} {args.where} chunks {args.chunks} c {args.concurrency}"
        f"{f' first delay {args.first_delay_ms:g} ms' if args.first_delay_ms else ''}: "
        f"{rate:,.0f} streams/s, user {1000 * user / rate:.3f} ms/stream, "
        f"system {1000 * system / rate:.3f} ms/stream ({user + system:.2f} cores), "
        f"{switches:,.0f} involuntary switches/s, {100 * waited:.1f}% waiting for a core, "
        f"TTFC p99 {result['ttfc_ms']['p99']:.1f} ms, {result['errors']} errors"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
