"""Turn the raw runs of bench/overhead.py into medians, target checks and a Markdown report.

Pure functions over plain dicts, no I/O, so the report can be rebuilt from overhead.json:

    python bench/overhead_report.py bench/results/overhead.json > bench/results/overhead.md

"Added" numbers are medians of per-repetition differences from "direct" measured in the same
repetition; "vs nginx" numbers are medians of per-repetition ratios (or differences) against
nginx in the same repetition. Both pair runs taken seconds apart, so slow drift cancels.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from typing import Any

Run = dict[str, Any]

# The targets of issue 3 ("Performance targets").
ADDED_P50_MAX_MS = 0.3
STREAM_RPS_MIN_RATIO = 0.90
TTFC_P99_MAX_EXTRA_MS = 25.0
C64_MIN_RPS = 4000.0

METRICS = [
    "rps",
    "p50_ms",
    "p99_ms",
    "ttfc_p50_ms",
    "ttfc_p99_ms",
    "events_per_s",
    "cpu_target",
    "cpu_backend",
    "cpu_loadgen",
    "other_load",
]


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _ok(runs: list[Run], target: str, scenario: str) -> dict[int, Run]:
    return {
        r["rep"]: r
        for r in runs
        if r["target"] == target and r["scenario"] == scenario and "failed" not in r
    }


def _paired(
    mine: dict[int, Run], ref: dict[int, Run], fn: Callable[[Run, Run], float | None]
) -> float | None:
    return _median([fn(mine[rep], ref[rep]) for rep in mine if rep in ref])


def _diff(key: str) -> Callable[[Run, Run], float | None]:
    def fn(a: Run, b: Run) -> float | None:
        return None if a.get(key) is None or b.get(key) is None else a[key] - b[key]

    return fn


def _ratio(key: str) -> Callable[[Run, Run], float | None]:
    def fn(a: Run, b: Run) -> float | None:
        return a[key] / b[key] if a.get(key) and b.get(key) else None

    return fn


def _cpu_per_request_us(r: Run) -> float | None:
    cpu = r.get("cpu_target")
    return cpu / r["rps"] * 1e6 if cpu is not None and r.get("rps") else None


def summarize(runs: list[Run], targets: list[str], scenarios: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for target in targets:
        per: dict[str, Any] = {}
        for scenario in scenarios:
            mine = _ok(runs, target, scenario)
            all_runs = [r for r in runs if r["target"] == target and r["scenario"] == scenario]
            if not all_runs:
                continue
            s: dict[str, Any] = {m: _median([r.get(m) for r in mine.values()]) for m in METRICS}
            s["runs"] = len(mine)
            s["failed_runs"] = len(all_runs) - len(mine)
            s["errors"] = sum(r.get("errors", 0) for r in mine.values())
            s["not_drained"] = sum(r.get("not_drained", 0) for r in mine.values())
            s["cpu_us_per_req"] = _median([_cpu_per_request_us(r) for r in mine.values()])
            s["other_load_max"] = max(
                (r["other_load"] for r in mine.values() if r.get("other_load") is not None),
                default=None,
            )
            s["core1"] = _median(
                [
                    r["cpu_backend"] + r["cpu_loadgen"]
                    for r in mine.values()
                    if r.get("cpu_backend") is not None and r.get("cpu_loadgen") is not None
                ]
            )
            direct = _ok(runs, "direct", scenario)
            nginx = _ok(runs, "nginx", scenario)
            if target != "direct":
                s["added_p50_ms"] = _paired(mine, direct, _diff("p50_ms"))
                s["added_p99_ms"] = _paired(mine, direct, _diff("p99_ms"))
                s["added_ttfc_p50_ms"] = _paired(mine, direct, _diff("ttfc_p50_ms"))
                s["added_ttfc_p99_ms"] = _paired(mine, direct, _diff("ttfc_p99_ms"))
            s["rps_vs_direct"] = _paired(mine, direct, _ratio("rps"))
            s["rps_vs_nginx"] = _paired(mine, nginx, _ratio("rps"))
            s["ttfc_p99_vs_nginx_ms"] = _paired(mine, nginx, _diff("ttfc_p99_ms"))
            per[scenario] = s
        out[target] = {"scenarios": per, "checks": _checks(per) if target != "direct" else {}}
    return out


def _check(value: float | None, passes: Callable[[float], bool]) -> dict[str, Any] | None:
    return None if value is None else {"value": value, "pass": passes(value)}


def _checks(per: dict[str, Any]) -> dict[str, Any]:
    c1, stream, c64 = per.get("c1", {}), per.get("stream", {}), per.get("c64", {})
    return {
        "c1_added_p50_ms": _check(c1.get("added_p50_ms"), lambda v: v <= ADDED_P50_MAX_MS),
        "stream_rps_vs_nginx": _check(
            stream.get("rps_vs_nginx"), lambda v: v >= STREAM_RPS_MIN_RATIO
        ),
        "stream_ttfc_p99_vs_nginx_ms": _check(
            stream.get("ttfc_p99_vs_nginx_ms"), lambda v: v <= TTFC_P99_MAX_EXTRA_MS
        ),
        "c64_rps": _check(c64.get("rps"), lambda v: v >= C64_MIN_RPS),
    }


# --- Markdown -------------------------------------------------------------------------------


def _f(v: float | None, digits: int = 1, suffix: str = "") -> str:
    if v is None:
        return "–"
    return f"{v:,.{digits}f}{suffix}"


def _signed(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:+,.{digits}f}"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v * 100:.0f}%"


def _verdict(c: dict[str, Any] | None) -> str:
    return "not measured" if c is None else ("**PASS**" if c["pass"] else "**FAIL**")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


STACKS = {
    "direct": "no proxy: load generator → fake backend",
    "nginx": "nginx, 1 worker, `proxy_buffering off`, HTTP/1.1 keep-alive upstream "
    "(bench/nginx.conf.template)",
    "router": "`uvicorn router.app:app` (the README's command; raw ASGI + "
    "router/upstream/client.py, its own HTTP/1.1 client on asyncio + httptools), default "
    "settings, started from a calibrated table (`--table`) as operators do",
    "router_serve": "the same router under `spec-router serve` (its protocol: request "
    "deadlines and head limits)",
    "router_no_busy_poll": "the same router with busy polling off "
    "(`SPEC_ROUTER_BUSY_POLL_US=0`, router/fastpath/busypoll.py)",
    "router_spin": "the same router with busy polling that never holds, even on a shared core "
    "(`SPEC_ROUTER_BUSY_POLL_YIELD=false`)",
    "router_ref": "the router of another checkout (`--router-ref`), default settings",
    "router_ui": "the same router with its live page's feed (`/router/ui/events`) read all "
    "along, as one open browser tab would",
    "fastapi_httpx": "FastAPI + httpx, StreamingResponse: the typical pass-through",
    "fastapi_aiohttp": "FastAPI + aiohttp, StreamingResponse",
    "starlette_aiohttp": "Starlette routing + StreamingResponse + aiohttp",
    "asgi_httpx": "raw ASGI handler + httpx",
    "asgi_aiohttp": "raw ASGI handler + aiohttp",
    "tcp_pipe": "a TCP pipe on uvloop, no HTTP at all (bench/candidates/tcp_pipe.py): the floor "
    "of any proxy written in Python",
}


# How the router gets its numbers; the measurements behind each point are in the commit log
# (git log -- router/serving.py router/upstream.py router/proxy.py, before the move to
# router/forward/ and router/fastpath/) and bench/profile_router.py.
HOT_PATH = [
    "- A raw ASGI handler and its own HTTP/1.1 client on asyncio + httptools "
    "(router/upstream/client.py): no framework routing, no `StreamingResponse`, no httpx "
    "(see above).",
    "- Under uvicorn's httptools server (the default), `router.fastpath.uvicorn.DirectSend`: the "
    "response start goes out with the body bytes that came with the upstream's headers in one "
    "write, and the last body bytes with the end of the response; each later read of a chunked "
    "body is framed and written to the client from the upstream socket's own callback, with no "
    "task switch, future or ASGI `send` per chunk, for as long as uvicorn's `send` would not "
    "have to wait. A client that falls behind sends the stream back to the plain ASGI path "
    "with its back-pressure (counted in `spec_router_slow_client_*` once 256 KiB wait for it, "
    "as on any server). Client disconnects come "
    "from uvicorn's own per-request event instead of a watcher task per request. Any other "
    "server (or `spec-router serve --http h11`) gets the plain ASGI path.",
    "- System calls per stream are at the minimum, as for nginx: strace over 256 streams of 20 "
    "chunks counts ~20 reads (one per upstream chunk) and ~20 writes (one per client chunk) per "
    "stream. perf over the streaming run puts ~45% of the router's CPU in the kernel (mostly "
    "those reads and writes, and waking the reader on the other core), ~43% in the Python "
    "interpreter, ~7% in uvloop and ~2% in httptools.",
    "- The garbage collector: start-up objects are frozen and young collections wait for "
    "50,000 objects (router/app.py), because with CPython's default of 700 the collector ran "
    "~170 times in 8 s of 256 streams, 1-7 ms each, and found nothing to free.",
    "- Busy polling (router/fastpath/busypoll.py, `SPEC_ROUTER_BUSY_POLL_US`, default 50 µs): "
    "after "
    "activity the event loop keeps polling for the window before it may sleep. At c=1 "
    "`strace -c -f -p <router pid>` over 4 s (busy polling off) counted 5,617 reads, 5,617 "
    "writes and 5,670 `epoll_pwait`: the minimum, 2 of each per request, so the rest of the "
    "gap to nginx was the core going idle twice per request and waking on cold caches: ~0.1 ms "
    "on this VM. `router_no_busy_poll` is the same router with it off, measured in the same "
    "run; under load the loop is awake anyway, and the two differ by less than this VM's "
    "run-to-run noise (in an earlier 5-rep run busy polling was ahead on both).",
    "- Before the first two points (same method, same machine, same session): streaming p99 "
    "TTFC nginx +35 to +60 ms at 0.91-0.98 of the core (0.7-0.8 ms of CPU per stream); "
    "non-streaming c=64 4,900 req/s.",
]


def render_markdown(report: dict[str, Any]) -> str:
    summary: dict[str, Any] = report["summary"]
    m, cfg = report["machine"], report["config"]
    targets = list(summary)

    def sc(target: str, scenario: str) -> dict[str, Any]:
        s: dict[str, Any] = summary.get(target, {}).get("scenarios", {}).get(scenario, {})
        return s

    out = [
        "# Router overhead",
        "",
        "Generated by `bench/overhead.py` (run it with `make bench`). Every number below "
        "comes from one run on one machine, against one fake backend; medians over "
        f"{cfg['reps']} repetitions of {cfg['duration_s']:g} s (after {cfg['warmup_s']:g} s "
        "warm-up), repetitions interleaved across stacks.",
        "",
        f"- Command: `{report['command']}`",
        f"- Machine: {m['nproc']} CPUs, {m['cpu_model']}, Linux {m['kernel']}, "
        f"Python {m['python']}, {m['nginx']}, {m['wrk']}",
        f"- Commit: `{m['commit']}`"
        + (" (router/ had uncommitted changes)" if m.get("router_changes_uncommitted") else "")
        + f", {m['date']}",
        f"- Pinning: the proxy under test on CPU {cfg['proxy_core']}; the fake backend "
        "(bench/fake_backend.py) and the load generator "
        + (
            "unpinned (free to share the proxy's CPU)."
            if cfg.get("unpinned")
            else f"on CPU {cfg['load_core']}."
        ),
        f"- Streams: {cfg['chunks']} SSE chunks {cfg['interval_ms']:g} ms apart ("
        + (
            f"the headers alone, the first chunk {cfg['first_delay_ms']:g} ms later"
            if cfg.get("first_delay_ms")
            else "the first sent with the headers"
        )
        + "), then `data: [DONE]`; streaming load generator: "
        + (
            ("bench/loadgen_aiohttp.py" if lg.startswith("aiohttp") else "bench/loadgen_raw.py")
            + (", a new connection per request" if "new" in lg else "")
            if (lg := str(cfg.get("loadgen", "raw")))
            else ""
        )
        + ".",
        "- Routers: "
        + (
            f"started from the calibrated table `{cfg['table']}` (a copy)"
            if cfg.get("table")
            else "started with no table (no curves yet)"
        )
        + (
            "; settings " + ", ".join(f"`{k}={v}`" for k, v in cfg["router_env"].items())
            if cfg.get("router_env")
            else "; default settings"
        )
        + ".",
        "",
        "How another harness's choices (an aiohttp load generator, headers before the first "
        "chunk, no client keep-alive, no pinning) move the streaming tail, and why: "
        "[overhead-harnesses.md](overhead-harnesses.md) (bench/harnesses.py).",
        "",
        "## Targets (issue 3)",
        "",
    ]
    checks: list[tuple[str, str, Callable[[float], str]]] = [
        (
            "c1_added_p50_ms",
            f"non-streaming, c=1: p50 added over direct ≤ {ADDED_P50_MAX_MS} ms",
            lambda v: f"{v:+.3f} ms",
        ),
        (
            "stream_rps_vs_nginx",
            f"streaming, c={cfg['stream_concurrency']}: "
            f"req/s ≥ {STREAM_RPS_MIN_RATIO:.0%} of nginx",
            lambda v: f"{v:.0%} of nginx",
        ),
        (
            "stream_ttfc_p99_vs_nginx_ms",
            f"streaming, c={cfg['stream_concurrency']}: "
            f"p99 TTFC ≤ nginx + {TTFC_P99_MAX_EXTRA_MS:g} ms",
            lambda v: f"nginx {v:+.1f} ms",
        ),
        (
            "c64_rps",
            f"non-streaming, c={cfg['c64_connections']}: ≥ {C64_MIN_RPS:,.0f} req/s",
            lambda v: f"{v:,.0f} req/s",
        ),
    ]
    router = summary.get("router", {}).get("checks")
    if router:
        rows = []
        for key, label, show in checks:
            c = router.get(key)
            rows.append([label, "–" if c is None else show(c["value"]), _verdict(c)])
        out += _table(["target", "router", "verdict"], rows)
    else:
        note = report.get("notes", {}).get("router", "not in this run")
        out += [f"The router was not measured: {note.splitlines()[0] if note else ''}"]
    proxies = [t for t in targets if t not in ("direct", "router")]
    if proxies:
        out += ["", "The same targets applied to the other stacks, for orientation:", ""]
        rows = []
        for t in proxies:
            cs = summary[t]["checks"]
            rows.append([t] + [_verdict(cs.get(key)).replace("**", "") for key, _, _ in checks])
        out += _table(
            ["stack", "c=1 p50 added", "stream req/s", "stream p99 TTFC", "c=64 req/s"], rows
        )

    out += ["", "## (a) Non-streaming, concurrency 1 (bench/loadgen_raw.py)", ""]
    rows = []
    for t in targets:
        s = sc(t, "c1")
        if s:
            rows.append(
                [
                    t,
                    _f(s["p50_ms"], 3),
                    _f(s["p99_ms"], 3),
                    _signed(s.get("added_p50_ms"), 3),
                    _signed(s.get("added_p99_ms"), 3),
                    _f(s["rps"], 0),
                    _f(s["cpu_target"], 2),
                    _f(s["cpu_us_per_req"], 0),
                    str(s["errors"]),
                ]
            )
    out += _table(
        [
            "stack",
            "p50 ms",
            "p99 ms",
            "p50 added ms",
            "p99 added ms",
            "req/s",
            "CPU cores",
            "CPU µs/req",
            "errors",
        ],
        rows,
    )

    out += [
        "",
        f"## (b) Streaming, {cfg['stream_concurrency']} concurrent streams (bench/loadgen_raw.py)",
        "",
        "TTFC: time from writing the request to the first body byte. Chunks/s counts SSE events "
        "(including `[DONE]`) delivered to the client.",
        "",
    ]
    rows = []
    for t in targets:
        s = sc(t, "stream")
        if s:
            per_stream = None if s["cpu_us_per_req"] is None else s["cpu_us_per_req"] / 1e3
            rows.append(
                [
                    t,
                    _f(s["rps"], 0),
                    _pct(s["rps_vs_nginx"]),
                    _f(s["events_per_s"], 0),
                    _f(s["ttfc_p50_ms"], 2),
                    _f(s["ttfc_p99_ms"], 2),
                    _signed(s.get("added_ttfc_p50_ms")),
                    _signed(s.get("added_ttfc_p99_ms")),
                    _f(s["cpu_target"], 2),
                    _f(per_stream, 2),
                    str(s["errors"] + s["not_drained"]),
                ]
            )
    out += _table(
        [
            "stack",
            "req/s",
            "vs nginx",
            "chunks/s",
            "TTFC p50 ms",
            "TTFC p99 ms",
            "p50 added ms",
            "p99 added ms",
            "CPU cores",
            "CPU ms/stream",
            "errors",
        ],
        rows,
    )

    out += ["", f"## (c) Non-streaming, concurrency {cfg['c64_connections']} (wrk)", ""]
    rows = []
    for t in targets:
        s = sc(t, "c64")
        if s:
            rows.append(
                [
                    t,
                    _f(s["rps"], 0),
                    _pct(s["rps_vs_nginx"]),
                    _f(s["p50_ms"], 2),
                    _f(s["p99_ms"], 2),
                    _f(s["cpu_target"], 2),
                    _f(s["cpu_us_per_req"], 0),
                    str(s["errors"]),
                ]
            )
    out += _table(
        ["stack", "req/s", "vs nginx", "p50 ms", "p99 ms", "CPU cores", "CPU µs/req", "errors"],
        rows,
    )

    out += ["", "## What the numbers say", ""] + _findings(summary)
    out += ["", "## The router's hot path", ""] + HOT_PATH
    out += [
        "",
        "## Is the load generator the bottleneck?",
        "",
        f"CPU {cfg['load_core']} runs the fake backend and the load generator. Its use (cores, "
        'median) per scenario, and direct req/s against the best proxy\'s. "Other" is the most CPU '
        "that processes outside the benchmark used on the two cores during the measured "
        "window of any repetition (the machine may be shared); a run with more than "
        f"{cfg.get('max_other_load', 0.1):.2f} cores of it was repeated up to "
        f"{cfg.get('retries', 0)} times and the least disturbed attempt kept.",
        "",
    ]
    rows = []
    scen = ("c1", "stream", "c64")
    for t in targets:
        rows.append(
            [t]
            + [_f(sc(t, s).get("core1"), 2) for s in scen]
            + [_f(sc(t, s).get("other_load_max"), 2) for s in scen]
        )
    out += _table(
        ["stack", "CPU 1, c=1", "streaming", "c=64", "other (max), c=1", "streaming", "c=64"], rows
    )
    out += [""] + _headroom(summary, cfg)

    out += ["", "## Stacks", ""]
    out += [f"- **{t}**: {STACKS.get(t, t)}" for t in targets]
    out += [
        "",
        "Every Python stack runs under uvicorn with uvloop and httptools, one worker, access "
        "log off, pinned like nginx. The candidates are in bench/candidates/; the httpx ones "
        "raise httpx's default 100-connection limit so 256 streams are not queued behind it.",
    ]
    if report.get("router_headers"):
        hdrs = ", ".join(f"`{k}: {v}`" for k, v in report["router_headers"].items())
        out += ["", f"Router response headers seen in the smoke test: {hdrs}."]
    notes = report.get("notes") or {}
    if notes:
        out += ["", "## Notes", ""]
        for name, note in notes.items():
            first = note.splitlines()[0] if note else ""
            out += [f"- **{name}**: {first}"]
    return "\n".join(out) + "\n"


def _get(summary: dict[str, Any], target: str, scenario: str, key: str) -> float | None:
    v: float | None = summary.get(target, {}).get("scenarios", {}).get(scenario, {}).get(key)
    return v


def _findings(summary: dict[str, Any]) -> list[str]:
    lines: list[str] = []

    def compare(a: str, b: str, what: str) -> None:
        if a not in summary or b not in summary:
            return
        ua, ub = (
            _get(summary, a, "c64", "cpu_us_per_req"),
            _get(summary, b, "c64", "cpu_us_per_req"),
        )
        ra, rb = _get(summary, a, "stream", "rps"), _get(summary, b, "stream", "rps")
        ta, tb = (
            _get(summary, a, "stream", "ttfc_p99_ms"),
            _get(summary, b, "stream", "ttfc_p99_ms"),
        )
        parts = []
        if ua and ub:
            parts.append(
                f"CPU per non-streaming request {ua:,.0f} µs vs {ub:,.0f} µs (×{ua / ub:.1f})"
            )
        if ra and rb:
            parts.append(f"streaming {ra:,.0f} vs {rb:,.0f} req/s")
        if ta and tb:
            parts.append(f"p99 TTFC {ta:,.0f} vs {tb:,.0f} ms")
        if parts:
            lines.append(f"- {what} (`{a}` vs `{b}`): " + "; ".join(parts) + ".")

    compare("asgi_httpx", "asgi_aiohttp", "Upstream client, httpx against aiohttp, same handler")
    compare("starlette_aiohttp", "asgi_aiohttp", "Starlette's Request + StreamingResponse")
    compare("fastapi_aiohttp", "starlette_aiohttp", "FastAPI's layer on top of Starlette")
    compare(
        "fastapi_httpx", "router", "The typical FastAPI + httpx pass-through against the router"
    )
    compare("asgi_aiohttp", "router", "The best off-the-shelf Python stack against the router")
    compare("router", "nginx", "The router against nginx")
    httpx = _get(summary, "asgi_httpx", "c64", "cpu_us_per_req")
    aiohttp = _get(summary, "asgi_aiohttp", "c64", "cpu_us_per_req")
    if httpx and aiohttp:
        lines += [
            "",
            f"Why the router's hot path does not use httpx: under the same raw ASGI handler, "
            f"httpx costs ×{httpx / aiohttp:.0f} the CPU per request of aiohttp (whose response "
            "parser is in C) and collapses under 256 concurrent streams (see the table above). "
            "The router forwards with its own small HTTP/1.1 client on asyncio and httptools' "
            "C parser (router/upstream/client.py), the parser uvicorn already brings, rather than "
            "add "
            "aiohttp as a second client library; httpx remains only in the tools around it "
            "(demo, calibration, load generator), where nothing is hot.",
        ]
    return lines or ["- (too few stacks measured to compare)"]


def _headroom(summary: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    lines = []
    for scenario, label in (("c1", "c=1"), ("stream", "streaming"), ("c64", "c=64")):
        direct = _get(summary, "direct", scenario, "rps")
        proxies = {
            t: _get(summary, t, scenario, "rps") for t in summary if t not in ("direct", "nginx")
        }
        best = max(((v, t) for t, v in proxies.items() if v), default=None)
        if direct and best:
            lines.append(
                f"- {label}: direct {direct:,.0f} req/s; best Python proxy ({best[1]}) "
                f"{best[0]:,.0f} req/s, {best[0] / direct:.0%} of direct."
            )
    length_s = (cfg["chunks"] - 1) * cfg["interval_ms"] / 1e3
    if length_s > 0:
        bound = cfg["stream_concurrency"] / length_s
        lines.append(
            f"- Streaming throughput is bounded by the stream length, not by CPU: "
            f"{cfg['stream_concurrency']} streams of {length_s * 1e3:.0f} ms give at most "
            f"{bound:,.0f} req/s; direct shows how close the load generator gets."
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: overhead_report.py bench/results/overhead.json", file=sys.stderr)
        return 2
    with open(args[0]) as f:
        report = json.load(f)
    sys.stdout.write(render_markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
