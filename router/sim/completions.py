"""The completion endpoints: run a request on the engine and stream what it yields, or play
the fault it was asked for (see ``router.sim.faults``), the way the chosen engine does
(``router.sim.behaviour``):

- **response headers** of a stream go out before the request is queued (vLLM, SGLang 0.5.3) or
  with its first chunk (SGLang 0.5.23); a non-stream's come with the whole answer.
- **a full queue** (``--max-queued``): SGLang 0.5.23 answers a stream with 200, an error event
  and ``[DONE]``; 0.5.3 sends 200 and closes the connection; vLLM 0.34 a real 503; a
  non-stream gets 503 (SGLang's body flat).
- **a client that goes away**: vLLM aborts at once; SGLang aborts a started stream 2 s later,
  and before the first chunk or for a non-stream only at its next 4-s poll (a non-stream is
  also checked at every 50th token).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable

from router.asgi import Receive, Scope, Send
from router.sim.asgi import JSON, SimulatedReset, Watch, read_body, reset_connection, respond
from router.sim.behaviour import Behaviour
from router.sim.engine import Engine, EngineQueueFull, SimRequest
from router.sim.faults import NO_FAULT, Fault, FaultSpecError, parse_fault
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
    stream_error_event,
)

FAULT_HEADER = b"x-sim-fault"
SSE = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]


class Abort:
    """When the engine lets go of a request whose client left (see the module docstring)."""

    def __init__(self, engine: Engine, req: SimRequest, how: Behaviour, scale: float) -> None:
        self.engine, self.req = engine, req
        self.delay = how.abort_delay * scale
        self.poll = how.abort_poll * scale if how.abort_poll else None
        self.started = False  # a stream's response has started: Starlette watches for us
        self.gone = False
        self._gone_at = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def client_left(self) -> None:
        self.gone = True
        self._gone_at = time.monotonic()
        if self.poll is None:
            self.now()
        elif self.started:
            self._later()

    def now(self) -> None:
        """Abort: the client left (the lag since then is kept for /sim/config), or the
        handler ended (a no-op once the request finished)."""
        if self.gone and not self.req.closed:
            stats = self.engine.stats
            stats.abort_lag = time.monotonic() - self._gone_at
            stats.abort_age = self.engine.age(self.req)
        self.engine.abort(self.req)

    def stream_started(self) -> None:
        self.started = True
        if self.gone:
            self._later()

    def _later(self) -> None:
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.delay, self.now)

    async def next_tokens(self) -> int:
        """The request's next tokens; before a stream starts (and for non-streams) the
        handler wakes every ``poll`` seconds without output to look for a disconnect."""
        if self.poll is None or self.started:
            return await self.req.next_tokens()
        while True:
            try:
                return await asyncio.wait_for(self.req.next_tokens(), self.poll)
            except TimeoutError:
                if self.gone:
                    self.now()
                    return 0

    def checkpoint(self) -> bool:
        """A non-stream's interim output: a disconnected client is noticed here."""
        if self.gone and self.poll is not None:
            self.now()
            return True
        return False

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


