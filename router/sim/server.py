"""The HTTP face of a simulated engine: a plain ASGI app (no framework on the token path).

Per streamed token batch the work is one string join and one ``send``; a raw ASGI app keeps
that cheap enough for hundreds of concurrent streams on one core (measured: 17,000 SSE events/s
over 256 streams at 40% of a core). Completions are served by ``router.sim.completions``; this
module routes, runs the engine in the lifespan, and serves health, models, server info,
metrics and the runtime knobs (``/sim/config``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from router import __version__
from router.asgi import Receive, Scope, Send
from router.sim.asgi import ClientGone, DropSimulatedReset, read_body, respond
from router.sim.completions import Completions
from router.sim.engine import Engine
from router.sim.faults import NO_FAULT, Fault, parse_fault
from router.sim.metrics import SglangCollector
from router.sim.model import Preset
from router.sim.protocol import BadRequest, Limits, error_body


def _report_engine_death(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logging.getLogger("uvicorn.error").error("engine loop died", exc_info=task.exception())


@dataclass(frozen=True)
class SimSettings:
    preset: Preset
    model: str = "default"
    time_scale: float = 1.0
    seed: int | None = None
    startup_delay: float = 0.0  # model seconds, stretched by time_scale like everything else
    default_max_tokens: int = 128
    context_length: int = 131072
    api_key: str | None = None  # like SGLang's --api-key: /v1/* needs `Bearer <key>`
    strict_model: bool = False


class SimServer:
    """ASGI app: ``SimServer(settings)`` is served as is by uvicorn."""

    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.engine = Engine(settings.preset, time_scale=settings.time_scale, seed=settings.seed)
        self.limits = Limits(
            settings.model,
            settings.default_max_tokens,
            settings.context_length,
            settings.strict_model,
        )
        self._auth = None if settings.api_key is None else f"Bearer {settings.api_key}".encode()
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(
            SglangCollector(settings.model, self.engine.stats, self.engine.gauges)
        )
        self.fault: Fault = NO_FAULT
        self.health_status = 200
        self.completions = Completions(
            self.engine,
            self.limits,
            lambda: self.ready,
            lambda: self.fault,
            random.Random(f"{self.engine.seed}:faults"),
        )
        self._ready_at = 0.0
        self._started = time.time()
        self._task: asyncio.Task[None] | None = None
        self._routes: dict[tuple[str, str], Callable[[Scope, Receive, Send], Awaitable[None]]] = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completions,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/health_generate"): self._health,
            ("GET", "/server_info"): self._server_info,
            ("GET", "/get_server_info"): self._server_info,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/sim/config"): self._get_config,
            ("POST", "/sim/config"): self._post_config,
        }
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
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                delay = self.settings.startup_delay * self.settings.time_scale
                self._ready_at = time.monotonic() + delay
                self._task = asyncio.get_running_loop().create_task(self.engine.run())
                self._task.add_done_callback(_report_engine_death)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._task is not None:
                    self._task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._task
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self._routes.get((scope["method"], scope["path"]))
        if self._auth is not None and scope["path"].startswith("/v1/"):
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if given != self._auth:
                await respond(send, 401, error_body(401, "invalid API key"))
                return
        if handler is not None:
            try:
                await handler(scope, receive, send)
            except BadRequest as exc:
                await respond(send, exc.status, error_body(exc.status, exc.message, exc.param))
            except ClientGone:
                pass
        elif any(path == scope["path"] for _, path in self._routes):
            await respond(send, 405, error_body(405, f"{scope['method']} not allowed here"))
        else:
            await respond(send, 404, error_body(404, f"no route {scope['path']}"))

    # --- endpoints ----------------------------------------------------------------------------

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.completions("chat", scope, receive, send)

    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.completions("completions", scope, receive, send)

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        card = {
            "id": self.settings.model,
            "object": "model",
            "created": int(self._started),
            "owned_by": "sglang",
            "root": self.settings.model,
            "parent": None,
            "max_model_len": self.settings.context_length,
        }
        await respond(send, 200, json.dumps({"object": "list", "data": [card]}).encode())

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.ready:
            await respond(send, 503, error_body(503, "the engine is still starting"))
        elif self.health_status != 200:
            await respond(send, self.health_status, error_body(self.health_status, "unhealthy"))
        else:
            await respond(send, 200, b"", [])

    async def _server_info(self, scope: Scope, receive: Receive, send: Send) -> None:
        preset, stats = self.settings.preset, self.engine.stats
        state: dict[str, Any] = {"last_gen_throughput": stats.gen_throughput}
        info: dict[str, Any] = {
            "model_path": self.settings.model,
            "served_model_name": self.settings.model,
            "max_running_requests": preset.max_running,
            "context_length": self.settings.context_length,
            "speculative_algorithm": "EAGLE3" if preset.spec_k else None,
            "speculative_num_draft_tokens": preset.spec_k + 1 if preset.spec_k else None,
            "version": f"{__version__}-sim",
        }
        if preset.spec_k:
            # The realised mean so far; the configured tau before anything was decoded.
            accept = stats.avg_spec_accept_length() or self.engine.tau
            state["avg_spec_accept_length"] = info["avg_spec_accept_length"] = accept
        info["internal_states"] = [state]
        info["sim"] = self._config()
        await respond(send, 200, json.dumps(info).encode())

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = generate_latest(self.registry)
        await respond(send, 200, body, [(b"content-type", CONTENT_TYPE_LATEST.encode())])

    def _config(self) -> dict[str, Any]:
        s = self.settings
        return {
            "preset": asdict(s.preset),
            "model": s.model,
            "time_scale": s.time_scale,
            "seed": self.engine.seed,
            "ready": self.ready,
            "tau": self.engine.tau,
            "tau_sampling": self.engine.tau_sampling,
            "fault": None if self.fault.is_none else self.fault.spec,
            "health_status": self.health_status,
            "engine": {**asdict(self.engine.gauges()), **self.engine.stats.scheduling()},
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
        unknown = set(body) - {"tau", "tau_sampling", "fault", "health_status"}
        if unknown:
            raise BadRequest(f"unknown settings: {sorted(unknown)}")
        try:
            fault = parse_fault(body["fault"]) if "fault" in body else self.fault
            health = int(body.get("health_status", self.health_status))
            if not 200 <= health <= 599:
                raise ValueError("health_status must be an HTTP status")
            p = self.settings.preset
            tau = body.get("tau", self.engine.tau)
            tau_s = body.get("tau_sampling", self.engine.tau_sampling)
            self.engine.set_tau(
                p.tau if tau is None else float(tau),
                p.tau_sampling if tau_s is None else float(tau_s),
            )
        except (ValueError, TypeError) as exc:
            raise BadRequest(str(exc)) from None
        self.fault, self.health_status = fault, health
        await self._get_config(scope, receive, send)
