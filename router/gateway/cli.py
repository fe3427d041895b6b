"""``spec-router epp``: the router's decision as an Endpoint Picker for an Envoy-based gateway.

Settings come from the environment / SPEC_ROUTER_CONFIG as for ``serve`` (the pools, policy,
crossover, queue, API keys...); the flags choose where the gRPC services (ext_proc, access log,
health) and the router's HTTP endpoints listen. Needs the ``epp`` extra
(``pip install 'spec-router[epp]'``). See docs/gateway.md.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="spec-router epp", description=__doc__)
    parser.add_argument(
        "--host", default="127.0.0.1", help="address of the HTTP endpoints (default 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=int, default=9090, help="HTTP port: /health, /ready, /metrics, "
        "/router/status, /router/ui (0 picks a free one; default 9090)",
    )  # fmt: skip
    parser.add_argument(
        "--grpc-host", help="address of the gRPC services (default: the same as --host)"
    )
    parser.add_argument(
        "--grpc-port", type=int, default=9002, help="gRPC port: ext_proc, access log and "
        "health, which Envoy's EPP cluster points at (default 9002)",
    )  # fmt: skip
    parser.add_argument(
        "--lease-max-age", type=float, default=3600.0, help="seconds after which a request "
        "whose access-log record never came stops counting as in flight (default 3600)",
    )  # fmt: skip
    parser.add_argument(
        "--drain", type=float, default=3.0, help="seconds the EPP, stopping, reports "
        "NOT_SERVING and still serves, so that Envoy's health check takes it out first "
        "(default 3: the shipped Envoy config checks every second, out after two failures)",
    )  # fmt: skip
    parser.add_argument("--config", help="TOML settings file (same as SPEC_ROUTER_CONFIG)")
    args = parser.parse_args(argv)
    if args.lease_max_age <= 0:
        parser.error("--lease-max-age must be positive")
    if args.drain < 0:
        parser.error("--drain must not be negative")
    try:
        import grpc  # noqa: F401
        from envoy.service.ext_proc.v3 import external_processor_pb2  # noqa: F401
    except ImportError as exc:
        print(
            f"spec-router epp: {exc.name} is missing: pip install 'spec-router[epp]'",
            file=sys.stderr,
        )
        return 2
    import logging
    import os

    from router.settings import SettingsError, load_settings

    if args.config:
        os.environ["SPEC_ROUTER_CONFIG"] = args.config
    try:
        settings = load_settings()
        from router.gateway.app import EppApp, EppConfig

        app = EppApp(
            settings,
            EppConfig(
                grpc_host=args.grpc_host or args.host,
                grpc_port=args.grpc_port,
                lease_max_age=args.lease_max_age,
                drain=args.drain,
            ),
        )
    except SettingsError as exc:
        print(f"spec-router epp: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from router.serving import AnnouncingServer, bind_socket, socket_url, uvicorn_config

    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        print(f"spec-router epp: cannot listen on {args.host}:{args.port}: {exc.strerror}",
              file=sys.stderr)  # fmt: skip
        return 1
    config = uvicorn_config(app, log_level=settings.log_level, graceful_shutdown=2.0)
    # grpc.aio runs on asyncio's own loop; the HTTP side is off the request path
    config.loop = "asyncio"
    server = AnnouncingServer(config, socket_url(sock))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0 if server.started else 3
