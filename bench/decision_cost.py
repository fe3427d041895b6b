"""CPU per routing decision, by policy: ``Decider.decide`` in-process, no sockets (timeit).

The router is built as ``spec-router serve`` builds it (default settings but the policy), with
two backends marked healthy and no table (so ``slo`` runs on its default models). One decision
includes reading the request's fields (``slo``) and taking and releasing the lease, as the proxy
does for every request. Prints one line per policy: the best of ``--repeat`` runs.

    python bench/decision_cost.py
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit

from router.app import RouterApp
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


def cost(policy: str, number: int, repeat: int) -> float:
    """Microseconds per decision (best of ``repeat``)."""
    app = RouterApp(Settings(speculative_urls=[URLS[0]], baseline_urls=[URLS[1]], policy=policy))
    for url in URLS:
        for _ in range(app.settings.rise + 1):
            app.health.probe(url, True, app.clock())
    decider, tracker = app.decider, app.tracker
    info = inspect("/v1/chat/completions", BODY, b"application/json")

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
    args = p.parse_args(argv)
    for policy in args.policies.split(","):
        print(f"{policy}: {cost(policy, args.number, args.repeat):.1f} us per decision")
    return 0


if __name__ == "__main__":
    sys.exit(main())
