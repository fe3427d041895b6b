"""The router's own work per request, step by step, in-process: no socket, no server, no task.

What ``bench/candidates/router_callbacks.py`` calls for each request, timed one step at a time
on a ``RouterApp`` built as ``spec-router serve`` builds it, two healthy backends and no table
(``decision_cost.healthy_app``): the part of a request's cost that no server shape removes
(issue 14; the budget is in bench/results/overhead-harnesses.md). Under load the same calls
cost about twice as much as here, where one loop keeps them in the CPU's caches.

- ``inspect``: the body's routing fields (``router.forward.request.inspect``);
- ``decide+lease``: the decision (``Decider.decide``) and the in-flight lease taken and given
  back;
- ``upstream request``: the forwarded headers and the body with the usage request spliced in;
- ``response head``: the end-to-end response headers;
- ``sse tap``: a stream's SSE tap over its chunks as an engine asked for usage sends them (the
  last content event with its finish reason, the usage event the router strips, ``[DONE]``);
- ``outcome+observers``: the request's ``Outcome`` through its life and every observer.

    python bench/lab/request_work.py
    python bench/lab/request_work.py --policy spillover --chunks 20
"""

from __future__ import annotations

import argparse
import functools
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

# (bench/lab/: the maintained benchmarks' modules are one folder up)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from decision_cost import BODY, healthy_app  # noqa: E402
from prometheus_client import CollectorRegistry, Histogram  # noqa: E402

from router.account.metrics import E2E_BUCKETS, observer  # noqa: E402
from router.account.outcome import Outcome  # noqa: E402
from router.decide.policy import Decision  # noqa: E402
from router.forward.request import forward_headers, inspect, response_headers, upstream_body  # noqa: E402
from router.upstream.stream import SseTap, Usage  # noqa: E402

PATH = "/v1/chat/completions"
REQUEST_HEADERS = [
    (b"host", b"127.0.0.1:8000"),
    (b"content-type", b"application/json"),
    (b"content-length", str(len(BODY)).encode()),
    (b"accept", b"*/*"),
    (b"user-agent", b"bench"),
]
RESPONSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"transfer-encoding", b"chunked"),
]


def _event(i: int, finish: bool) -> bytes:
    reason = '"stop"' if finish else "null"
    return (
        b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
        b'"model":"bench-model","choices":[{"index":0,"delta":{"content":" tok%d"},'
        b'"finish_reason":%s}]}\n\n' % (i, reason.encode())
    )


USAGE_EVENT = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"bench-model","choices":[],'
    b'"usage":{"prompt_tokens":8,"completion_tokens":20,"total_tokens":28}}\n\n'
)


def stream_chunks(chunks: int) -> list[bytes]:
    """One read per event; the usage event and ``[DONE]`` arrive with the last one."""
    reads = [_event(i, i == chunks - 1) for i in range(chunks)]
    reads[-1] += USAGE_EVENT + b"data: [DONE]\n\n"
    return reads


def steps(policy: str, chunks: int) -> dict[str, Callable[[], object]]:
    app = healthy_app(policy, 1)
    settings = app.settings
    decider, tracker, clock, observers = app.decider, app.tracker, app.clock, app.observers
    info = inspect(PATH, BODY, b"application/json")
    decision = decider.decide(None)
    assert decision is not None
    model_map = settings.pool_model_map(decision.pool)
    reads = stream_chunks(chunks)

    def decide() -> None:
        request = decider.request(info) if decider.policy == "slo" else None
        chosen = decider.decide(request)
        assert chosen is not None
        tracker.acquire(chosen.backend).release()

    def tap() -> None:
        sse = SseTap(strip_usage=True)
        for data in reads:
            sse.feed(data)
        sse.flush()
        assert sse.usage is not None

    def outcome() -> None:
        out = finished(clock, decision, None)
        for observe in observers:
            observe(out)

    return {
        "inspect": lambda: inspect(PATH, BODY, b"application/json"),
        "decide+lease": decide,
        "upstream request": lambda: (
            forward_headers(REQUEST_HEADERS, "127.0.0.1", None, False, False),
            upstream_body(info, BODY, model_map, True, None),
        ),
        "response head": lambda: response_headers(RESPONSE_HEADERS, False),
        f"sse tap ({chunks} chunks)": tap,
        "outcome+observers": outcome,
    }


def finished(clock: Callable[[], float], decision: Decision, usage: Usage | None) -> Outcome:
    """A streamed request's ``Outcome`` as the proxy leaves it, with ``usage`` counted when
    given."""
    out = Outcome(path=PATH, started=clock())
    out.read(True, True, 10)
    out.attempt(decision.pool, decision.backend, decision.reason, 0, 0.0, 0, 0.0)
    out.answered(200)
    out.first_bytes(clock(), 0.0, 0)
    if usage is not None:
        out.counted(usage)
    out.finish(clock())
    return out


def observer_steps(policy: str) -> dict[str, Callable[[], object]]:
    """Each observer alone, on a finished stream's ``Outcome`` with its usage counted (what
    ``outcome+observers`` leaves out: the token counters and the TPOT histogram)."""
    app = healthy_app(policy, 1)
    clock = app.clock
    decision = app.decider.decide(None)
    assert decision is not None

    counted = functools.partial(finished, clock, decision, Usage(8, 20))
    out = counted()
    steps: dict[str, Callable[[], object]] = {"  the Outcome": counted}
    for observe in app.observers:
        steps[f"  {observe.__qualname__}"] = functools.partial(observe, out)
    return steps


def histogram_steps() -> dict[str, Callable[[], object]]:
    """One observation of the request-duration histogram, by prometheus-client's ``observe``
    and by the router's ``observer`` (router.account.metrics), at three values."""
    child = Histogram("d", "d", ["pool"], buckets=E2E_BUCKETS, registry=CollectorRegistry())
    series = child.labels("p")
    fast = observer(series)
    steps: dict[str, Callable[[], object]] = {}
    for value in (0.001, 0.23, 20.0):
        steps[f"  observe({value:g})"] = functools.partial(series.observe, value)
        steps[f"  observer({value:g})"] = functools.partial(fast, value)
    return steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", default="slo")
    p.add_argument("--chunks", type=int, default=1, help="SSE events per stream")
    p.add_argument("--number", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument(
        "--observers",
        action="store_true",
        help="then each observer alone, usage counted, and one histogram observation",
    )
    args = p.parse_args(argv)

    number: int = args.number

    def timed(step: Callable[[], object]) -> float:
        return min(timeit.repeat(step, number=number, repeat=args.repeat)) / number

    total = 0.0
    for name, step in steps(args.policy, args.chunks).items():
        us = timed(step) * 1e6
        total += us
        print(f"{name:24s} {us:7.1f} us")
    print(f"{'total':24s} {total:7.1f} us per request (policy {args.policy})")
    if args.observers:
        for name, step in observer_steps(args.policy).items():
            print(f"{name:24s} {timed(step) * 1e6:7.1f} us")
        for name, step in histogram_steps().items():
            print(f"{name:24s} {timed(step) * 1e6:7.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
