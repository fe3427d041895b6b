"""Which of the router's pure modules run compiled (mypyc), and the guard against stale builds.

``setup.py`` compiles the modules in ``MODULES`` with mypyc when it can (the same typed source,
compiled: the ``slo`` decision and the surfaces two to seven times faster, see
bench/results/compiled.md) and writes ``_compiled.json`` beside this file: the SHA-256 of each
compiled module's source and of each router module they import (mypyc copies ``Final`` constants
and relies on the types of what it imports). ``router/__init__.py`` calls ``guard()`` before any
of them is imported:

- the recorded sources all match: the extension modules are used;
- one of them was edited since the build (``make venv`` does not rebuild on every edit): every
  compiled module is imported from its ``.py`` instead, and a warning says so once. All of them,
  not only the edited one: compiled modules call each other's native code directly, so a mix
  would run the old code of the one loaded pure;
- ``SPEC_ROUTER_PURE=1`` in the environment: the same, without the warning (a build made with it
  compiles nothing).

This module imports nothing of the router and nothing outside the standard library: it runs
first, and ``setup.py`` loads it by path to read ``MODULES`` and to write the record.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

# What is compiled: the decision's hot path (policy, its capacities, the snapshot and the
# prediction it reads, the decider that builds them) and the in-flight accounting it reads on
# every request; the surfaces (capacity.surface_steps) are computed here too. Then the request's
# and each chunk's path below the protocols (session 14, bench/results/fast-path.md): the
# request's fields and forwarded headers, its Outcome, the upstream client (its connection's
# socket callbacks relay every chunk), the SSE tap, the client-side sinks and the lazy timers.
# (mypyc's slice of bytes fails where the start passes the end, which Python makes empty: no
# such slice in these modules; router/upstream/stream.py ``SseTap.plain`` says how.)
MODULES: tuple[str, ...] = (
    "router.decide.policy",
    "router.decide.capacity",
    "router.decide.snapshot",
    "router.decide.predict",
    "router.forward.decider",
    "router.account.inflight",
    "router.forward.request",
    "router.account.outcome",
    "router.upstream.client",
    "router.upstream.stream",
    "router.fastpath.responder",
    "router.timers",
)
# mypyc's shared library for the group (group_name "router._native"), inside the package
SHARED_LIB = "router._native__mypyc"
RECORD = "_compiled.json"
PURE_ENV = "SPEC_ROUTER_PURE"

_PACKAGE = Path(__file__).resolve().parent
log = logging.getLogger("router")


def source_path(module: str, package_dir: Path = _PACKAGE) -> Path:
    """``router.decide.policy`` -> ``<package_dir>/decide/policy.py``."""
    return package_dir.joinpath(*module.split(".")[1:]).with_suffix(".py")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _imported(path: Path) -> set[str]:
    """The router modules a source file imports (``from router.x import y`` names ``router.x``,
    or ``router.x.y`` when that is a module)."""
    import ast  # only at build time: the import-time guard does not parse

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        found.update(n for n in names if n == "router" or n.startswith("router."))
    return found


def record(package_dir: Path, modules: Sequence[str] = MODULES) -> dict[str, Any]:
    """What ``setup.py`` writes to ``_compiled.json`` after a build: each compiled module's
    source digest and those of the router modules they import (paths relative to the package)."""
    files: set[Path] = set()
    for module in modules:
        src = source_path(module, package_dir)
        files.add(src)
        for name in _imported(src):
            for candidate in (
                source_path(name, package_dir),
                package_dir.joinpath(*name.split(".")[1:], "__init__.py"),
            ):
                if candidate.is_file():
                    files.add(candidate)
    sources = {p.relative_to(package_dir).as_posix(): _digest(p) for p in sorted(files)}
    return {"modules": list(modules), "shared_lib": SHARED_LIB, "sources": sources}


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Imports the named modules from their ``.py`` even where an extension module is built."""

    def __init__(self, names: Sequence[str], package_dir: Path) -> None:
        self.paths = {name: source_path(name, package_dir) for name in names}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        src = self.paths.get(fullname)
        if src is None:
            return None
        return importlib.util.spec_from_file_location(fullname, src)


# What guard() found (for status()): why the build's compiled modules are not used, if so
_state: dict[str, Any] = {"checked": False, "pure_reason": None, "stale": []}


def stale_sources(package_dir: Path = _PACKAGE) -> list[str] | None:
    """The recorded sources that changed since the build (None: nothing was compiled)."""
    path = package_dir / RECORD
    if not path.is_file():
        return None
    recorded: dict[str, str] = json.loads(path.read_text())["sources"]
    changed = []
    for rel, digest in recorded.items():
        src = package_dir / rel
        if not src.is_file() or _digest(src) != digest:
            changed.append(rel)
    return changed


def guard(package_dir: Path = _PACKAGE) -> None:
    """Make sure no compiled module runs stale code (see the module's docstring). Idempotent."""
    if _state["checked"]:
        return
    _state["checked"] = True
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        _state["pure_reason"] = f"{PURE_ENV}={os.environ[PURE_ENV]}"
    else:
        changed = stale_sources(package_dir)
        if not changed:
            return
        _state["stale"] = changed
        _state["pure_reason"] = "sources changed since the build: " + ", ".join(changed)
        log.warning(
            "spec-router: %s changed since the compiled build; running every compiled module "
            "(%s) from its source instead. `make venv` (or `make compile`) rebuilds.",
            ", ".join(changed),
            ", ".join(MODULES),
        )
    sys.meta_path.insert(0, _SourceFirst(MODULES, package_dir))


def status() -> dict[str, Any]:
    """What runs, for ``/router/status`` and ``spec_router_build_info``: ``compiled`` (every
    listed module loaded from an extension module), the modules loaded compiled, and why the
    rest run from source. Reads ``sys.modules`` only: imports nothing."""
    compiled = []
    for name in MODULES:
        module = sys.modules.get(name)
        loader = getattr(getattr(module, "__spec__", None), "loader", None)
        if isinstance(loader, importlib.machinery.ExtensionFileLoader):
            compiled.append(name)
    reason = _state["pure_reason"]
    if reason is None and len(compiled) < len(MODULES):
        reason = "not compiled (pure build)" if not (_PACKAGE / RECORD).is_file() else None
    return {
        "compiled": len(compiled) == len(MODULES),
        "compiled_modules": compiled,
        "modules": list(MODULES),
        "pure_reason": reason,
    }
