"""The HTTP face of a simulated engine: a plain ASGI app (no framework on the token path).

Per streamed token batch the work is one string join and one ``send``; a raw ASGI app keeps
that cheap enough for hundreds of concurrent streams on one core. Completions are served by
``router.sim.completions``; this module routes, runs the engines (one per data-parallel rank)
in the lifespan, and serves health, readiness, models, server info, metrics and the runtime
knobs (``/sim/config``), each as the chosen engine does (``router.sim.behaviour``):

- SGLang's ``/health`` (and always ``/health_generate``) runs a one-token generation (skipped
  while busy) and answers 200 only once some output reached the server after the probe began,
  looking every second: at least 1 s. With no output for ``SGLANG_HEALTH_CHECK_TIMEOUT`` it
  answers 503 and the server counts as unhealthy until a probe succeeds. 0.5.23 has a cheap
  ``/ready``. vLLM's ``/health`` is a flag check. Bodies are empty.
- SGLang guards every path but ``/health*``, ``/metrics*`` and ``/ready*`` with its API key;
  vLLM only ``/v1/*``. Both answer 401 ``{"error": "Unauthorized"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    ProcessCollector,
    generate_latest,
)

from router import __version__
from router.asgi import ClientGone, Receive, Scope, Send
from router.sim.asgi import DropSimulatedReset, read_body, respond
from router.sim.behaviour import Behaviour, behaviour
from router.sim.completions import Completions
from router.sim.engine import Engine
from router.sim.exposition import SglangCollector, Topology, VllmCollector
from router.sim.faults import NO_FAULT, Fault, parse_fault
from router.sim.model import Preset
from router.sim.protocol import BadRequest, Limits, error_body

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]
EMPTY: list[tuple[bytes, bytes]] = []


def _report_engine_death(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logging.getLogger("uvicorn.error").error("engine loop died", exc_info=task.exception())


@dataclass(frozen=True)
class SimSettings:
    preset: Preset
    model: str = "default"
    time_scale: float = 1.0
    seed: int | None = None
    # model seconds after the port listens during which the engine answers 503 (its own
    # warm-up, plus any loading time under ``--startup-mode 503``)
    startup_delay: float = 0.0
    default_max_tokens: int = 128
    context_length: int = 131072
    api_key: str | None = None
    strict_model: bool | None = None  # None: as the engine does (vLLM 404s unknown names)
    how: Behaviour = field(default_factory=lambda: behaviour("sglang"))
    topology: Topology = field(default_factory=Topology)
    max_queued: int | None = None
    keep_alive: float = 5.0  # seconds an idle client connection stays open (uvicorn's, both)
    metrics: bool = True  # serve /metrics (SGLang only with --enable-metrics; vLLM always)
    # --cuda-graph-max-bs as given (None: not given), which 0.5.23's /server_info shows raw
    # beside the resolved limit; the preset holds the resolved one
    cuda_graph_flag: int | None = None
    # what the engine says about itself beyond the served name (``router.health.info``):
    # the weights' path (SGLang --model-path, vLLM --model; None: the served name), the
    # tokenizer's (None: the model path), --context-length as given (SGLang's /server_info
    # shows None unless it is given; the effective one is ``context_length``), SGLang's
    # --random-seed (None: random per launch, as SGLang draws one) and vLLM's
    # --disable-log-stats (no vllm: series at all)
    model_path: str | None = None
    tokenizer_path: str | None = None
    context_length_flag: int | None = None
    random_seed: int | None = None
    log_stats: bool = True


class SimServer:
    """ASGI app: ``SimServer(settings)`` is served as is by uvicorn."""

    def __init__(self, settings: SimSettings) -> None:
        self.settings = s = settings
        how = s.how
        seed = random.randrange(2**32) if s.seed is None else s.seed
        self.engines = [
            Engine(
                s.preset,
                time_scale=s.time_scale,
                seed=seed if rank == 0 else seed + rank,
                every_step=how.gauges_every_step,
                log_interval=how.decode_log_interval,
                idle_refresh=how.idle_refresh,
                refresh_when_stale=how.idle_refresh_when_stale,
                max_queued=s.max_queued,
            )
            for rank in range(s.topology.dp_size)
        ]
        self.engine = self.engines[0]
        strict = how.strict_model if s.strict_model is None else s.strict_model
        self.limits = Limits(
            s.model,
            s.default_max_tokens,
            s.context_length,
            strict,
            missing_model=how.missing_model,
            empty_options_include_usage=how.empty_options_include_usage,
            continuous_usage=how.continuous_usage,
            continuous_needs_usage=how.engine == "vllm",
            options_need_stream=how.options_need_stream,
            flat_errors=how.flat_errors,
        )
        self._auth = None if s.api_key is None else f"Bearer {s.api_key}".encode()
        self.registry = CollectorRegistry(auto_describe=True)
        # SGLang's random_seed: drawn at launch unless given (sg23 serving_hook.py:660-665)
        self.random_seed = random.randint(0, 1 << 30) if s.random_seed is None else s.random_seed
        if how.engine == "vllm":
            # one API server: the default registry, with the process's start time
            ProcessCollector(registry=self.registry)
            if s.log_stats:
                self.registry.register(VllmCollector(s.model, self.engines))
        else:
            self.registry.register(SglangCollector(s.model, self.engines, how, s.topology))
        self.fault: Fault = NO_FAULT
        self.health_status = 200
        self.unhealthy = False  # SGLang: a /health probe timed out (until one succeeds)
        self.completions = Completions(
            self.engines,
            self.limits,
            how,
            lambda: self.ready,
            lambda: self.fault,
            random.Random(f"{seed}:faults"),
        )
        self._ready_at = 0.0
        self._started = time.time()
        self._launched = time.monotonic()
        # SGLang 0.5.23's startup_time: seconds each phase took (``/server_info``)
        self._startup_time: dict[str, Any] | None = None
        # called once the warm-up is over (the CLI announces the URL then: tools that wait
        # for the announcement get a server that serves)
        self.on_ready: Callable[[], None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completions,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/sim/config"): self._get_config,
            ("POST", "/sim/config"): self._post_config,
        }
        if s.metrics:
            self._routes[("GET", "/metrics")] = self._metrics
        if how.engine == "sglang":
            self._routes[("GET", "/health_generate")] = self._health
            for path in how.server_info_paths:
                self._routes[("GET", path)] = self._server_info
        if how.has_ready:
            self._routes[("GET", "/ready")] = self._ready
        if how.engine == "vllm":
            self._routes[("GET", "/version")] = self._version
        logging.getLogger("uvicorn.error").addFilter(DropSimulatedReset())

    @property
    def ready(self) -> bool:
        return time.monotonic() >= self._ready_at

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                delay = self.settings.startup_delay * self.settings.time_scale
                self._ready_at = time.monotonic() + delay
                for engine in self.engines:
                    task = loop.create_task(engine.run())
                    task.add_done_callback(_report_engine_death)
                    self._tasks.append(task)
                self._tasks.append(loop.create_task(self._warm_up(delay)))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                for task in self._tasks:
                    task.cancel()
                for task in self._tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _warm_up(self, delay: float) -> None:
        """SGLang's warm-up request is its schedulers' first report: the gauges exist
        from then on."""
        self._startup_time = {"tokenizer_e2e": time.monotonic() - self._launched}
        await asyncio.sleep(delay)
        for engine in self.engines:
            if engine.published is None:
                engine.publish()
        if self.on_ready is not None:
            self.on_ready()

    def _guarded(self, path: str) -> bool:
        if self._auth is None:
            return False
        if self.settings.how.engine == "vllm":
            return path.startswith("/v1")
        return not path.startswith(("/health", "/metrics", "/ready", "/sim/"))

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        handler = self._routes.get((scope["method"], path))
        if self._guarded(path):
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if given != self._auth:
                await respond(send, 401, b'{"error":"Unauthorized"}')
                return
        if handler is not None:
            try:
                await handler(scope, receive, send)
            except BadRequest as exc:
                body = error_body(exc.status, exc.message, exc.param, self.limits.flat_errors)
                await respond(send, exc.status, body)
            except ClientGone:
                pass
        elif any(p == path for _, p in self._routes):
            await respond(send, 405, b'{"detail":"Method Not Allowed"}')
        else:
            await respond(send, 404, b'{"detail":"Not Found"}')  # FastAPI's, in both

    # --- endpoints ----------------------------------------------------------------------------

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.completions("chat", scope, receive, send)

    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.completions("completions", scope, receive, send)

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        s = self.settings
        card = {
            "id": s.model,
            "object": "model",
            "created": int(time.time()),  # the time of the call, as both engines give it
            "owned_by": s.how.engine,
            # SGLang: the served name; vLLM: the model path (--model)
            "root": s.model if s.how.engine == "sglang" else (s.model_path or s.model),
            "parent": None,
            "max_model_len": s.context_length,
        }
        await respond(send, 200, json.dumps({"object": "list", "data": [card]}).encode())

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        how = self.settings.how
        if not self.ready:
            return await respond(send, 503, b"", EMPTY)
        if self.health_status != 200:
            return await respond(send, self.health_status, b"", EMPTY)
        if how.engine == "vllm" or (scope["path"] == "/health" and not how.health_generates):
            return await respond(send, 200, b"", EMPTY)
        status = 200 if await self._generate_probe() else 503
        await respond(send, status, b"", EMPTY)

    async def _generate_probe(self) -> bool:
        """SGLang's health_generate: submit one token, then look every second for any output
        that reached the server since the probe began."""
        how, scale = self.settings.how, self.settings.time_scale
        tic = time.monotonic()
        engine = self.completions.pick()
        req = engine.probe()
        try:
            while time.monotonic() < tic + how.health_check_timeout * scale:
                await asyncio.sleep(how.health_poll * scale)
                if any(e.last_output_at > tic for e in self.engines):
                    self.unhealthy = False
                    return True
            self.unhealthy = True
            return False
        finally:
            if req is not None:
                engine.abort(req)

    async def _version(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = {"version": f"{self.settings.how.version}+sim.{__version__}"}
        await respond(send, 200, json.dumps(body).encode())

    async def _ready(self, scope: Scope, receive: Receive, send: Send) -> None:
        ok = self.ready and not self.unhealthy and self.health_status == 200
        await respond(send, 200 if ok else 503, b"", EMPTY)

    async def _server_info(self, scope: Scope, receive: Receive, send: Send) -> None:
        preset = self.settings.preset
        states: list[dict[str, Any]] = []
        new = self.settings.how.version == "0.5.23"
        for engine in self.engines:  # one entry per DP rank
            state: dict[str, Any] = {"last_gen_throughput": engine.stats.gen_throughput}
            if new:  # the scheduler's real cap (0.5.10+)
                state["effective_max_running_requests_per_dp"] = preset.max_running
            accept = engine.stats.avg_spec_accept_length()
            if preset.spec_k and accept is not None:
                state["avg_spec_accept_length"] = accept  # a lifetime mean
            states.append(state)
        spec = bool(preset.spec_k)
        s = self.settings
        model_path = s.model_path or s.model
        info: dict[str, Any] = {
            "model_path": model_path,
            "tokenizer_path": s.tokenizer_path or model_path,
            "served_model_name": s.model,
            "max_running_requests": preset.max_running,
            # None unless given, as SGLang; the effective one is /v1/models' max_model_len
            "context_length": s.context_length_flag,
            "random_seed": self.random_seed,
            "speculative_algorithm": "EAGLE3" if spec else None,
            "speculative_num_steps": preset.spec_k if spec else None,
            "speculative_eagle_topk": preset.eagle_topk if spec else None,
            "speculative_num_draft_tokens": preset.draft_tokens if spec else None,
            "disable_overlap_schedule": not preset.overlap_schedule,
            "enable_metrics": self.settings.metrics,
            **self._graph_info(),
            # the SGLang version whose behaviour it copies (rules read it), marked as a sim
            "version": f"{s.how.version}+sim.{__version__}",
            "status": "ready",
            "max_total_num_tokens": s.context_length * 4,
            "max_req_input_len": s.context_length - 5,
            "internal_states": states,
            "sim": self._config(),
        }
        if new and self._startup_time is not None:
            info["startup_time"] = self._startup_time
        await respond(send, 200, json.dumps(info).encode())

    def _graph_info(self) -> dict[str, Any]:
        """The CUDA-graph limit as each version reports it: 0.5.3 resolved in place
        (``cuda_graph_max_bs``); 0.5.23 the flag as given (``cuda_graph_max_bs_decode``) and
        the resolved limit in ``cuda_graph_config`` (sg23 ``resolution_result``)."""
        p = self.settings.preset
        # (None: every batch captured, so the limit is the running cap)
        max_bs = p.max_running if p.cuda_graph_max_bs is None else p.cuda_graph_max_bs
        if self.settings.how.version != "0.5.23":
            return {"cuda_graph_max_bs": max_bs}
        decode = {"backend": "full", "max_bs": max_bs}
        return {
            "cuda_graph_max_bs_decode": self.settings.cuda_graph_flag,
            "cuda_graph_config": {"decode": decode},
        }

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = generate_latest(self.registry)
        await respond(send, 200, body, [(b"content-type", CONTENT_TYPE_LATEST.encode())])

    def _config(self) -> dict[str, Any]:
        s = self.settings
        live = [e.gauges() for e in self.engines]
        stats = [e.stats for e in self.engines]
        return {
            "preset": asdict(s.preset),
            "engine_kind": s.how.engine,
            "engine_version": s.how.version,
            "model": s.model,
            "time_scale": s.time_scale,
            "seed": self.engine.seed,
            "ready": self.ready,
            "tau": self.engine.tau,
            "tau_sampling": self.engine.tau_sampling,
            "fault": None if self.fault.is_none else self.fault.spec,
            "health_status": self.health_status,
            "keep_alive": s.keep_alive,
            "received": self.completions.received,
            "held": sum(e.held for e in self.engines),
            "health_generations": sum(x.health_generations for x in stats),
            "engine": {
                "running": sum(g.running for g in live),
                "queued": sum(g.queued for g in live),
                "context_tokens": sum(g.context_tokens for g in live),
                **{
                    k: sum(x.scheduling()[k] for x in stats)
                    for k in ("iterations", "spec_tokens", "spec_steps", "lag_resets")
                },
                "late_mean_ms": 1e3
                * sum(x.late_sum for x in stats)
                / max(1, sum(x.iterations for x in stats)),
                "late_max_ms": max(x.scheduling()["late_max_ms"] for x in stats),
                "aborted": sum(x.aborted for x in stats),
                "refused": sum(x.refused for x in stats),
                "abort_lag": max(
                    (x.abort_lag for x in stats if x.abort_lag is not None), default=None
                ),
                "abort_age": max(
                    (x.abort_age for x in stats if x.abort_age is not None), default=None
                ),
            },
        }

    async def _get_config(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, 200, json.dumps(self._config()).encode())

    async def _post_config(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = json.loads(await read_body(receive))
        except ValueError as exc:
            raise BadRequest(f"invalid JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        unknown = set(body) - {"tau", "tau_sampling", "fault", "health_status", "release"}
        if unknown:
            raise BadRequest(f"unknown settings: {sorted(unknown)}")
        release = body.get("release", False)
        if not isinstance(release, bool):
            raise BadRequest("release must be true or false")
        try:
            fault = parse_fault(body["fault"]) if "fault" in body else self.fault
            health = int(body.get("health_status", self.health_status))
            if not 200 <= health <= 599:
                raise ValueError("health_status must be an HTTP status")
            p = self.settings.preset
            tau = body.get("tau", self.engine.tau)
            tau_s = body.get("tau_sampling", self.engine.tau_sampling)
            for engine in self.engines:
                engine.set_tau(
                    p.tau if tau is None else float(tau),
                    p.tau_sampling if tau_s is None else float(tau_s),
                )
        except (ValueError, TypeError) as exc:
            raise BadRequest(str(exc)) from None
        self.fault, self.health_status = fault, health
        if release:  # every request held (hold_after) generates on
            for engine in self.engines:
                engine.release()
        await self._get_config(scope, receive, send)
