"""Driving the pools: each level's closed loop, the engines' own counters, the progress bar.

The pools are driven directly (no router in between) and one at a time, since they may share
GPUs. ``sweep`` runs every level of the speculative pool, then of the baseline pool (or, with
``Plan.interleave``, each level on one pool and then the other), turns each into a ``Point``
with ``router.calibrate.levels`` and stops with ``CalibrationError`` at the first level that
cannot be trusted.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from router.calibrate import probes
from router.calibrate.levels import (
    CANCELLED,
    CalibrationError,
    LevelRun,
    disturbance,
    out_of_line,
    point_from_run,
    refusal,
    requests_per_level,
)
from router.calibrate.loadgen import FAST_TIMEOUTS, Client, FastClient, RequestResult, send_one
from router.calibrate.progress import Progress
from router.calibrate.workload import RequestSource
from router.decide.table import Point, Prefill
from router.health import engines as engine_metrics

POOLS = ("speculative", "baseline")


@dataclass(frozen=True)
class Plan:
    """How to sweep: the value object ``router.calibrate.cli`` builds from its arguments."""

    urls: dict[str, str]  # pool -> base URL (no /v1)
    levels: tuple[int, ...]
    output_tokens: float  # mean requested output, for the default requests per level
    requests_per_level: int | None = None
    min_samples: int = 8
    retries: int = 2
    time_scale: float = 1.0
    level_timeout: float = 1800.0
    api_key: str | None = None
    discover_model: bool = True
    interleave: bool = False  # level by level, the pools in turn, instead of pool after pool
    probes: bool = True  # prefill and sampling probes after the sweep (router.calibrate.probes)


@dataclass
class Sweep:
    """What a sweep measured, in model units."""

    points: dict[str, list[Point]] = field(default_factory=lambda: {p: [] for p in POOLS})
    tau: float = 1.0
    tau_source: str = "not measured"
    counts: list[int] = field(default_factory=list)  # measured requests asked for, per level
    disturbed: list[str] = field(default_factory=list)  # levels kept though they failed a check
    prefill: dict[str, Prefill] = field(default_factory=dict)  # per pool, from the probes
    tau_sampling: float | None = None  # speculative acceptance at temperature 1, from a probe
    caps: dict[str, int | None] = field(default_factory=dict)  # per pool, as the engine says


# -- driving one pool -----------------------------------------------------------------------------


async def run_level(
    client: httpx.AsyncClient,
    streams: Client,
    url: str,
    source: RequestSource,
    pool: str,
    concurrency: int,
    wanted: int,
    *,
    timeout: float,
    headers: dict[str, str],
    progress: Progress,
    load_interval: float = 0.1,
) -> LevelRun:
    """One closed-loop level: warm-up request per worker, ``wanted`` measured ones, fillers.
    The streams go through ``streams`` (the load generator's own client: httpx would take most
    of a core at a few thousand events a second, bench/results/loadgen-client.md); the
    engine's metrics through ``client``."""
    run = LevelRun(pool, concurrency, wanted)
    handed_out = done = 0
    finished = asyncio.Event()
    warm: list[float] = []

    async def send(worker: int, seq: int, share: float) -> None:
        nonlocal handed_out, done
        path, body = source.next(share)
        result = RequestResult(worker, seq, time.monotonic(), body["max_tokens"])
        run.results.append(result)
        measured = seq > 0 and handed_out < wanted
        if measured:
            handed_out += 1
            run.measured.append(result)
        await send_one(streams, url + path, body, result, headers=headers)
        if not result.ok and result.error != CANCELLED:
            finished.set()  # an error ends the level at once: the sweep is refused anyway
        if measured:
            done += 1
            progress.update(done)
            if done >= wanted:
                finished.set()

    async def worker(i: int) -> None:
        await send(i, 0, (i + 1) / concurrency)
        warm.append(time.monotonic())
        if len(warm) == concurrency:
            run.warm_at = warm[-1]
        seq = 1
        # (once the level is over, by an error or enough requests, no worker sends another:
        # a refused connection fails at once, and the worker would race the cancellation)
        while not finished.is_set():
            await send(i, seq, 1.0)
            seq += 1

    async def sample_load() -> None:
        while True:
            sample = await scrape(client, url)
            if sample is None or sample.flavor == "unknown":
                return
            run.engine_load.append((time.monotonic(), sample.running + sample.queued))
            await asyncio.sleep(load_interval)

    async def tick() -> None:  # keep the clock moving while long requests run
        while True:
            await asyncio.sleep(1.0)
            progress.update(done, force=True)

    began = time.monotonic()
    tasks = [asyncio.create_task(worker(i)) for i in range(concurrency)]
    tasks.append(asyncio.create_task(sample_load()))
    if progress.tty:
        tasks.append(asyncio.create_task(tick()))
    try:
        await asyncio.wait_for(finished.wait(), timeout)
    except TimeoutError:
        run.timed_out = True
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    run.seconds = time.monotonic() - began
    return run


