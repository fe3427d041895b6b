"""Command line: a thin dispatcher over the subcommands' own modules.

Each subcommand module exposes ``main(argv) -> int`` with its own argparse parser, so that
``python -m router.sim`` and ``spec-router sim`` share one definition and importing the CLI
does not import every subsystem.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("router.process.serve", "run the router (same as `uvicorn router.app:app`)"),
    "sim": ("router.sim.cli", "run a simulated SGLang-like engine"),
    "demo": (
        "router.tools.demo",
        "start sims and the router, ramp load, print and plot the comparison",
    ),
    "calibrate": ("router.calibrate", "measure both pools and write a crossover table"),
    "replay": ("router.tools.replay", "replay a trace or synthetic traffic open-loop; goodput"),
    "fleet": (
        "router.tools.fleet.cli",
        "N sims that switch mode, a router, its planner and a day of traffic; goodput per hour",
    ),
    "doctor": (
        "router.tools.doctor",
        "check the engines' settings against what makes speculation lose or the router misjudge",
    ),
    "epp": (
        "router.gateway.cli",
        "the decision as an Endpoint Picker (ext_proc) behind an Envoy-based gateway",
    ),
}


def _usage() -> str:
    lines = ["usage: spec-router <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "`spec-router <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if args[0] in ("-V", "--version"):
        from router import __version__

        print(f"spec-router {__version__}")
        return 0
    entry = SUBCOMMANDS.get(args[0])
    if entry is None:
        print(f"spec-router: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(entry[0])
    result: int = module.main(args[1:])
    return result
