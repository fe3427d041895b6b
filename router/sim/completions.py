"""The completion endpoints: run a request on the engine and stream what it yields, or play
the fault it was asked for (see ``router.sim.faults``).

A watcher task waits for the client's ``http.disconnect`` and aborts the engine request at
once, so ``sglang:num_running_reqs`` drops as soon as a client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
from collections.abc import Callable

from router.asgi import Receive, Scope, Send
from router.sim.asgi import JSON, Watch, read_body, reset_connection, respond
from router.sim.engine import Engine, SimRequest
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
)

FAULT_HEADER = b"x-sim-fault"


class Completions:
    """``await completions(kind, scope, receive, send)`` serves one completion request."""

    def __init__(
        self,
        engine: Engine,
        limits: Limits,
        ready: Callable[[], bool],
        fault: Callable[[], Fault],
        rng: random.Random,
    ) -> None:
        self.engine = engine
        self.limits = limits
        self._ready = ready
        self._fault = fault  # the server-wide fault, when the request names none
        self._rng = rng
        self._preset = (b"x-sim-preset", engine.preset.name.encode())

    async def __call__(self, kind: Kind, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._ready():
            return await respond(send, 503, error_body(503, "the engine is still starting"))
        raw = await read_body(receive)
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
            self._preset,
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
        await respond(send, 200, body, [*JSON, self._preset])
