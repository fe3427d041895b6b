"""Refuses ``uvicorn router.app:app --workers N`` (N > 1) once, in uvicorn's own process.

uvicorn's workers know nothing of each other, so each would route with its own in-flight counts
(``spec-router serve --workers N`` shares one). uvicorn imports the app only in its workers,
after its own process has bound the socket and said "Uvicorn running on ...", and it exits 0
when they fail. So the check runs where uvicorn cannot skip it: the interpreter's start-up, from
``spec_router_uvicorn.pth`` (installed beside the package by setup.py), whose one line imports
this module only when the command line names ``router.app:app``; nothing else, and no other
program, is affected. It prints one line and exits 2 before uvicorn has read its options. Where
the .pth is not installed (the package used from a source tree on ``PYTHONPATH``) the app's own
import refuses in each worker instead (``router.workers.refuse_uvicorn_workers``). A leaf: it
imports nothing of the router.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

APP = "router.app:app"


def uvicorn_workers(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """How many workers the uvicorn command line ``argv`` (its program first) asks for; 1 when
    it is not uvicorn, or runs with ``--reload``."""
    if not argv or "--reload" in argv:
        return 1
    program = os.path.basename(argv[0])
    if program != "uvicorn" and not argv[0].endswith(os.path.join("uvicorn", "__main__.py")):
        return 1
    value = environ.get("WEB_CONCURRENCY", "1")
    for i, arg in enumerate(argv):
        if arg == "--workers" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--workers="):
            value = arg.split("=", 1)[1]
    return int(value) if value.isdigit() else 1


def uvicorn_argv(orig_argv: Sequence[str]) -> list[str] | None:
    """uvicorn's command line (its program first) when the interpreter's own command line
    (``sys.orig_argv``) runs uvicorn, as a script or with ``-m``; else None."""
    args = list(orig_argv[1:])
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-m":
            found = i + 1 < len(args) and args[i + 1] == "uvicorn"
            return ["uvicorn", *args[i + 2 :]] if found else None
        if arg in ("-c", "-"):
            return None
        if not arg.startswith("-"):
            return args[i:] if os.path.basename(arg) == "uvicorn" else None
        i += 2 if arg in ("-X", "-W") else 1  # (the interpreter's options with a value)
    return None


def refusal(workers: int) -> str:
    return (
        f"spec-router: refusing to run under `uvicorn --workers {workers}`: each worker would "
        "route with its own in-flight counts. Use `spec-router serve --workers N` (one shared "
        "count)."
    )


def check() -> None:
    """Called from the .pth line: exit 2 with one line when this process is uvicorn asked to
    run the router with several workers."""
    argv = uvicorn_argv(sys.orig_argv)
    if argv is None or APP not in argv:
        return
    workers = uvicorn_workers(argv, os.environ)
    if workers > 1:
        print(refusal(workers), file=sys.stderr, flush=True)
        os._exit(2)  # (during the interpreter's start-up, SystemExit would be a fatal error)
