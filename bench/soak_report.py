"""bench/soak.py's report: bench/results/soak.md, and whether the soak passed."""

from __future__ import annotations

import argparse
import platform
import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# What "back where it started" allows: the router keeps idle keep-alive connections and its
# allocator keeps freed memory, both bounded; a leak grows with the request count instead.
MARGINS = {"rss_kib": 16 * 1024, "fds": 8, "open_connections": 8}


def _sums(text: str, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.value:
                key = sample.labels.get(label, "")
                out[key] = out.get(key, 0.0) + sample.value
    return out


def report(result: dict[str, Any], args: argparse.Namespace, command: str) -> tuple[str, bool]:
    tally, slow, start, end = result["tally"], result["slow"], result["start"], result["end"]
    total = sum(tally.values())
    silent = tally["silent"] + slow["silent"]
    checks = {
        f"at least {args.requests} requests": total >= args.requests,
        "no silent truncation or fake [DONE]": silent == 0,
        "nothing in flight at the end": end["in_flight"] == 0,
        "no upstream connection busy at the end": end["busy_connections"] == 0,
        "engines idle at the end": not any(result["idle"].values()),
        "every engine killed and restarted": len(result["kills"]) == 4,
    }
    for key, margin in MARGINS.items():
        checks[f"{key} within {margin} of the start"] = end[key] - start[key] <= margin
    ok = all(checks.values())
    metrics = result["metrics"]
    lines = [
        "# Soak: faults, aborts and restarts, with nothing lost",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.node()} "
        f"({platform.machine()}, 2 cores shared with other work); router on core 0, four sims "
        "and the load generator on core 1. Written by:",
        "",
        f"    {command}",
        "",
        f"{total} requests by {args.clients} closed-loop clients in {result['elapsed']:.0f} s "
        f"(after {sum(result['warm'].values())} warm-up requests), half streamed, 4-48 tokens "
        "each, checked word for word against the sims' deterministic output; plus a slow "
        "reader's 60000-token streams (through a 4 KiB socket buffer, unread for 35 s, then "
        "16 KiB every 5 ms) from when every engine was back, until the load ended."
        "",
        "## Outcomes",
        "",
        "| outcome | requests | slow reader |",
        "|---|---|---|",
    ]
    for outcome in ("complete", "failed", "aborted", "silent"):
        lines.append(f"| {outcome} | {tally[outcome]} | {slow[outcome]} |")
    lines += [
        "",
        "`complete`: 200 and every word, then a clean end. `failed`: visibly -- an error status "
        "(the router's in the OpenAI shape), an error event ending the stream, or a broken "
        "connection. `aborted`: the client left on purpose (10% of requests, at a random "
        "point). `silent`: a 200 that ended short or a `[DONE]` after wrong content; must be 0.",
        "",
        "## What happened",
        "",
        *[f"- {entry}" for entry in result["log"]],
        "",
        "Router counters at the end: "
        f"retries by kind {_sums(metrics, 'spec_router_retries_total', 'kind')}, "
        f"upstream errors by kind {_sums(metrics, 'spec_router_upstream_errors_total', 'kind')}, "
        f"client disconnects {sum(_sums(metrics, 'spec_router_client_disconnects_total', 'pool').values()):.0f}, "  # noqa: E501
        f"slow-client responses {sum(_sums(metrics, 'spec_router_slow_client_responses_total', 'pool').values()):.0f}.",  # noqa: E501
        "",
        "## Footprint: after warm-up, and after the soak once idle",
        "",
        "| | start | end | change | allowed |",
        "|---|---|---|---|---|",
    ]
    for key in ("rss_kib", "fds", "open_connections", "busy_connections", "in_flight"):
        allowed = MARGINS.get(key, 0)
        change = end[key] - start[key]
        lines.append(f"| {key} | {start[key]} | {end[key]} | {change:+d} | {allowed} |")
    lines += [
        "",
        f"Engines' running + queued at the end: {result['idle']}.",
        "",
        "RSS grows with the request count until the collector's older generations run: cyclic "
        "garbage, not a leak (`bench/lab/results/soak-rss.md`, `bench/lab/soak_rss.py`).",
        "",
        "## Checks",
        "",
        *[f"- {'PASS' if passed else 'FAIL'}: {name}" for name, passed in checks.items()],
        "",
    ]
    return "\n".join(lines), ok
