"""The options of ``spec-router replay`` and the workload and SLOs they describe (kept apart
from the sender so that it stays readable)."""

from __future__ import annotations

import argparse
from typing import Any

from router.tools import goodput, traffic
from router.tools.traffic import Arrival

EXAMPLES = """\
examples:
  # the Azure conversation trace, its first 120 s thinned to 2 req/s, against the sims
  spec-router replay --url http://127.0.0.1:8000 --trace azure-llm-2023-conv.csv \\
      --duration 120 --rate 2 --time-scale 0.25 --out run.json --report run.md
  # bursty synthetic traffic, half of it at temperature 1, against real engines
  spec-router replay --url http://router:8000 --synthetic bursty --rate 4 --duration 300 \\
      --temperature-share 0.5 --endpoint completions --model llama-3.1-8b --report run.md

All times are model time: with --time-scale X (sims started with the same X) every arrival
is sent X times sooner and every measured duration is divided by X.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spec-router replay",
        description="Replay a trace or synthetic traffic open-loop (arrivals do not wait for "
        "answers) and report goodput under TTFT/TPOT SLOs.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", required=True, help="router or engine base URL (with or without /v1)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="Azure LLM inference CSV, or Mooncake-style JSONL")
    source.add_argument("--synthetic", choices=("poisson", "bursty", "diurnal"))

    shape = p.add_argument_group("workload")
    shape.add_argument(
        "--rate", type=float, help="mean requests/s (trace: scale to it; synthetic: default 1)"
    )
    shape.add_argument(
        "--duration", type=float, help="seconds of traffic (trace: default all; synthetic: 60)"
    )
    shape.add_argument("--start", type=float, default=0.0, help="trace: skip its first S seconds")
    shape.add_argument(
        "--scale",
        choices=("thin", "compress"),
        default="thin",
        help="trace: reach --rate by a random subset (keeps its time pattern) or by "
        "scaling its clock (keeps every request in order)",
    )
    shape.add_argument("--max-requests", type=int, help="send at most the first N")
    shape.add_argument("--seed", type=int, default=0)
    shape.add_argument(
        "--temperature-share",
        type=float,
        help="share of requests at temperature 1.0, the rest at 0.0 (a trace keeps 0.0)",
    )
    shape.add_argument("--max-prompt", type=int, help="cap prompt lengths (tokens)")
    shape.add_argument("--max-output", type=int, help="cap output lengths (tokens)")

    synth = p.add_argument_group("synthetic lengths (lognormal: median, sigma, clipped)")
    synth.add_argument("--prompt-median", type=float, default=1020.0)
    synth.add_argument("--prompt-sigma", type=float, default=1.0)
    synth.add_argument("--prompt-min", type=int, default=16)
    synth.add_argument("--prompt-max", type=int, default=8192)
    synth.add_argument("--output-median", type=float, default=129.0)
    synth.add_argument("--output-sigma", type=float, default=0.86)
    synth.add_argument("--output-min", type=int, default=4)
    synth.add_argument("--output-max", type=int, default=1000)
    synth.add_argument("--burst", type=float, default=4.0, help="bursty: on-phase rate factor")
    synth.add_argument("--on-s", type=float, default=10.0, help="bursty: on-phase seconds")
    synth.add_argument("--off-s", type=float, default=20.0, help="bursty: off-phase seconds")
    synth.add_argument("--period-s", type=float, default=120.0, help="diurnal: period")
    synth.add_argument("--amplitude", type=float, default=0.5, help="diurnal: rate swing, 0-1")

    send = p.add_argument_group("sending")
    send.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    send.add_argument("--model", default="default")
    send.add_argument("--api-key", help="sent as `Authorization: Bearer KEY`")
    send.add_argument(
        "--header", action="append", default=[], metavar="NAME:VALUE", help="extra header"
    )
    send.add_argument(
        "--time-scale", type=float, default=1.0, help="the sims' --time-scale (1 for real ones)"
    )
    send.add_argument(
        "--drain", type=float, default=120.0, help="seconds to wait for answers after the last send"
    )

    score = p.add_argument_group("scoring (model time)")
    score.add_argument(
        "--warmup", type=float, default=0.0, help="leave arrivals before S seconds unscored"
    )
    score.add_argument("--slo-ttft-ms", type=float, help="add a `custom` SLO with this TTFT")
    score.add_argument("--slo-tpot-ms", type=float, help="... and this TPOT")
    score.add_argument("--out", help="write every result as JSON here")
    score.add_argument("--report", help="write a markdown report here")
    return p


def workload(ns: argparse.Namespace) -> list[Arrival]:
    """The arrivals the options describe (reads the trace file, if one is named)."""
    if ns.trace:
        arrivals = traffic.load_trace(ns.trace)
        rate = ns.rate
        if ns.scale == "compress" and rate is not None:
            tail = traffic.window(arrivals, ns.start)
            arrivals = traffic.window(traffic.compress(tail, rate), 0.0, ns.duration)
        else:
            arrivals = traffic.window(arrivals, ns.start, ns.duration)
            if rate is not None:
                arrivals = traffic.thin(arrivals, rate, ns.duration, seed=ns.seed)
        if ns.temperature_share is not None:
            arrivals = traffic.with_temperatures(arrivals, ns.temperature_share, ns.seed)
    else:
        prompt = traffic.Lengths(ns.prompt_median, ns.prompt_sigma, ns.prompt_min, ns.prompt_max)
        output = traffic.Lengths(ns.output_median, ns.output_sigma, ns.output_min, ns.output_max)
        common: dict[str, Any] = {
            "temperature_share": ns.temperature_share or 0.0,
            "seed": ns.seed,
        }
        rate, duration = ns.rate or 1.0, ns.duration or 60.0
        if ns.synthetic == "poisson":
            arrivals = traffic.poisson(rate, duration, prompt, output, **common)
        elif ns.synthetic == "bursty":
            arrivals = traffic.on_off(
                rate, duration, prompt, output, burst=ns.burst, on_s=ns.on_s, off_s=ns.off_s,
                **common,
            )  # fmt: skip
        else:
            arrivals = traffic.diurnal(
                rate, duration, prompt, output, period_s=ns.period_s, amplitude=ns.amplitude,
                **common,
            )  # fmt: skip
    arrivals = traffic.cap_lengths(arrivals, ns.max_prompt, ns.max_output)
    return traffic.window(arrivals, 0.0, None, ns.max_requests)


def slos(ns: argparse.Namespace) -> list[goodput.SLO]:
    out = list(goodput.DEFAULT_SLOS)
    if ns.slo_ttft_ms is not None or ns.slo_tpot_ms is not None:
        ttft = goodput.STRICT.ttft_s if ns.slo_ttft_ms is None else ns.slo_ttft_ms / 1000
        tpot = goodput.STRICT.tpot_s if ns.slo_tpot_ms is None else ns.slo_tpot_ms / 1000
        out.append(goodput.SLO("custom", ttft, tpot))
    return out
