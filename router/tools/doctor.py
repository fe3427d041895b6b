"""``spec-router doctor``: what the engines say about their configuration, against the settings
known to make speculation lose under load or the router misjudge.

Reads each engine's own description (``router.health.introspect``: SGLang ``/server_info``,
vLLM ``/metrics`` and ``/v1/models``, llama.cpp ``/props`` and ``/slots``), then applies the rules
of ``router.health.checks``: the pool checks the router also runs at start-up, the engines'
settings, a calibrated table (``--table``) and a short probe (``--probe``: a few concurrent
streams on each engine alone, watching its metrics). Every finding has a level, what was seen,
why it matters, what to change and where the engine's source says so.

Exit status: 0 nothing at error level; 1 an error-level finding (an engine that cannot be
reached is one); 2 bad arguments or an unreadable table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from router.calibrate.loadgen import decode_tps, run_closed_loop
from router.decide import table as tables
from router.health import engines as engine_metrics
from router.health.checks import (
    DOCS,
    LEVELS,
    Described,
    Finding,
    Probe,
    config_findings,
    pool_findings,
    probe_findings,
    table_findings,
    worst,
)
from router.health.info import METRICS, MODELS, EngineInfo, Reply
from router.health.introspect import read_engine
from router.pools import BASELINE, SPECULATIVE, Pool

PROBE_PROMPT = 32


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spec-router doctor",
        description="Check a speculative and a baseline pool's engines for the settings known "
        "to make speculation lose under load or the router misjudge (docs/doctor.md).",
    )
    p.add_argument(
        "--speculative",
        action="append",
        required=True,
        metavar="URL",
        help="a speculative engine (repeat, or comma-separate, for several)",
    )
    p.add_argument(
        "--baseline",
        action="append",
        required=True,
        metavar="URL",
        help="a baseline engine (repeat, or comma-separate, for several)",
    )
    p.add_argument("--api-key", metavar="KEY", help="sent to every engine as a bearer token")
    p.add_argument(
        "--table",
        type=Path,
        metavar="FILE.json",
        help="a table from spec-router calibrate, checked against the engines",
    )
    p.add_argument(
        "--probe",
        action="store_true",
        help="also send a few concurrent streams to each engine alone and watch its "
        "metrics (load, acceptance, /health's time, decode speed)",
    )
    p.add_argument(
        "--probe-concurrency",
        type=int,
        default=8,
        metavar="N",
        help="streams at once per engine (default: %(default)s)",
    )
    p.add_argument(
        "--probe-tokens",
        type=int,
        default=64,
        metavar="N",
        help="output tokens per probe request (default: %(default)s)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds per request to an engine (default: %(default)s; SGLang's "
        "/health may take 20)",
    )
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    return p


def _urls(values: Sequence[str]) -> list[str]:
    out = []
    for value in values:
        for part in value.replace(" ", ",").split(","):
            if part.strip():
                out.append(part.strip().rstrip("/").removesuffix("/v1"))
    return out


class Engines:
    """An httpx client that answers ``router.health.introspect``'s GETs."""

    def __init__(self, client: httpx.AsyncClient, api_key: str | None) -> None:
        self.client = client
        self.headers = {} if api_key is None else {"authorization": f"Bearer {api_key}"}

    async def get(self, url: str, path: str) -> Reply | None:
        try:
            r = await self.client.get(url + path, headers=self.headers)
        except httpx.HTTPError:
            return None
        return Reply(r.status_code, r.content, {k.lower(): v for k, v in r.headers.items()})

    async def read(self, url: str) -> EngineInfo:
        async def get(path: str) -> Reply | None:
            return await self.get(url, path)

        return await read_engine(url, get)


def unreachable(member: Described) -> Finding:
    return Finding(
        "error",
        "unreachable",
        f"{member.info.url} ({member.pool}) did not answer /v1/models",
        "nothing can be checked, and the router cannot route to it",
        "check the URL (scheme, host, port; no /v1 path) and that the engine is up",
        DOCS,
        (member.info.url,),
    )


async def probe(engines: Engines, member: Described, concurrency: int, tokens: int) -> Probe:
    """``concurrency`` streams on one engine, its metrics watched meanwhile."""
    url = member.info.url
    began = time.monotonic()
    health = await engines.get(url, "/health")
    health_seconds = None if health is None else time.monotonic() - began
    before = await _sample(engines, url)
    peak: float | None = None
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not done.is_set():
            sample = await _sample(engines, url)
            if sample is not None:
                load = sample.running + sample.queued
                peak = load if peak is None else max(peak, load)
            try:
                await asyncio.wait_for(done.wait(), 0.05)
            except TimeoutError:
                pass

    watcher = asyncio.create_task(watch())
    try:
        results = await run_closed_loop(
            url + "/v1",
            concurrency=concurrency,
            prompt_tokens=PROBE_PROMPT,
            output_tokens=tokens,
            requests=2 * concurrency,
            model=member.info.served_model or "default",
            ignore_eos=True,
            headers=dict(engines.headers),
            stop="drain",
        )
    finally:
        done.set()
        await watcher
    after = await _sample(engines, url)
    accept = None
    if after is not None:
        accept = engine_metrics.interval_accept_length(before, after)
        if accept is None or accept <= 1.0:
            accept = engine_metrics.counted_accept_length(before, after)
    speeds = [s for r in results if (s := decode_tps(r)) is not None]
    return Probe(
        concurrency,
        peak if member.info.metrics else None,
        accept if accept is not None and accept > 1.0 else None,
        statistics.median(speeds) if speeds else None,
        health_seconds,
        sum(1 for r in results if not r.ok),
    )


