"""``spec-router sim`` / ``python -m router.sim``: run one simulated engine.

``--engine sglang|vllm`` (and ``--engine-version``) choose whose behaviour the server copies
(``router.sim.behaviour``). ``--preset`` picks an engine regime's model (docs/regimes.md); every
model parameter of the preset can be overridden from the command line, and the engine settings
that change its speed or what it reports take SGLang's flag names (``--max-running-requests``,
``--cuda-graph-max-bs``, ``--disable-overlap-schedule``, ``--speculative-*``), resolved as
SGLang resolves them. Durations are model time: ``--time-scale X`` stretches all of them
(iterations, prefill, start-up, warm-up, health polling, abort delays) by X, so tok/s measured
against the server equal the model's tok/s divided by X. The idle keep-alive (``--keep-alive``,
5 s as both engines run uvicorn) is wall-clock.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from router.serving import LISTENING_PREFIX, ClosingServer, bind_socket, socket_url, uvicorn_config
from router.sim.behaviour import VERSIONS, behaviour
from router.sim.exposition import Topology
from router.sim.model import MS, PRESETS, Preset
from router.sim.server import SimServer, SimSettings

DEFAULT_PORTS = {"eagle3": 30001, "eagle3-chain": 30001, "eagle3-tree": 30001, "baseline": 30002}
# SGLang's --cuda-graph-max-bs when not given, as on an 80-160 GB GPU (H100, H200): 256 below
# TP 4, else 512; 0.5.23 caps that default at --max-running-requests (sg23 memory_hook.py,
# _handle_gpu_memory_settings; sg03 server_args.py:597-616 does not cap it).
GRAPH_MAX_BS, GRAPH_MAX_BS_TP4 = 256, 512
DEFAULT_CONTEXT = 131072
# On SIGTERM, open streams get this long before they are cancelled: a simulator holds no
# state worth a graceful drain, and tests stop servers that have hanging requests.
GRACEFUL_SHUTDOWN = 0.5

# flag, Preset field, scale from the flag's unit to the field's unit, type, help
OVERRIDES: list[tuple[str, str, float, type, str]] = [
    ("--a-ms", "a", MS, float, "fixed cost per iteration, ms"),
    ("--b-ms", "b", MS, float, "cost per running request per iteration, ms"),
    ("--c-kv-ns", "c_kv", 1e-9, float, "cost per context token per iteration, ns"),
    ("--p0-ms", "p0", MS, float, "fixed prefill cost per joining request, ms"),
    ("--r-pre", "r_pre", 1.0, float, "prefill speed, prompt tokens/s"),
    ("--prefill-factor", "prefill_factor", 1.0, float, "prefill multiplier (1 + eps)"),
    ("--max-running", "max_running", 1, int, "running requests before new ones queue"),
    ("--spec-k", "spec_k", 1, int, "draft depth: at most this many drafts accepted per iteration"),
    ("--tau", "tau", 1.0, float, "mean accepted length per iteration at temperature 0"),
    ("--tau-sampling", "tau_sampling", 1.0, float, "mean accepted length at temperature > 0"),
    ("--startup-s", "startup", 1.0, float, "start-up time used by a bare --startup-delay"),
    (
        "--cuda-graph-max-bs",
        "cuda_graph_max_bs",
        1,
        int,
        "batches above run without CUDA graphs: a times EAGER_FACTOR (default: SGLang's, 256 "
        "below TP 4, else 512, capped at --max-running-requests on 0.5.23)",
    ),
    (
        "--speculative-eagle-topk",
        "eagle_topk",
        1,
        int,
        "draft branching, reported on /server_info (the preset's costs stay as fitted)",
    ),
    (
        "--speculative-num-draft-tokens",
        "num_draft_tokens",
        1,
        int,
        "tokens verified per request, reported on /server_info (costs stay as fitted)",
    ),
]
# SGLang's names for the same settings (0.5.23 calls the graph limit --cuda-graph-max-bs-decode)
ALIASES = {
    "--max-running": ("--max-running-requests",),
    "--spec-k": ("--speculative-num-steps",),
    "--cuda-graph-max-bs": ("--cuda-graph-max-bs-decode",),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spec-router sim",
        description="Run a simulated SGLang or vLLM engine (OpenAI-compatible) whose speed "
        "follows a speculative or a baseline performance model.",
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True)
    parser.add_argument(
        "--engine",
        choices=sorted(VERSIONS),
        default="sglang",
        help="whose HTTP behaviour to copy (health, errors, gauges, overload, aborts)",
    )
    parser.add_argument(
        "--engine-version",
        help="sglang: 0.5.23 (default) or 0.5.3; vllm: 0.34 (default) or 0.11",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--port", type=int, help="0 picks a free port (default: 30001 eagle3, 30002 baseline)"
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiply every simulated duration by X; measured tok/s = model tok/s / X",
    )
    parser.add_argument(
        "--startup-delay",
        type=float,
        nargs="?",
        const=-1.0,
        default=0.0,
        metavar="S",
        help="load for S model seconds (bare: the preset's 510/550 s), scaled like the rest",
    )
    parser.add_argument(
        "--startup-mode",
        choices=("refuse", "503"),
        default="refuse",
        help="while loading: do not listen (as both engines), or listen and answer 503",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        metavar="S",
        help="model seconds of 503 once listening (SGLang's warm-up request; default 2, vLLM 0)",
    )
    parser.add_argument(
        "--keep-alive",
        type=float,
        default=5.0,
        metavar="S",
        help="close a client connection idle this long, wall clock (uvicorn's 5 s, as both)",
    )
    parser.add_argument(
        "--max-queued",
        type=int,
        help="refuse requests while this many wait (SGLang --max-queued-requests, "
        "vLLM 0.34 --max-num-queued-reqs)",
    )
    parser.add_argument("--dp-size", type=int, default=1, help="data-parallel ranks")
    parser.add_argument("--tp-size", type=int, default=1, help="tensor-parallel ranks")
    parser.add_argument(
        "--enable-metrics-for-all-schedulers",
        action="store_true",
        help="SGLang: every TP rank exports its (identical) series",
    )
    parser.add_argument(
        "--enable-priority",
        action="store_true",
        help='SGLang 0.5.23 priority scheduling: a priority="" total and per-priority series',
    )
    parser.add_argument(
        "--disable-overlap-schedule",
        action="store_true",
        help="SGLang's: iterations cost NO_OVERLAP_FACTOR more (the speculative presets were "
        "measured without the overlap scheduler already)",
    )
    metrics = parser.add_mutually_exclusive_group()
    metrics.add_argument(
        "--enable-metrics",
        dest="metrics",
        action="store_true",
        default=True,
        help="serve /metrics (the default here; SGLang's own default is off)",
    )
    metrics.add_argument(
        "--disable-metrics",
        dest="metrics",
        action="store_false",
        help="no /metrics (404), as SGLang without --enable-metrics; not for vLLM",
    )
    parser.add_argument("--seed", type=int, help="seed of the acceptance draws (reproducible)")
    parser.add_argument("--model", default="default", help="served model name")
    parser.add_argument(
        "--model-path",
        help="the weights' path as the engine reports it (SGLang --model-path, vLLM --model; "
        "default: the served name)",
    )
    parser.add_argument(
        "--tokenizer-path", help="SGLang's tokenizer path, as /server_info reports it"
    )
    parser.add_argument(
        "--random-seed",
        type=int,
        help="SGLang's --random-seed, shown on /server_info (default: drawn at launch, as "
        "SGLang does: it tells one process from another)",
    )
    parser.add_argument(
        "--disable-log-stats",
        action="store_true",
        help="vLLM's: no vllm: series on /metrics at all (no load, no spec-decode counters)",
    )
    parser.add_argument(
        "--strict-model",
        action="store_true",
        default=None,
        help="answer 404 to other model names (vLLM always does; SGLang accepts any)",
    )
    parser.add_argument("--api-key", help="require `Authorization: Bearer KEY` on /v1/*")
    parser.add_argument("--default-max-tokens", type=int, default=128)
    parser.add_argument(
        "--context-length",
        type=int,
        help="context length (default 131072; SGLang's /server_info shows it only if given)",
    )
    parser.add_argument("--log-level", default="warning")
    group = parser.add_argument_group("model parameters (override the preset)")
    for flag, _, _, type_, help_ in OVERRIDES:
        group.add_argument(flag, *ALIASES.get(flag, ()), type=type_, help=help_)
    return parser


def preset_from_args(args: argparse.Namespace) -> Preset:
    changes: dict[str, Any] = {}
    for flag, field_name, unit, _, _ in OVERRIDES:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            changes[field_name] = value * unit if isinstance(value, float) else value
    if args.disable_overlap_schedule:
        changes["disable_overlap_schedule"] = True
    preset = PRESETS[args.preset].replace(**changes)
    if preset.cuda_graph_max_bs is None and args.engine == "sglang":
        graphs = GRAPH_MAX_BS_TP4 if args.tp_size >= 4 else GRAPH_MAX_BS
        if args.engine_version in (None, "0.5.23"):
            graphs = min(graphs, preset.max_running)
        preset = preset.replace(cuda_graph_max_bs=graphs)
    return preset


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        preset = preset_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.time_scale <= 0:
        parser.error("--time-scale must be > 0")
    try:
        how = behaviour(args.engine, args.engine_version)
    except ValueError as exc:
        parser.error(str(exc))
    if args.max_queued is not None and not how.has_max_queued:
        parser.error(f"{how.label} has no queue limit")
    if min(args.dp_size, args.tp_size) < 1:
        parser.error("--dp-size and --tp-size must be >= 1")
    if not args.metrics and how.engine == "vllm":
        parser.error("vLLM always serves /metrics (--disable-log-stats empties it)")
    if args.disable_log_stats and how.engine != "vllm":
        parser.error("--disable-log-stats is vLLM's (SGLang: --disable-metrics)")
    delay = preset.startup if args.startup_delay < 0 else args.startup_delay
    warmup = how.warmup if args.warmup is None else args.warmup
    port = DEFAULT_PORTS[args.preset] if args.port is None else args.port
    settings = SimSettings(
        preset=preset,
        model=args.model,
        time_scale=args.time_scale,
        seed=args.seed,
        startup_delay=warmup + (delay if args.startup_mode == "503" else 0.0),
        default_max_tokens=args.default_max_tokens,
        context_length=args.context_length or DEFAULT_CONTEXT,
        api_key=args.api_key,
        strict_model=args.strict_model,
        how=how,
        topology=Topology(
            dp_size=args.dp_size,
            tp_size=args.tp_size,
            all_schedulers=args.enable_metrics_for_all_schedulers,
            priority=args.enable_priority,
        ),
        max_queued=args.max_queued,
        keep_alive=args.keep_alive,
        metrics=args.metrics,
        cuda_graph_flag=args.cuda_graph_max_bs,
        model_path=args.model_path,
        tokenizer_path=args.tokenizer_path,
        context_length_flag=args.context_length,
        random_seed=args.random_seed,
        log_stats=not args.disable_log_stats,
    )
    if args.startup_mode == "refuse" and delay > 0:
        wait = delay * args.time_scale
        print(f"spec-router: sim starting, will listen in {wait:g} s", flush=True)
        time.sleep(wait)
    return serve(SimServer(settings), args.host, port, args.log_level)


def serve(app: SimServer, host: str, port: int, log_level: str) -> int:
    """``router.serving.run`` with a short graceful-shutdown timeout."""
    try:
        sock = bind_socket(host, port)
    except OSError as exc:
        print(f"spec-router: cannot listen on {host}:{port}: {exc.strerror}", file=sys.stderr)
        return 1
    config = uvicorn_config(
        app,
        log_level=log_level,
        graceful_shutdown=GRACEFUL_SHUTDOWN,
        keep_alive=app.settings.keep_alive,
    )
    url = socket_url(sock)
    # announced once the warm-up is over, not when the port opens (it answers 503 till then)
    app.on_ready = lambda: print(f"{LISTENING_PREFIX}{url}", flush=True)
    server = ClosingServer(config)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0 if server.started else 3
