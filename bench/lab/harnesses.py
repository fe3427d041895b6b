"""Why two harnesses measure the router's streaming tail differently (issue 14, part 2).

bench/overhead.py's streaming scenario (256 streams of 20 chunks 10 ms apart) is run once per
variant, each changing one thing an independent harness may do differently, and once with all
of them together; the router and nginx are measured in every variant, so each row is a
comparison made within one run:

- ``ours``: bench/loadgen_raw.py (C parser, no task per request; TTFC = first body byte), the
  first chunk sent with the headers, backend and load generator pinned to the other core;
- ``aiohttp``: bench/loadgen_aiohttp.py (TTFT at the first ``data:`` line aiohttp parsed);
- ``headers_first``: the backend sends its headers alone and the first chunk 10 ms later;
- ``new_connections``: aiohttp with a new connection per request (no client keep-alive);
- ``unpinned``: backend and load generator may run on the proxy's core;
- ``all``: aiohttp, headers first and unpinned together.

Each variant also runs ``tcp_pipe`` (bench/candidates/tcp_pipe.py), a uvloop TCP pipe with no
HTTP: the least a proxy written in Python can cost on the same core; and ``http_floor``
(bench/candidates/http_floor.py), the least an HTTP proxy that counts requests can cost: parse,
count, forward and re-frame from socket callbacks, nothing else.

Writes bench/results/overhead-harnesses.md (and each variant's overhead-<name>.json).

    python bench/lab/harnesses.py                    # ~15 minutes
    python bench/lab/harnesses.py --reps 1 --duration 3 --variants ours,aiohttp
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent  # bench/
VARIANTS: dict[str, list[str]] = {
    "ours": [],
    "aiohttp": ["--loadgen", "aiohttp"],
    "headers_first": ["--first-delay-ms", "10"],
    "new_connections": ["--loadgen", "aiohttp", "--new-connections"],
    "unpinned": ["--unpinned"],
    "all": ["--loadgen", "aiohttp", "--first-delay-ms", "10", "--unpinned"],
}
TARGETS = "direct,nginx,router,router_no_busy_poll,http_floor,tcp_pipe"


def run_variant(name: str, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    cmd = [
        sys.executable, str(HERE / "overhead.py"), "--scenarios", "stream", "--targets", TARGETS,
        "--reps", str(args.reps), "--duration", str(args.duration), "--name", f"overhead-{name}",
        "--out", str(args.out), *args.load_policy, *VARIANTS[name],
    ]  # fmt: skip
    print(f"harnesses: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)
    return load_variant(name, args.out)


def load_variant(name: str, out: Path) -> tuple[str, dict[str, Any]]:
    report: dict[str, Any] = json.loads((out / f"overhead-{name}.json").read_text())
    return str(report["command"]), report


def row(name: str, report: dict[str, Any], target: str) -> str:
    s = report["summary"]
    stream = s.get(target, {}).get("scenarios", {}).get("stream", {})
    nginx = s.get("nginx", {}).get("scenarios", {}).get("stream", {})

    def f(v: float | None, spec: str) -> str:
        return "–" if v is None else format(v, spec)

    ratio = stream.get("rps_vs_nginx")
    return (
        f"| {name} | {target} | {f(stream.get('rps'), ',.0f')} | "
        f"{f(None if ratio is None else ratio * 100, '.0f')}% | "
        f"{f(stream.get('ttfc_p50_ms'), '.2f')} | {f(stream.get('ttfc_p99_ms'), '.2f')} | "
        f"{f(nginx.get('ttfc_p99_ms'), '.2f')} | {f(stream.get('ttfc_p99_vs_nginx_ms'), '+.1f')} | "
        f"{f(stream.get('cpu_target'), '.2f')} | {f(stream.get('cpu_loadgen'), '.2f')} | "
        f"{f(stream.get('other_load_max'), '.2f')} |"
    )


READING = """\
How to read it. In this closed loop every stream that ends starts the next at once, so the proxy
must relay 256 x 21 events per ~190 ms whatever it costs; while the CPU it gets covers that,
TTFT is a few ms plus the wait behind the burst of chunks due in the same 10 ms; once it does not
(less CPU than the loop demands: a core shared with the backends or the load generator, other
processes, a client that costs the proxy more per request), requests queue and the tail grows
with the queue, not with the proxy's per-chunk cost. nginx needs about half the router's CPU per
stream (bench/results/overhead.md: 0.36 against 0.68 ms), so the same squeeze that leaves nginx
with room saturates the router first. The columns that tell which case a row is: proxy CPU (near
1.00, or near all the core it could get, means saturated) and other load. tcp_pipe
(bench/candidates/tcp_pipe.py) is the floor of any proxy written in Python: a uvloop TCP pipe with
no HTTP at all; its system time per stream is the router's, so the distance between the two is
what the router does in user space (bench/results/overhead.md, "User space, not system calls")."""


# Everything from this line on in overhead-harnesses.md is written by hand and kept across runs.
HAND_WRITTEN = "<!-- hand-written below: kept when bench/harnesses.py rewrites the page -->"


def keep_hand_written(page: str) -> str:
    """The hand-written part of an existing page (from ``HAND_WRITTEN`` on), to append again."""
    at = page.find(HAND_WRITTEN)
    return "" if at < 0 else "\n" + page[at:]


def render(runs: list[tuple[str, str, dict[str, Any]]], command: str, note: str | None) -> str:
    out = [
        "# The streaming tail under two harnesses",
        "",
        *([f"**{note}**", ""] if note else []),
        "Generated by `bench/lab/harnesses.py`: bench/overhead.py's streaming scenario "
        "(256 streams of 20 chunks 10 ms apart) once per variant; router and nginx in the "
        "same run each time. TTFC/TTFT: from writing the request to the first body byte "
        "(loadgen_raw) or to the first `data:` line aiohttp parsed (loadgen_aiohttp).",
        "",
        f"- Command: `{command}`",
        "",
        "| variant | stack | req/s | vs nginx | TTFT p50 ms | TTFT p99 ms | nginx p99 ms | "
        "p99 vs nginx ms | proxy CPU | load-gen CPU | other load (max) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, _, report in runs:
        for target in ("nginx", "router", "router_no_busy_poll", "http_floor", "tcp_pipe"):
            out.append(row(name, report, target))
    out += ["", READING, "", "Each variant's own command:", ""]
    for name, cmd, _ in runs:
        out.append(f"- {name}: `{cmd}`")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument(
        "--report", action="store_true", help="only rebuild the page from the variants' JSON"
    )
    p.add_argument("--note", help="a line to put at the top (e.g. how loaded the machine was)")
    p.add_argument(
        "--loaded",
        action="store_true",
        help="the machine is shared: do not wait for quiet cores or repeat disturbed runs "
        "(the other load is still reported)",
    )
    args = p.parse_args(argv)
    args.load_policy = (
        ["--max-other-load", "4", "--retries", "0", "--quiet-wait", "0"] if args.loaded else []
    )
    names = [v for v in args.variants.split(",") if v]
    for name in names:
        if name not in VARIANTS:
            p.error(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
    command = "python bench/lab/harnesses.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    runs = [
        (name, *(load_variant(name, args.out) if args.report else run_variant(name, args)))
        for name in names
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    page = args.out / "overhead-harnesses.md"
    kept = keep_hand_written(page.read_text() if page.exists() else "")
    page.write_text(render(runs, command.strip(), args.note) + kept)
    print(f"wrote {args.out / 'overhead-harnesses.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
