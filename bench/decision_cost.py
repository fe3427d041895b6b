"""CPU per routing decision, by policy: ``Decider.decide`` in-process, no sockets (timeit).

The router is built as ``spec-router serve`` builds it (default settings but the policy), with
two backends marked healthy and no table (so ``slo`` has no models and decides as
``predictive``). One decision includes reading the request's fields (``slo``) and taking and
releasing the lease, as the proxy does for every request. Prints one line per policy: the best
of ``--repeat`` runs.

``--table FILE --in-flight 0,16,64,256``: then the ``slo`` policy with that table's models,
with that many streamed requests in flight on each backend (its simulation of each backend is
what costs: router.decide.twin).

    python bench/decision_cost.py
    python bench/decision_cost.py --policies slo --table bench/results/calibration-traffic.json \
        --in-flight 0,4,16,64,256
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit

from router.account.outcome import Outcome
from router.app import RouterApp
from router.decide.predict import Request
from router.forward.request import inspect
from router.settings import Settings

URLS = ("http://127.0.0.1:1", "http://127.0.0.1:2")
BODY = json.dumps(
    {
        "model": "m",
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 16,
        "stream": True,
    }
).encode()


def healthy_app(policy: str, table: str | None = None) -> RouterApp:
    """A ``RouterApp`` as ``spec-router serve`` builds it, one backend in each pool (``URLS``),
    both marked healthy (no poller runs)."""
    settings = Settings(
        speculative_urls=[URLS[0]], baseline_urls=[URLS[1]], policy=policy, table_path=table
    )
    app = RouterApp(settings)
    for url in URLS:
        for _ in range(settings.rise + 1):
            app.health.probe(url, True, app.clock())
    return app


def cost(
    policy: str, number: int, repeat: int, table: str | None = None, in_flight: int = 0
) -> float:
    """Microseconds per decision (best of ``repeat``)."""
    app = healthy_app(policy, table)
    decider, tracker = app.decider, app.tracker
    info = inspect("/v1/chat/completions", BODY, b"application/json")
    now = app.clock()
    for url in URLS:  # streamed requests in flight, some of them decoding for a while
        for i in range(in_flight):
            out = Outcome("/v1/chat/completions", now - 1.0 - i * 0.05, stream=True)
            out.request = Request(1000.0, 200.0, i % 2 == 0, 1.0, 0.025)
            out.first_byte = now - 0.5 - i * 0.05
            tracker.acquire(url, out)

    def one() -> None:
        request = decider.request(info) if decider.policy == "slo" else None
        decision = decider.decide(request)
        assert decision is not None
        tracker.acquire(decision.backend).release()

    return min(timeit.repeat(one, number=number, repeat=repeat)) / number * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policies", default="slo,spillover,crossover,predictive,round_robin")
    p.add_argument("--number", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--table", help="a crossover table (the slo policy's models)")
    p.add_argument("--in-flight", default="0", help="requests in flight per backend, N,N,...")
    args = p.parse_args(argv)
    for policy in args.policies.split(","):
        for n in map(int, args.in_flight.split(",")):
            us = cost(policy, max(1, args.number // (1 + n // 8)), args.repeat, args.table, n)
            where = f" ({n} in flight per backend)" if args.table else ""
            print(f"{policy}{where}: {us:.1f} us per decision")
    return 0


if __name__ == "__main__":
    sys.exit(main())
