"""What the router reads from the engines' metrics, against sims that export them as SGLang and
vLLM do (issue 12 items 2-4): series per DP rank, repeated per TP rank, a priority breakdown
beside the total, acceptance 0.0 before a rank's first decode window, gauges that lag.

The router runs in-process; requests go straight to the sim, the router only watches.
"""

from __future__ import annotations

import functools
import json
import socket
import statistics
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack

import pytest

from router.app import RouterApp
from router.health.poller import EngineLoad
from router.settings import Settings
from tests.support.http import await_for
from tests.support.processes import free_port, running, sim_args

pytestmark = pytest.mark.anyio


def hold(url: str, max_tokens: int, **extra: object) -> socket.socket:
    """Start a streamed request and leave it running (the answer is never read)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
            "stream": True,
            "temperature": 0,
            **extra,
        }
    ).encode()
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    return sock


def watching(url: str, **settings: object) -> RouterApp:
    return RouterApp(
        Settings(
            speculative_urls=[url],
            baseline_urls=[f"http://127.0.0.1:{free_port()}"],
            health_interval=0.05,
            **settings,  # type: ignore[arg-type]
        )
    )


def load_of(
    app: RouterApp, url: str, check: Callable[[EngineLoad], bool]
) -> Callable[[], Awaitable[EngineLoad | None]]:
    async def seen() -> EngineLoad | None:
        load = app.poller.loads.get(url) if app.poller is not None else None
        return load if load is not None and check(load) else None

    return seen


SPLIT = {
    # DP 2 x TP 2, every TP rank exporting, priority scheduling: a sum over every series
    # counts each running request 4 times (the total and its breakdown, on two TP ranks)
    "sglang": [
        "--dp-size", "2", "--tp-size", "2", "--enable-metrics-for-all-schedulers",
        "--enable-priority",
    ],
    # vLLM exports one series per DP engine (engine="0", "1") and has no priority label
    "vllm": ["--engine", "vllm", "--dp-size", "2"],
}  # fmt: skip


@pytest.fixture(params=sorted(SPLIT))
def split_sim(request: pytest.FixtureRequest) -> Iterator[str]:
    args = sim_args("eagle3", "--time-scale", "0.1", "--warmup", "0", *SPLIT[request.param])
    with running(args) as sim:
        yield sim.url


async def test_load_counts_each_request_once(split_sim: str) -> None:
    url = split_sim
    app = watching(url)
    with ExitStack() as stack:
        for priority in (1, 2, None):  # ranks 0, 1, 0 (round robin)
            stack.enter_context(hold(url, 5000, priority=priority))
        async with app.running():
            load = await await_for(load_of(app, url, lambda s: s.running >= 3))
            assert load is not None
            assert (load.running, load.queued) == (3, 0)  # (a sum of every series: 12 and 0)


def newer(load: EngineLoad, after: float) -> bool:
    return load.accept_length is not None and load.scraped_at > after


async def test_acceptance_is_not_diluted_by_a_rank_without_data(split_sim: str) -> None:
    # one stream: DP rank 1 decodes nothing and reports 0.0 (SGLang) -- a plain mean over the
    # ranks would halve rank 0's ~2.8
    url = split_sim
    app = watching(url)
    with hold(url, 5000):
        async with app.running():
            # the median of 7 scrapes: one scrape covers a few dozen drafts, whose mean varies
            # by +-0.5 around ~2.8 (a diluted reading sits near 1.4 on every scrape)
            readings: list[float] = []
            last = -1.0
            for _ in range(7):
                load = await await_for(load_of(app, url, functools.partial(newer, after=last)))
                assert load is not None and load.accept_length is not None
                readings.append(load.accept_length)
                last = load.scraped_at
            assert 2.3 < statistics.median(readings) < 3.4, readings


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
async def test_engine_load_signal_counts_what_a_lagging_gauge_does_not_show_yet(
    engine: str,
) -> None:
    # 50 ms iterations: SGLang's decode report comes 2 s after a request joined, and its
    # prefill report leaves the joining request out. spillover at 2 on the engine's load.
    args = sim_args("eagle3", "--time-scale", "0.1", "--a-ms", "500", "--engine", engine)
    base_args = sim_args("baseline", "--time-scale", "0.1", "--engine", engine)
    with running(args) as spec, running(base_args) as base, ExitStack() as stack:
        app = RouterApp(
            Settings(
                speculative_urls=[spec.url],
                baseline_urls=[base.url],
                health_interval=0.05,
                load_signal="engine",
                policy="spillover",
                crossover=2,
            )
        )
        async with app.running():
            # (usable once a probe answered; the engine's load once a scrape did too)
            await await_for(
                lambda: _true(all(app.usable_pools().values()) and spec.url in app.poller.loads)
            )
            pools = []
            for _ in range(3):
                before = app.poller.loads[spec.url].scraped_at
                decision = app.decider.decide(None)
                assert decision is not None
                pools.append(decision.pool)
                lease = app.tracker.acquire(decision.backend)
                stack.callback(lease.release)
                # the request reaches the engine, and the router scrapes it once more
                if decision.pool == "speculative":
                    stack.enter_context(hold(spec.url, 5000))
                await await_for(load_of(app, spec.url, lambda s, t=before: s.scraped_at > t))  # type: ignore[misc]
            # two on the speculative engine: the third goes to the baseline, whatever the
            # engine's gauges say yet
            assert pools == ["speculative", "speculative", "baseline"]


async def _true(value: bool) -> bool:
    return value
