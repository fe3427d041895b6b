"""``spec-router serve``: the router under uvicorn, configured like ``uvicorn router.app:app``.

Settings come from the environment / SPEC_ROUTER_CONFIG as always; the flags here only choose
where to listen and how loudly to log. The socket, the server and the announced URL are
``router.serving``'s; ``--workers N`` hands over to ``router.process.supervisor``.
"""

from __future__ import annotations

import argparse
import logging
import sys

from router.serving import run


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="spec-router serve", description=__doc__)
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=int, default=8000, help="port (0 picks a free one; default 8000)"
    )
    parser.add_argument("--config", help="TOML settings file (same as SPEC_ROUTER_CONFIG)")
    parser.add_argument(
        "--http",
        choices=["httptools", "h11"],
        default="httptools",
        help="uvicorn's HTTP implementation (default httptools, which the router's fast paths "
        "need; h11 is pure Python, for debugging)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="router processes on the one socket, routing with one shared in-flight count "
        "(router/process/supervisor.py; default 1: this process serves, as before)",
    )
    args = parser.parse_args(argv)
    # (here, not at the top: ``--help`` and a bad flag answer without loading the settings,
    # whose pydantic-settings import is most of the time)
    from router.settings import SettingsError, load_settings

    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.config:
        import os

        os.environ["SPEC_ROUTER_CONFIG"] = args.config
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"spec-router: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.workers > 1:
        from router.process.supervisor import serve

        return serve(settings, args.host, args.port, args.workers, settings.log_level, args.http)
    from router.app import RouterApp

    try:
        app = RouterApp(settings)
    except SettingsError as exc:
        print(f"spec-router: {exc}", file=sys.stderr)
        return 2
    return run(
        app,
        args.host,
        args.port,
        log_level=settings.log_level,
        http=args.http,
        request_timeout=settings.request_timeout,
        keep_alive=settings.client_keep_alive,
    )