class Completions:
    """``await completions(kind, scope, receive, send)`` serves one completion request."""

    def __init__(
        self,
        engines: list[Engine],
        limits: Limits,
        how: Behaviour,
        ready: Callable[[], bool],
        fault: Callable[[], Fault],
        rng: random.Random,
    ) -> None:
        self.engines = engines
        self.limits = limits
        self.how = how
        self._ready = ready
        self._fault = fault  # the server-wide fault, when the request names none
        self._rng = rng
        self._preset = (b"x-sim-preset", engines[0].preset.name.encode())
        self._turn = 0
        self.received = 0  # completion requests that reached the engine's handler

    def _error(self, status: int, message: str) -> bytes:
        return error_body(status, message, flat=self.how.flat_errors)

    def pick(self) -> Engine:
        """Data-parallel ranks take requests in turn (SGLang's default round robin)."""
        engine = self.engines[self._turn % len(self.engines)]
        self._turn += 1
        return engine

    async def __call__(self, kind: Kind, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._ready():
            return await respond(send, 503, self._error(503, "the engine is still starting"))
        raw = await read_body(receive)
        self.received += 1
        fault = self._fault()
        for name, value in scope["headers"]:
            if name == FAULT_HEADER:
                try:
                    fault = parse_fault(value.decode("latin-1"))
                except FaultSpecError as exc:
                    raise BadRequest(f"x-sim-fault: {exc}") from None
        if not fault.fires(self._rng):
            fault = NO_FAULT
        watch = Watch(receive)
        abort: Abort | None = None
        try:
            if fault.status is not None:
                retry = [(b"retry-after", b"1")] if fault.status in (429, 503) else []
                body = self._error(fault.status, f"injected fault: {fault.spec}")
                return await respond(send, fault.status, body, JSON + retry)
            if fault.close:
                return await self._reset(send, watch.gone)
            if fault.hang_before_headers is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watch.gone.wait(), fault.hang_before_headers)
                if watch.gone.is_set():
                    return
            job = parse_job(kind, raw, self.limits)
            engine = self.pick()
            try:
                req = engine.submit(
                    job.prompt_tokens,
                    job.max_tokens,
                    temperature=job.temperature,
                    seed=job.seed,
                    priority=job.priority,
                    streaming=job.stream,
                    hold_after=fault.hold_after,
                )
            except EngineQueueFull as exc:
                return await self._overloaded(job, send, str(exc))
            abort = Abort(engine, req, self.how, engine.time_scale)
            watch.on_gone = abort.client_left
            if watch.gone.is_set():
                abort.client_left()
            if job.stream:
                await self._stream(job, abort, send, fault, watch.gone)
            else:
                await self._whole(job, abort, send, fault, watch.gone)
        finally:
            watch.task.cancel()
            if abort is not None:
                abort.cancel()
                abort.now()

    async def _overloaded(self, job: Job, send: Send, message: str) -> None:
        how = self.how
        if not job.stream or how.overload == "status":
            if how.engine == "vllm":
                message = (
                    "The engine is currently busy and cannot accept new requests. "
                    "Please retry on another instance."
                )
            return await respond(send, 503, self._error(503, message), JSON)
        await send({"type": "http.response.start", "status": 200, "headers": [*SSE, self._preset]})
        if how.overload == "close":
            # 0.5.3: the HTTPException escapes a response that has started; uvicorn closes
            raise SimulatedReset
        fmt = StreamFormat(job, new_id(), int(time.time()))
        body = stream_error_event(503, message, "SERVICE_UNAVAILABLE") + fmt.usage_and_done(0)
        await send({"type": "http.response.body", "body": body.encode()})

    async def _reset(self, send: Send, gone: asyncio.Event) -> None:
        reset_connection(send)
        await gone.wait()  # returning earlier would make uvicorn complain about the response

    async def _fault_after(
        self, abort: Abort, send: Send, fault: Fault, gone: asyncio.Event
    ) -> None:
        abort.engine.abort(abort.req)
        if fault.reset_after is not None:
            await self._reset(send, gone)
        else:
            await gone.wait()  # hang: the connection stays open and silent

    async def _stream(
        self, job: Job, abort: Abort, send: Send, fault: Fault, gone: asyncio.Event
    ) -> None:
        start = {"type": "http.response.start", "status": 200, "headers": [*SSE, self._preset]}
        if self.how.early_stream_headers:
            await send(start)
            abort.stream_started()
        fmt = StreamFormat(job, new_id(), int(time.time()))
        limit = fault.hang_after if fault.hang_after is not None else fault.reset_after
        sent = 0
        while limit is None or sent < limit:
            n = await abort.next_tokens()
            if n == 0:
                return  # aborted: the client is gone
            if limit is not None:
                n = min(n, limit - sent)
            out = fmt.role() if sent == 0 and job.kind == "chat" else ""
            out += fmt.tokens(sent, n)
            if sent == 0 and not abort.started:
                await send(start)  # SGLang 0.5.23: the headers wait for the first chunk
                abort.stream_started()
            sent += n
            if sent == job.max_tokens:
                out += fmt.end(sent)
                await send({"type": "http.response.body", "body": out.encode()})
                return
            await send({"type": "http.response.body", "body": out.encode(), "more_body": True})
        if not abort.started:
            await send(start)
            abort.stream_started()
        await self._fault_after(abort, send, fault, gone)

    async def _whole(
        self, job: Job, abort: Abort, send: Send, fault: Fault, gone: asyncio.Event
    ) -> None:
        limit = fault.hang_after if fault.hang_after is not None else fault.reset_after
        every = self.how.interim_every
        got = 0
        while got < job.max_tokens:
            if limit is not None and got >= limit:
                return await self._fault_after(abort, send, fault, gone)
            n = await abort.next_tokens()
            if n == 0:
                return
            if (got + n) // every > got // every and abort.checkpoint():
                return
            got += n
        body = full_response(job, new_id(), int(time.time()), got)
        await respond(send, 200, body, [*JSON, self._preset])
