"""Profile the router's hot path under one of the overhead scenarios, with py-spy.

Starts two fake backends and the router the way bench/overhead.py does (router on CPU 0,
everything else on CPU 1), drives one scenario, samples the router with py-spy, and prints
where its CPU goes: self time by function (where the interpreter was), then inclusive time by
function (what a call costs with everything under it). py-spy is not a project dependency:
``pip install py-spy`` first.

    python bench/lab/profile_router.py stream --seconds 15
    python bench/lab/profile_router.py c64 --raw /tmp/c64.txt   # keep the collapsed stacks too

Caveat: py-spy pauses the process to sample, so the router runs slower than in the benchmark;
read the shares, not the absolute rates. Samples taken inside C code (uvloop, socket writes)
are charged to the Python line that called it.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# (bench/lab/: the maintained benchmarks' modules are one folder up)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from overhead import CHAT, HERE, PY, spawn, wait_ready  # noqa: E402

_PATH = re.compile(r"\((?:/[^()]*?site-packages/|/[^()]*?/lib/python3\.\d+/|" + re.escape(
    str(HERE.parent) + "/") + r")")  # fmt: skip


def _frame(raw: str) -> str:
    """``fn (path:line)`` → ``fn (short/path)``: functions, not lines, are what add up."""
    return re.sub(r":\d+\)$", ")", _PATH.sub("(", raw))


def shares(collapsed: Path, top: int) -> str:
    own: collections.Counter[str] = collections.Counter()
    total_in: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        if not line.strip():
            continue
        stack, count = line.rsplit(" ", 1)
        n = int(count)
        total += n
        frames = [_frame(f) for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if frames:
            own[frames[-1]] += n
            for f in set(frames):
                total_in[f] += n
    if not total:
        return "no samples"
    out = [f"{total} samples", "", "self time by function:"]
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(top)]
    out += ["", "inclusive time by function (router/, uvicorn's send, prometheus, json):"]
    keep = ("(router/", "RequestResponseCycle", "prometheus_client", "(json/")
    rows = [(f, n) for f, n in total_in.most_common() if any(k in f for k in keep)]
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in rows[: top * 2]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenario", choices=["c1", "stream", "c64"])
    p.add_argument("--seconds", type=int, default=12)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--raw", type=Path, help="also keep py-spy's collapsed stacks here")
    p.add_argument("--native", action="store_true", help="sample C frames too (py-spy --native)")
    p.add_argument("--chunks", type=int, default=20, help="SSE chunks per stream (fake backend)")
    args = p.parse_args(argv)
    pyspy = shutil.which("py-spy") or str(Path(PY).parent / "py-spy")
    if not os.path.exists(pyspy):
        p.error("py-spy not found: pip install py-spy")
    backend_cmd = [PY, str(HERE / "fake_backend.py"), "--port", "0", "--chunks", str(args.chunks)]
    backends = [spawn(f"backend{i}", backend_cmd, 1) for i in (1, 2)]
    router = None
    try:
        env = {
            "SPEC_ROUTER_SPECULATIVE_URLS": backends[0].url,
            "SPEC_ROUTER_BASELINE_URLS": backends[1].url,
        }
        router = spawn("router", [PY, "-m", "router", "serve", "--port", "0"], 0, env)
        wait_ready(router.url)
        with tempfile.TemporaryDirectory() as tmp:
            out = args.raw or Path(tmp) / "stacks.txt"
            spy = subprocess.Popen(
                ["taskset", "-c", "1", pyspy, "record", "--pid", str(router.popen.pid),
                 "--rate", str(args.rate), "--duration", str(args.seconds), "--format", "raw",
                 "--output", str(out), *(["--native"] if args.native else [])],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            url = router.url + CHAT
            if args.scenario == "c64":
                load = ["wrk", "-t1", "-c64", f"-d{args.seconds}s", "-s"]
                load += [str(HERE / "wrk_post.lua"), url]
            else:
                load = [PY, str(HERE / "loadgen_raw.py"), url, "--warmup", "0"]
                load += ["-d", str(args.seconds)]
                load += ["-c", "256", "--stream"] if args.scenario == "stream" else ["-c", "1"]
            done = subprocess.run(["taskset", "-c", "1", *load], capture_output=True, text=True)
            _, err = spy.communicate(timeout=args.seconds + 60)
            if spy.returncode != 0:
                print(err, file=sys.stderr)
                return 1
            print(done.stdout.strip()[:600])
            print(shares(out, args.top))
    finally:
        if router is not None:
            router.stop()
        for b in backends:
            b.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