async def wait_idle(
    client: httpx.AsyncClient, url: str, timeout: float = 10.0, stale: float = 2.0
) -> None:
    """Best effort: wait until the engine reports nothing running or queued (the cancelled
    fillers of the last level), so that a level does not start on a busy engine.

    Gives up after ``timeout``, or once the count has not changed for ``stale`` seconds: some
    engines only refresh these gauges while they decode, so an idle one may go on reporting
    its last batch.
    """
    began = time.monotonic()
    last: float | None = None
    since = began
    while (now := time.monotonic()) - began < timeout:
        sample = await scrape(client, url)
        if sample is None or sample.flavor == "unknown":
            return
        load = sample.running + sample.queued
        if load <= 0:
            return
        if load != last:
            last, since = load, now
        elif now - since >= stale:
            return
        await asyncio.sleep(0.05)


async def scrape(client: httpx.AsyncClient, url: str) -> engine_metrics.EngineSample | None:
    try:
        resp = await client.get(f"{url}/metrics", timeout=10)
    except httpx.HTTPError:
        return None
    return engine_metrics.parse(resp.text) if resp.status_code == 200 else None


async def acceptance(
    client: httpx.AsyncClient,
    url: str,
    before: engine_metrics.EngineSample | None,
    after: engine_metrics.EngineSample | None,
    headers: dict[str, str] | None = None,
) -> tuple[float, str]:
    """The speculative engine's acceptance length over the sweep, and where it came from:
    its counters' deltas over the sweep where it has them; else SGLang's
    ``avg_spec_accept_length`` (a lifetime mean, warm-up included, per DP rank, behind the
    API key: ``headers``); else its last 40-step gauge."""
    if after is not None and before is not None and after.accept_length is None:
        # vLLM's and llama.cpp's counters
        interval = engine_metrics.interval_accept_length(before, after)
        if interval is not None and interval >= 1.0:
            return interval, f"{after.flavor} spec_decode counters over the sweep"
    counted = engine_metrics.counted_accept_length(before, after) if after is not None else None
    if after is not None and after.flavor == "sglang" and counted is not None and counted >= 1.0:
        # (counted as requests end; 0.5.23 and later)
        return counted, "sglang generation_tokens / spec_verify_calls over the sweep"
    for path in ("/server_info", "/get_server_info"):
        try:
            resp = await client.get(url + path, headers=headers, timeout=10)
            info: Any = resp.json() if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            info = None
        if isinstance(info, dict):
            states = [x for x in info.get("internal_states") or [] if isinstance(x, dict)]
            ranks = [x["avg_spec_accept_length"] for x in states if "avg_spec_accept_length" in x]
            value = info.get("avg_spec_accept_length") or (
                sum(ranks) / len(ranks) if ranks else None  # one per DP rank
            )
            if isinstance(value, int | float) and value >= 1.0:
                return float(value), f"avg_spec_accept_length from {path}"
    if after is not None and after.accept_length is not None and after.accept_length >= 1.0:
        return after.accept_length, "sglang:spec_accept_length from /metrics"
    return 1.0, "the engine reports no acceptance length"


