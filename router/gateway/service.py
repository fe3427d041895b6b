"""The EPP's gRPC server: ext_proc, Envoy's access-log service and gRPC health, on one port.

One ``grpc.aio`` server in the router's event loop, so the decisions, the leases and the HTTP
endpoints share one thread and one set of counts. Envoy's health check of the EPP cluster asks
for ``envoy.service.ext_proc.v3.ExternalProcessor``; it is SERVING while the process serves and
NOT_SERVING from the moment it starts to stop, for a drain period before the port closes, so
Envoy fails open to its fallback with no request caught by the stop. Each stream's gRPC peer
names the gateway connection it came over (``router.gateway.connections``): when a
connection's access-log stream ends and it is not heard from again within ``gone_grace``
seconds, the leases of the requests it asked for are let go.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from router.gateway.exchange import Exchange
from router.gateway.messages import EXT_PROC_SERVICE
from router.gateway.picker import Picker
from router.gateway.records import ending

log = logging.getLogger("spec_router.gateway")

# The largest message Envoy sends: a body chunk of up to its connection buffer (1 MiB by
# default; a 6 MB body came as 1,048,576-byte messages), under gRPC's default of 4 MiB.
MAX_MESSAGE = 8 << 20


class ExternalProcessor(ep_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, picker: Picker) -> None:
        self.picker = picker
        self.streams = 0  # ext_proc streams so far (one per request Envoy asked about)

    async def Process(  # noqa: N802 (the service's method name)
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        self.streams += 1
        peer = context.peer()
        self.picker.connections.heard(peer)
        exchange = Exchange(self.picker, peer)
        while True:
            message = await context.read()
            if message is grpc.aio.EOF:
                return
            for answer in await exchange.on(message):
                await context.write(answer)
            if exchange.finished:
                return


class AccessLog(als_pb2_grpc.AccessLogServiceServicer):  # type: ignore[misc]
    """Envoy's access-log stream: each HTTP record ends its request's lease."""

    def __init__(self, picker: Picker, gone_grace: float) -> None:
        self.picker = picker
        self.gone_grace = gone_grace
        self.streams = 0
        self.records = 0

    async def StreamAccessLogs(  # noqa: N802
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        self.streams += 1
        peer = context.peer()
        connections = self.picker.connections
        connections.log_opened(peer)
        try:
            async for message in request_iterator:
                for entry in message.http_logs.log_entry:
                    self.records += 1
                    try:
                        self.picker.ended(ending(entry))
                    except Exception:  # one bad record must not end the stream (and the rest)
                        log.exception("access-log record not understood")
        finally:  # (EOF, or cancelled: the connection went away)
            token = connections.log_closed(peer)
            if token is not None:
                loop = asyncio.get_running_loop()
                loop.call_later(self.gone_grace, self._quiet, peer, token)
        return als_pb2.StreamAccessLogsResponse()

    def _quiet(self, peer: str, token: int) -> None:
        if self.picker.connections.gone(peer, token):
            self.picker.gateway_gone(peer)


class GrpcServer:
    """The three services on one port; ``start`` binds, ``stop`` says NOT_SERVING then stops."""

    def __init__(self, picker: Picker, host: str, port: int, gone_grace: float = 5.0) -> None:
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.max_send_message_length", MAX_MESSAGE),
                # gRPC sets SO_REUSEPORT by default: a second EPP given the same port would
                # bind it too and take some of the gateway's connections (its leases and
                # access-log records split between two processes). Refused instead.
                ("grpc.so_reuseport", 0),
            ]
        )
        self.processor = ExternalProcessor(picker)
        self.access_log = AccessLog(picker, gone_grace)
        self.health = health_aio.HealthServicer()
        ep_grpc.add_ExternalProcessorServicer_to_server(self.processor, self.server)
        als_pb2_grpc.add_AccessLogServiceServicer_to_server(self.access_log, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.host = host
        try:
            self.port = self.server.add_insecure_port(f"{host}:{port}")
        except RuntimeError:  # (grpcio's "Failed to bind": in use, or not an address here)
            self.port = 0
        if self.port == 0:
            raise OSError(
                f"cannot listen on {host}:{port} for gRPC (in use by another process, "
                "or not an address of this host)"
            )

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    async def start(self) -> None:
        await self.server.start()
        for service in ("", EXT_PROC_SERVICE):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, drain: float, grace: float) -> None:
        """NOT_SERVING, still serving for ``drain`` seconds (while Envoy's health check takes
        the EPP out), then stop, giving open streams ``grace`` seconds."""
        for service in ("", EXT_PROC_SERVICE):
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.processor.streams and drain > 0:  # (nobody to tell, if Envoy never came)
            await asyncio.sleep(drain)
        await self.server.stop(grace)

    def status(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "ext_proc_streams": self.processor.streams,
            "access_log_streams": self.access_log.streams,
            "access_log_records": self.access_log.records,
        }
