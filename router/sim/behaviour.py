"""What each real engine does that a proxy can see, as plain values: ``spec-router sim --engine``.

Every field is read from the engines' own source (notes in ``docs/engines.md``, with file and
line): SGLang 0.5.23 (the default) and 0.5.3, vLLM 0.34 (the default) and 0.11. Durations are
model seconds; the server stretches them by ``--time-scale`` like everything else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

EngineName = Literal["sglang", "vllm"]
Overload = Literal["event", "close", "status"]

VERSIONS: dict[EngineName, tuple[str, ...]] = {
    "sglang": ("0.5.23", "0.5.3"),
    "vllm": ("0.34", "0.11"),
}


@dataclass(frozen=True)
class Behaviour:
    engine: EngineName
    version: str
    # /ready: a cheap readiness check (SGLang 0.5.23 only; 503 while starting or unhealthy)
    has_ready: bool
    # /health runs a one-token generation and polls for output every second (SGLang); off
    # with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0 on 0.5.23 (/health_generate still does)
    health_generates: bool
    health_poll: float = 1.0  # asyncio.sleep(1) between looks for output
    health_check_timeout: float = 20.0  # SGLANG_HEALTH_CHECK_TIMEOUT: then 503
    # after the port starts listening: /health answers 503 until the warm-up request is done
    # (SGLang's _wait_and_warmup); vLLM listens only once it is ready
    warmup: float = 0.0
    # stream response headers go out before queueing (vLLM, SGLang 0.5.3) or with the first
    # chunk (SGLang 0.5.23 kick-starts the generator before it answers)
    early_stream_headers: bool = True
    # a full queue on a stream: an error event under 200 (0.5.23), 200 and then the
    # connection closes with no event (0.5.3), or a real 503 before headers (vLLM 0.34)
    overload: Overload = "status"
    flat_errors: bool = False  # SGLang: {"object": "error", ...}; vLLM: {"error": {...}}
    # a disconnected client: SGLang aborts a started stream 2 s later (a background task
    # after asyncio.sleep(2)) and polls every 4 s before the first chunk and for
    # non-streams (also at every 50th token of a non-stream); vLLM aborts at once
    abort_delay: float = 0.0
    abort_poll: float = 0.0
    interim_every: int = 50  # non-stream interim outputs (DEFAULT_FORCE_STREAM_INTERVAL)
    # load gauges: vLLM every step; SGLang on each prefill batch and every
    # decode_log_interval decode steps, and when idle: at once if stale (0.5.23), else
    # every 30 s (0.5.3: only every 30 s)
    gauges_every_step: bool = True
    decode_log_interval: int = 40
    idle_refresh: float = 30.0
    idle_refresh_when_stale: bool = True
    # usage: vLLM 0.11's StreamOptions.include_usage defaults to True (so {} asks for it)
    empty_options_include_usage: bool = False
    continuous_usage: bool = True  # SGLang 0.5.3 drops continuous_usage_stats
    options_need_stream: bool = False  # vLLM: stream_options without stream=True is a 400
    # model names: SGLang accepts any and defaults to "default"; vLLM answers 404 to an
    # unknown one and serves a missing one under its own name
    strict_model: bool = False
    missing_model: str | None = "default"  # None: the served name
    # metrics
    has_priority_label: bool = True  # SGLang 0.5.23
    has_moe_ep_rank: bool = True
    has_verify_counter: bool = True  # sglang:spec_verify_calls_total (0.5.23)
    server_info_paths: tuple[str, ...] = ()
    has_max_queued: bool = True  # vLLM 0.11 has no admission limit

    @property
    def label(self) -> str:
        return f"{self.engine} {self.version}"


def behaviour(
    engine: EngineName, version: str | None = None, env: dict[str, str] | None = None
) -> Behaviour:
    """The behaviour of ``engine`` at ``version`` (its newest when None), given the environment
    the engine would read (``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION``,
    ``SGLANG_HEALTH_CHECK_TIMEOUT``)."""
    env = dict(os.environ) if env is None else env
    versions = VERSIONS[engine]
    version = versions[0] if version is None else version
    if version not in versions:
        raise ValueError(f"{engine} versions: {', '.join(versions)}")
    if engine == "vllm":
        old = version == "0.11"
        return Behaviour(
            engine,
            version,
            has_ready=False,
            health_generates=False,
            empty_options_include_usage=old,
            options_need_stream=True,
            strict_model=True,
            missing_model=None,
            has_priority_label=False,
            has_moe_ep_rank=False,
            has_verify_counter=False,
            has_max_queued=not old,
        )
    new = version == "0.5.23"
    generation = env.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true").lower()
    return Behaviour(
        engine,
        version,
        has_ready=new,
        health_generates=not new or generation not in ("0", "false", "no", "off"),
        health_check_timeout=float(env.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20")),
        warmup=2.0,
        early_stream_headers=not new,
        overload="event" if new else "close",
        flat_errors=True,
        abort_delay=2.0,
        abort_poll=4.0,
        gauges_every_step=False,
        idle_refresh_when_stale=new,
        continuous_usage=new,
        has_priority_label=new,
        has_moe_ep_rank=new,
        has_verify_counter=new,
        server_info_paths=("/server_info", "/get_server_info") if new else ("/get_server_info",),
    )