async def _sample(engines: Engines, url: str) -> engine_metrics.EngineSample | None:
    reply = await engines.get(url, METRICS)
    if reply is None or reply.status != 200:
        return None
    sample = engine_metrics.parse(reply.body.decode("utf-8", "replace"))
    return None if sample.flavor == "unknown" else sample


async def examine(args: argparse.Namespace, table: tables.Table | None) -> dict[str, Any]:
    pools: list[tuple[Pool, str]] = [(SPECULATIVE, u) for u in _urls(args.speculative)]
    pools += [(BASELINE, u) for u in _urls(args.baseline)]
    timeout = httpx.Timeout(args.timeout, connect=min(5.0, args.timeout))
    async with httpx.AsyncClient(timeout=timeout) as client:
        engines = Engines(client, args.api_key)
        infos = await asyncio.gather(*(engines.read(url) for _, url in pools))
        members = [Described(pool, info) for (pool, _), info in zip(pools, infos, strict=True)]
        reached = [m for m in members if f"{MODELS}: no answer" not in m.info.notes]
        findings = [unreachable(m) for m in members if m not in reached]
        findings += pool_findings(reached)
        findings += config_findings(reached)
        if table is not None:
            findings += table_findings(table, reached)
        probes: list[tuple[Described, Probe]] = []
        if args.probe:
            for m in reached:  # one at a time: each engine alone
                probes.append(
                    (m, await probe(engines, m, args.probe_concurrency, args.probe_tokens))
                )
            findings += probe_findings(probes)
    order = {level: i for i, level in enumerate(LEVELS)}
    findings.sort(key=lambda f: order[f.level])
    return {
        "engines": [{"pool": m.pool, **_describe(m.info)} for m in members],
        "probes": [
            {"url": m.info.url, **{k: getattr(p, k) for k in p.__slots__}} for m, p in probes
        ],
        "findings": [f.as_dict() for f in findings],
        "worst": worst(findings),
    }


def _describe(info: EngineInfo) -> dict[str, Any]:
    return {k: getattr(info, k) for k in info.__slots__ if k not in ("identity", "notes")} | {
        "identity": dict(info.identity),
        "notes": list(info.notes),
    }


def summary(info: dict[str, Any]) -> str:
    """One line per engine: what it runs."""
    parts = [f"{info['flavor']}" + (f" {info['version']}" if info["version"] else "")]
    if info["served_model"]:
        parts.append(f"model {info['served_model']}")
    if info["speculative"]:
        shape = "/".join(
            str(info[k]) for k in ("spec_steps", "spec_topk", "spec_draft_tokens") if info[k]
        )
        parts.append(f"{info['spec_algorithm'] or 'speculative'}" + (f" {shape}" if shape else ""))
    elif info["speculative"] is False:
        parts.append("no speculation")
    if info["running_cap"] is not None:
        parts.append(f"cap {info['running_cap']}")
    if info["cuda_graph_max_bs"] is not None:
        parts.append(f"CUDA graphs to {info['cuda_graph_max_bs']}")
    return ", ".join(parts)


def render(doc: dict[str, Any]) -> str:
    lines = []
    for e in doc["engines"]:
        lines.append(f"{e['pool']:<11} {e['url']}: {summary(e)}")
    for p in doc["probes"]:
        speed = "n/a" if p["decode_tps"] is None else f"{p['decode_tps']:.1f} tok/s"
        accept = "n/a" if p["accept_length"] is None else f"{p['accept_length']:.2f}"
        peak = "n/a" if p["peak_load"] is None else f"{p['peak_load']:g}"
        health = "n/a" if p["health_seconds"] is None else f"{p['health_seconds']:.2f} s"
        lines.append(
            f"probe       {p['url']}: {p['concurrency']} streams, {speed} per request (wall "
            f"clock), peak load {peak}, acceptance {accept}, /health {health}"
        )
    lines.append("")
    for f in doc["findings"]:
        lines.append(f"{f['level'].upper():<8}{f['code']}: {f['message']}")
        for label in ("reason", "fix", "source"):
            if f[label]:
                lines.append(f"        {label}: {f[label]}")
    counts = {level: sum(1 for f in doc["findings"] if f["level"] == level) for level in LEVELS}
    tally = ", ".join(f"{n} {level}{'s' if n != 1 else ''}" for level, n in counts.items())
    lines.append(f"spec-router doctor: {tally}")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.probe_concurrency < 1 or args.probe_tokens < 2 or args.timeout <= 0:
        parser.error("--probe-concurrency >= 1, --probe-tokens >= 2 and --timeout > 0")
    table = None
    if args.table is not None:
        try:
            table = tables.load(args.table)
        except tables.TableError as exc:
            print(f"spec-router doctor: {exc}", file=sys.stderr)
            return 2
    doc = asyncio.run(examine(args, table))
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(render(doc))
    return 1 if doc["worst"] == "error" else 0