async def discover_cap(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> int | None:
    """The most requests the engine runs at once, where it says: SGLang's
    ``max_running_requests`` in ``/get_server_info`` (also per DP rank in its internal states),
    llama.cpp's ``total_slots`` in ``/props``. vLLM does not publish its ``max_num_seqs``."""
    for path, key in (
        ("/get_server_info", "max_running_requests"),
        ("/server_info", "max_running_requests"),
        ("/props", "total_slots"),
    ):
        try:
            resp = await client.get(url + path, headers=headers, timeout=10)
            info: Any = resp.json() if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            continue
        if not isinstance(info, dict):
            continue
        value = info.get(key)
        if value is None:
            states = [x for x in info.get("internal_states") or [] if isinstance(x, dict)]
            ranks = [x[key] for x in states if isinstance(x.get(key), int)]
            value = sum(ranks) if ranks else None
        if type(value) is int and value >= 1:
            return value
    return None


async def discover_model(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> str:
    """The first model the pool serves (``/v1/models``); vLLM refuses any other name."""
    try:
        resp = await client.get(f"{url}/v1/models", headers=headers, timeout=30)
        return str(resp.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return "default"


@dataclass
class _Pool:
    """One pool's half of a sweep: where it is and how to talk to it."""

    name: str
    url: str
    source: RequestSource
    client: httpx.AsyncClient
    streams: Client
    headers: dict[str, str]


async def measure(
    plan: Plan, pool: _Pool, n: int, progress: Progress, again: bool = False
) -> tuple[Point, bool]:
    """One level, measured again while the engine's own load says it did not run as driven
    (up to ``plan.retries`` times): the point, and whether the last attempt ran as driven.
    Raises ``CalibrationError`` if the level must not be used at all."""
    wanted = requests_per_level(n, plan.output_tokens, plan.requests_per_level)
    for attempt in range(plan.retries + 1):
        await wait_idle(pool.client, pool.url)
        progress.start(pool.name, n, wanted, attempt + again)
        run = await run_level(
            pool.client,
            pool.streams,
            pool.url,
            pool.source,
            pool.name,
            n,
            wanted,
            timeout=plan.level_timeout,
            headers=pool.headers,
            progress=progress,
        )
        point = point_from_run(run, plan.time_scale)
        why = refusal(run, point, plan.min_samples)
        if why is not None:
            progress.say(f"{progress.label} stopped")
            raise CalibrationError(why)
        progress.finish(point, run.seconds, run.mean_engine_load())
        upset = disturbance(run)
        if upset is None:
            return point, True
        then = "measuring again" if attempt < plan.retries else "keeping it"
        progress.say(f"  {pool.name} c={n}: {upset}; {then}")
    return point, False


async def sweep(plan: Plan, sources: dict[str, RequestSource], progress: Progress) -> Sweep:
    """Both pools, one after the other (or level by level in turn); raises ``CalibrationError``
    at the first bad level.

    Two checks catch a level that did not run as it should. During the level: the engine's
    own count of running and queued requests must match the concurrency driven (else other
    traffic shares the pool, or this machine is too busy to keep the load up); such a level
    is measured again, up to ``plan.retries`` times. After the pool's sweep: per-request decode
    speed must not rise with concurrency (a batching engine only slows down as its batch
    grows), so two neighbouring levels where it does are both measured once more, which
    catches an engine that was slowed down or sped up for a moment. What still fails a check
    is kept and named in the table's notes.
    """
    headers = {"authorization": f"Bearer {plan.api_key}"} if plan.api_key else {}
    top = max(plan.levels)
    result = Sweep()
    limits = httpx.Limits(max_connections=top + 8, max_keepalive_connections=top + 8)
    timeout = httpx.Timeout(connect=30.0, read=None, write=60.0, pool=None)
    async with (
        httpx.AsyncClient(limits=limits, timeout=timeout) as client,
        FastClient(top + 8, replace(FAST_TIMEOUTS, connect=30.0)) as streams,
    ):
        pools = {
            name: _Pool(name, plan.urls[name], sources[name], client, streams, headers)
            for name in POOLS
        }
        if plan.discover_model:
            for pool in pools.values():
                pool.source.model = await discover_model(client, pool.url, headers)
        for name, pool in pools.items():
            result.caps[name] = await discover_cap(client, pool.url, headers)
        before = await scrape(client, pools["speculative"].url)
        points: dict[str, dict[int, Point]] = {name: {} for name in POOLS}
        calm: dict[str, dict[int, bool]] = {name: {} for name in POOLS}

        async def level(name: str, n: int) -> None:
            points[name][n], calm[name][n] = await measure(plan, pools[name], n, progress)
            result.counts.append(requests_per_level(n, plan.output_tokens, plan.requests_per_level))

        async def check_shape(name: str) -> None:
            odd = out_of_line(list(points[name].values()))
            if odd and plan.retries > 0:
                around = ", ".join(map(str, odd))
                progress.say(f"  {name}: decode speed rose with concurrency at {around}; again")
                for n in odd:
                    points[name][n], calm[name][n] = await measure(
                        plan, pools[name], n, progress, again=True
                    )

        if plan.interleave:
            for n in plan.levels:
                for name in POOLS:
                    await level(name, n)
            for name in POOLS:
                await check_shape(name)
        else:
            for name in POOLS:
                for n in plan.levels:
                    await level(name, n)
                await check_shape(name)
        for name in POOLS:
            doubtful = {n for n, ok in calm[name].items() if not ok}
            doubtful.update(out_of_line(list(points[name].values())))
            result.points[name] = [points[name][n] for n in plan.levels]
            result.disturbed += [f"{name} at {n}" for n in sorted(doubtful)]
        after = await scrape(client, pools["speculative"].url)
        result.tau, result.tau_source = await acceptance(
            client, pools["speculative"].url, before, after, headers
        )
        if plan.probes:
            await probe(plan, pools, result, progress)
    return result


async def probe(plan: Plan, pools: dict[str, _Pool], result: Sweep, progress: Progress) -> None:
    """Prefill lines for both pools and the speculative acceptance when sampling
    (``router.calibrate.probes``), into ``result``."""
    for name, pool in pools.items():
        first = next((p for p in result.points[name] if p.concurrency == 1), None)
        if first is None or pool.source.dataset:
            continue  # needs the level at 1 and a synthetic workload to vary
        ptau = result.tau if name == "speculative" else 1.0
        spi1 = probes.iteration_at_one(first, ptau)
        prompt = pool.source.prompt_tokens
        samples = [(float(prompt), first.ttft_p50 - spi1)]
        for tokens in (probes.SHORT_PROMPT, probes.long_prompt(prompt)):
            point = await _probe_point(plan, pool, progress, prompt_tokens=tokens)
            samples.append((float(tokens), point.ttft_p50 - spi1))
        line = probes.prefill_line(samples)
        if line is not None:
            result.prefill[name] = line
            progress.say(
                f"  {name}: prefill {line.base * 1000:.0f} ms + "
                f"{line.per_token * 1e6:.0f} us per prompt token"
            )
        if name == "speculative" and pool.source.temperature == 0:
            hot = await _probe_point(plan, pool, progress, temperature=1.0)
            if hot.decode_tps_p50 > 0 and first.decode_tps_p50 > 0:
                result.tau_sampling = max(
                    1.0, result.tau * hot.decode_tps_p50 / first.decode_tps_p50
                )
                progress.say(
                    f"  speculative: acceptance length {result.tau_sampling:.2f} at temperature 1"
                )


async def _probe_point(
    plan: Plan,
    pool: _Pool,
    progress: Progress,
    prompt_tokens: int | None = None,
    temperature: float | None = None,
) -> Point:
    """A few requests at concurrency 1 with one thing changed from the sweep's."""
    source = pool.source.variant(prompt_tokens=prompt_tokens, temperature=temperature)
    await wait_idle(pool.client, pool.url)
    run = await run_level(
        pool.client,
        pool.streams,
        pool.url,
        source,
        pool.name,
        1,
        probes.PROBE_REQUESTS,
        timeout=plan.level_timeout,
        headers=pool.headers,
        progress=progress,
    )
    return point_from_run(run, plan.time_scale)
