"""The HTTP face of a simulated engine: a plain ASGI app (no framework on the token path).

Per streamed token batch the work is one string join and one ``send``; a raw ASGI app keeps
that cheap enough for hundreds of concurrent streams on one core. Each completion runs as an
``Engine`` request; a watcher task waits for the client's ``http.disconnect`` and aborts the
request at once, so ``sglang:num_running_reqs`` drops as soon as a client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
import socket
import struct
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from router import __version__
from router.sim.engine import Engine, SimRequest
from router.sim.faults import NO_FAULT, Fault, FaultSpecError, parse_fault
from router.sim.metrics import SglangCollector
from router.sim.model import Preset
from router.sim.protocol import (
    BadRequest,
    Job,
    Kind,
    Limits,
    StreamFormat,
    error_body,
    full_response,
    new_id,
    parse_job,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

FAULT_HEADER = b"x-sim-fault"
MAX_BODY = 16 * 1024 * 1024
JSON = [(b"content-type", b"application/json")]


@dataclass(frozen=True)
class SimSettings:
    preset: Preset
    model: str = "default"
    time_scale: float = 1.0
    seed: int | None = None
    startup_delay: float = 0.0  # model seconds, stretched by time_scale like everything else
    default_max_tokens: int = 128
    context_length: int = 131072


class ClientGone(Exception):
    pass


class _Watch:
    """Waits for the client's ``http.disconnect`` (read after the body), then sets ``gone``
    and calls ``on_gone``."""

    def __init__(self, receive: Receive) -> None:
        self.gone = asyncio.Event()
        self.on_gone: Callable[[], None] | None = None
        self.task = asyncio.get_running_loop().create_task(self._run(receive))

    async def _run(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone.set()
        if self.on_gone is not None:
            self.on_gone()


class SimulatedReset(Exception):
    """Raised to make the server drop a connection when its transport is out of reach."""


class _DropSimulatedReset(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, SimulatedReset)


def _report_engine_death(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logging.getLogger("uvicorn.error").error("engine loop died", exc_info=task.exception())


def reset_connection(send: Send) -> None:
    """Drop the client's TCP connection with an RST, mid-body if need be.

    uvicorn does not put the transport in the scope; its ``send`` is a bound method of the
    request cycle that holds it. With ``SO_LINGER`` 0, ``abort()`` sends RST, not FIN. Failing
    that, raising makes uvicorn close the connection (a FIN, still an incomplete body).
    """
    transport: Any = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None or not (
        hasattr(transport, "abort") and hasattr(transport, "get_extra_info")
    ):
        raise SimulatedReset  # uvloop's transports are not asyncio.Transport subclasses
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    head = [*(JSON if headers is None else headers), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


async def read_body(receive: Receive) -> bytes:
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        part = message.get("body", b"")
        size += len(part)
        if size > MAX_BODY:
            raise BadRequest("request body too large")
        parts.append(part)
        if not message.get("more_body", False):
            return b"".join(parts)


class SimServer:
    """ASGI app: ``SimServer(settings)`` is served as is by uvicorn."""

    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.engine = Engine(settings.preset, time_scale=settings.time_scale, seed=settings.seed)
        self.limits = Limits(settings.model, settings.default_max_tokens, settings.context_length)
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(
            SglangCollector(settings.model, self.engine.stats, self.engine.gauges)
        )
        self.fault: Fault = NO_FAULT
        self.health_status = 200
        self._fault_rng = random.Random(f"{self.engine.seed}:faults")
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
        logging.getLogger("uvicorn.error").addFilter(_DropSimulatedReset())

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
        if handler is not None:
            try:
                await handler(scope, receive, send)
            except BadRequest as exc:
                await respond(send, 400, error_body(400, exc.message, exc.param))
            except ClientGone:
                pass
        elif any(path == scope["path"] for _, path in self._routes):
            await respond(send, 405, error_body(405, f"{scope['method']} not allowed here"))
        else:
            await respond(send, 404, error_body(404, f"no route {scope['path']}"))

    # --- completions --------------------------------------------------------------------------

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._completion("chat", scope, receive, send)

    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._completion("completions", scope, receive, send)

    async def _completion(self, kind: Kind, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.ready:
            return await respond(send, 503, error_body(503, "the engine is still starting"))
        raw = await read_body(receive)
        fault = self.fault
        for name, value in scope["headers"]:
            if name == FAULT_HEADER:
                try:
                    fault = parse_fault(value.decode("latin-1"))
                except FaultSpecError as exc:
                    raise BadRequest(f"x-sim-fault: {exc}") from None
        if not fault.fires(self._fault_rng):
            fault = NO_FAULT
        watch = _Watch(receive)
        req: SimRequest | None = None
        try:
            if fault.status is not None:
                retry = [(b"retry-after", b"1")] if fault.status in (429, 503) else []
                body = error_body(fault.status, f"injected fault: {fault.spec}")
                return await respond(send, fault.status, body, JSON + retry)
            if fault.close:
                return await self._reset(send, watch.gone)
            if fault.hang_before_headers is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watch.gone.wait(), fault.hang_before_headers)
                if watch.gone.is_set():
                    return
            job = parse_job(kind, raw, self.limits)
            req = self.engine.submit(
                job.prompt_tokens, job.max_tokens, temperature=job.temperature, seed=job.seed
            )
            watch.on_gone = functools.partial(self.engine.abort, req)
            if watch.gone.is_set():
                return
            if job.stream:
                await self._stream(job, req, send, fault, watch.gone)
            else:
                await self._whole(job, req, send, fault, watch.gone)
        finally:
            watch.task.cancel()
            if req is not None:
                self.engine.abort(req)  # a no-op once it has finished

    async def _reset(self, send: Send, gone: asyncio.Event) -> None:
        reset_connection(send)
        await gone.wait()  # returning earlier would make uvicorn complain about the response

    async def _fault_after(
        self, req: SimRequest, send: Send, fault: Fault, gone: asyncio.Event
    ) -> None:
        self.engine.abort(req)
        if fault.reset_after is not None:
            await self._reset(send, gone)
        else:
            await gone.wait()  # hang: the connection stays open and silent

    async def _stream(
        self, job: Job, req: SimRequest, send: Send, fault: Fault, gone: asyncio.Event
    ) -> None:
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-sim-preset", self.settings.preset.name.encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        fmt = StreamFormat(job, new_id(), int(time.time()))
        limit = fault.hang_after if fault.hang_after is not None else fault.reset_after
        sent = 0
        while limit is None or sent < limit:
            n = await req.next_tokens()
            if n == 0:
                return  # aborted: the client is gone
            if limit is not None:
                n = min(n, limit - sent)
            out = fmt.role() if sent == 0 and job.kind == "chat" else ""
            out += fmt.tokens(sent, n)
            sent += n
            if sent == job.max_tokens:
                out += fmt.end(sent)
                await send({"type": "http.response.body", "body": out.encode()})
                return
            await send({"type": "http.response.body", "body": out.encode(), "more_body": True})
        await self._fault_after(req, send, fault, gone)

    async def _whole(
        self, job: Job, req: SimRequest, send: Send, fault: Fault, gone: asyncio.Event
    ) -> None:
        limit = fault.hang_after if fault.hang_after is not None else fault.reset_after
        got = 0
        while got < job.max_tokens:
            if limit is not None and got >= limit:
                return await self._fault_after(req, send, fault, gone)
            n = await req.next_tokens()
            if n == 0:
                return
            got += n
        body = full_response(job, new_id(), int(time.time()), got)
        await respond(
            send, 200, body, JSON + [(b"x-sim-preset", self.settings.preset.name.encode())]
        )

    # --- everything else ----------------------------------------------------------------------

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
