"""CPU per routing decision: ``Decider.decide`` in-process, no sockets, each decision timed.

The router is built as ``spec-router serve`` builds it (default settings but the policy, the
pools and the table), its backends marked healthy. One decision includes reading the request's
fields (``slo``) and taking and releasing the lease, as the proxy does for every request.

With ``--table FILE`` the router starts from that table, as the README tells operators: the
``slo`` policy then has curves and decides over its surface (``router.decide.capacity``). The
surface is computed on the keeper's timer (``Decider.refresh``), which this loop calls every
``--refresh-every`` decisions outside the timed calls; its cost is printed apart.

For every pair of ``--backends`` (per pool) and ``--in-flight`` (streamed requests held on
every backend), prints the median and the 99th percentile of ``--number`` decisions (after a
warm-up), the worst of ``--repeat`` runs' p99, on the wall clock and in the thread's CPU time.

By default the decisions follow one another at once, so the router sees tens of thousands of
requests a second and the ``slo`` policy decides nearly all of them in its overflow step. With
``--pace RATE`` the router's clock is a virtual one that moves ``1 / RATE`` seconds between two
decisions (requests arriving at ``RATE`` a second, as under a load test), so the policy sees
the rates and the prefills ahead of such traffic and decides in the steps it would there; the
decisions are still timed on the wall clock.

    python bench/decision_cost.py
    python bench/decision_cost.py --policies slo --table bench/results/calibration-traffic.json \
        --backends 1,16,64 --in-flight 0,16,64,256
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

from router.account.outcome import Outcome
from router.app import RouterApp
from router.decide.predict import Request
from router.forward.request import inspect
from router.lifecycle import tune_gc
from router.settings import Settings

BODY = json.dumps(
    {
        "model": "m",
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 16,
        "stream": True,
    }
).encode()
WARMUP = 2000


def urls(pool: int, n: int) -> list[str]:
    return [f"http://127.0.{pool}.{i + 1}:8000" for i in range(n)]


class Paced:
    """A clock that moves only when told: ``step`` seconds at each ``tick``."""

    def __init__(self, start: float, step: float) -> None:
        self.now = start
        self.step = step

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        self.now += self.step


def healthy_app(
    policy: str, per_pool: int, table: str | None = None, clock: Paced | None = None
) -> RouterApp:
    """A ``RouterApp`` as ``spec-router serve`` builds it, ``per_pool`` backends in each pool,
    all healthy and past their ramp (no poller runs)."""
    settings = Settings(
        speculative_urls=urls(1, per_pool),
        baseline_urls=urls(2, per_pool),
        policy=policy,
        table_path=table,
        max_backends=max(64, 2 * per_pool),
    )
    app = RouterApp(settings) if clock is None else RouterApp(settings, clock=clock)
    # healthy since long enough ago that their ramp back in (SPEC_ROUTER_RAMP_SECONDS) is over:
    # the steady state, where every backend counts at full weight
    since = app.clock() - settings.ramp_seconds - 1.0
    for url in [*settings.speculative_urls, *settings.baseline_urls]:
        for _ in range(settings.rise + 1):
            app.health.probe(url, True, since)
    tune_gc()  # as the server's lifespan does
    return app


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def cost(
    policy: str,
    per_pool: int,
    number: int,
    repeat: int,
    table: str | None,
    in_flight: int,
    refresh_every: int,
    pace: float = 0.0,
) -> tuple[float, float, float, float]:
    """A decision's median and worst p99 over the repeats (wall clock), its worst p99 of the
    thread's CPU time (what the decision costs, without the waits for a core of a shared
    machine), and the longest refresh, in us."""
    paced = Paced(time.monotonic(), 1.0 / pace) if pace > 0 else None
    app = healthy_app(policy, per_pool, table, paced)
    decider, tracker = app.decider, app.tracker
    tick = paced.tick if paced is not None else None
    info = inspect("/v1/chat/completions", BODY, b"application/json")
    now = app.clock()
    held = []
    for url in list(tracker.pool_of):  # streamed requests in flight, some decoding a while
        for i in range(in_flight):
            out = Outcome("/v1/chat/completions", now - 1.0 - i * 0.05, stream=True)
            out.request = Request(1000.0, 200.0, i % 2 == 0, 1.0, 0.025)
            out.first_byte = now - 0.5 - i * 0.05
            held.append(tracker.acquire(url, out))
    clock, cpu = time.perf_counter_ns, time.thread_time_ns
    refreshes: list[float] = []
    cpus: list[float] = []

    def refresh() -> None:
        t0 = clock()
        decider.refresh()
        refreshes.append((clock() - t0) / 1000)

    def run(n: int) -> list[float]:
        times = []
        for k in range(n):
            if k % refresh_every == 0:
                refresh()
            if tick is not None:
                tick()
            t0, c0 = clock(), cpu()
            request = decider.request(info) if decider.policy == "slo" else None
            decision = decider.decide(request)
            assert decision is not None
            tracker.acquire(decision.backend).release()
            c1, t1 = cpu(), clock()
            times.append((t1 - t0) / 1000)
            cpus.append((c1 - c0) / 1000)
        return times

    run(WARMUP)
    medians, p99s, cpu99s = [], [], []
    gc.collect()
    for _ in range(repeat):
        cpus.clear()
        times = run(number)
        medians.append(percentile(times, 0.5))
        p99s.append(percentile(times, 0.99))
        cpu99s.append(percentile(cpus, 0.99))
    for lease in held:
        lease.release()
    return min(medians), max(p99s), max(cpu99s), max(refreshes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policies", default="slo,spillover,crossover,predictive,round_robin")
    p.add_argument("--number", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--table", help="a crossover table (the slo policy's curves)")
    p.add_argument("--backends", default="1", help="backends per pool, N,N,...")
    p.add_argument("--in-flight", default="0", help="requests in flight per backend, N,N,...")
    p.add_argument("--refresh-every", type=int, default=5000,
                   help="decisions between two keeper timer ticks")  # fmt: skip
    p.add_argument("--pace", type=float, default=0.0,
                   help="requests/s on the router's (virtual) clock; 0: back to back")  # fmt: skip
    args = p.parse_args(argv)
    for policy in args.policies.split(","):
        for b in map(int, args.backends.split(",")):
            for n in map(int, args.in_flight.split(",")):
                med, p99, cpu99, ref = cost(policy, b, args.number, args.repeat, args.table, n,
                                     args.refresh_every, args.pace)  # fmt: skip
                print(
                    f"{policy} {b}+{b} backends, {n} in flight per backend: median "
                    f"{med:.1f} us, p99 {p99:.1f} us (CPU p99 {cpu99:.1f} us) per decision "
                    f"(refresh at most "
                    f"{ref / 1000:.1f} ms)",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
