"""The package's shape: no import circle, dependencies one way down the layers, pure cores.

Every module under router/ is parsed (``ast``, nothing imported) and each of its imports of the
router counted, wherever it stands: at the top, inside a function, under ``if TYPE_CHECKING``.
(``router.cli`` dispatches to its subcommands by name, ``importlib.import_module``: that is not
an import statement, and the one way the process layer is reached.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Bottom to top. A module may import its own package and any package of a layer below its own;
# packages side by side in a layer do not import each other.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = tuple(
    (name, frozenset(units))
    for name, units in (
        # which modules run compiled: the package's __init__ imports it, before anything
        ("the build", {"router.compiled"}),
        (
            "leaves",
            {
                "router",  # the package itself: __version__
                "router.pools",
                "router.errors",
                "router.asgi",
                "router.timers",
                "router.origin",
                "router.keepalive",
                "router.jsonfast",
                "router.units",
                "router.uvicorn_guard",
            },
        ),
        ("configuration", {"router.settings"}),
        ("pure core: decisions", {"router.decide"}),
        ("pure cores: learning, planning", {"router.learn", "router.plan"}),
        ("the engines' HTTP client", {"router.upstream"}),
        (
            "health, where the members come from, the fast path",
            {"router.health", "router.members", "router.fastpath"},
        ),
        ("serving an ASGI app", {"router.serving"}),
        ("accounting", {"router.account"}),
        ("the proxy", {"router.forward"}),
        ("the workers' shared context", {"router.workers"}),
        ("what a change of the members does", {"router.membership"}),
        ("the fleet planner's wiring", {"router.planning"}),
        ("control endpoints, lifecycle", {"router.control", "router.lifecycle"}),
        ("the app", {"router.app"}),
        ("the gateway's endpoint picker", {"router.gateway"}),
        ("sims, calibration", {"router.sim", "router.calibrate"}),
        ("tools", {"router.tools"}),
        ("the process layer", {"router.process"}),
        ("the command line", {"router.cli"}),
        ("python -m router", {"router.__main__"}),
    )
)
PURE_CORES = ("router.decide", "router.learn", "router.plan")
# What a pure core may not reach, itself or through anything it imports.
IO_UNITS = frozenset(
    {
        "router.upstream",
        "router.health",
        "router.fastpath",
        "router.serving",
        "router.account",
        "router.forward",
        "router.workers",
        "router.members",
        "router.membership",
        "router.planning",
        "router.control",
        "router.lifecycle",
        "router.app",
        "router.sim",
        "router.calibrate",
        "router.tools",
        "router.process",
        "router.cli",
    }
)
IO_LIBRARIES = frozenset(
    {
        "asyncio",
        "socket",
        "ssl",
        "select",
        "selectors",
        "mmap",
        "subprocess",
        "multiprocessing",
        "threading",
        "anyio",
        "httpx",
        "httptools",
        "aiohttp",
        "fastapi",
        "starlette",
        "uvicorn",
        "uvloop",
        "prometheus_client",
    }
)


def modules(package: Path) -> dict[str, Path]:
    """Every module of the package at ``package``, by dotted name (a package by its own)."""
    found: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imported(node: ast.AST, module: str, is_package: bool) -> Iterable[str]:
    """The dotted names an import statement names (``from a import b`` names ``a.b`` as well as
    ``a``: which of them is a module is decided by the caller)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = module.split(".")
            keep = len(parts) - node.level + (1 if is_package else 0)
            base = ".".join(parts[:keep] + ([base] if base else []))
        yield base
        for alias in node.names:
            yield f"{base}.{alias.name}"


def import_graph(found: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports, however and wherever."""
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        is_package = path.name == "__init__.py"
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            named = list(_imported(node, name, is_package))
            if isinstance(node, ast.ImportFrom):
                # ``from a import b``: the module a.b if there is one, else a (b is a name in it)
                base, *members = named
                targets = [m for m in members if m in found] or ([base] if base in found else [])
                if len(targets) < len(members) and base in found:
                    targets.append(base)
            else:
                targets = [n for n in named if n in found]
            edges.update(t for t in targets if t != name)
    return graph


def third_party(path: Path) -> set[str]:
    """The top-level names of everything outside the router a module imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - {"router"}


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Each import circle, as a path that returns to its start: one per strongly connected
    group of modules (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)
    return [_path_within(graph, group) for group in groups]


def _path_within(graph: Mapping[str, set[str]], group: set[str]) -> list[str]:
    """One circle through the group's first member, for the message."""
    first = min(group)
    paths = {first: [first]}
    queue = [first]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph.get(node, set()) & group):
            if child == first:
                return paths[node] + [first]
            if child not in paths:
                paths[child] = paths[node] + [child]
                queue.append(child)
    raise AssertionError(f"no circle through {first}")  # (a strongly connected group has one)


def unit(module: str) -> str:
    """The package (or top-level module) a module belongs to: ``router.decide.policy`` ->
    ``router.decide``."""
    return ".".join(module.split(".")[:2])


def layer_of(name: str) -> int:
    for i, (_, units) in enumerate(LAYERS):
        if name in units:
            return i
    raise KeyError(name)


ROUTER = modules(ROOT / "router")
GRAPH = import_graph(ROUTER)


def closure(start: Iterable[str], graph: Mapping[str, set[str]]) -> set[str]:
    seen = set(start)
    todo = list(seen)
    while todo:
        for child in graph.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


# -- the checker itself, on a package of its own ---------------------------------------------------


def write(root: Path, files: Mapping[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return modules(root / "pkg")


def test_every_kind_of_import_counts_and_a_circle_is_named(tmp_path: Path) -> None:
    found = write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": "def f():\n    import pkg.c\n",
            "pkg/c.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import x\n"
            ),
            "pkg/d.py": "from pkg.a import x\nfrom . import e\n",
            "pkg/e.py": "import json\n",
        },
    )
    graph = import_graph(found)
    assert graph == {
        "pkg": set(),
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.c"},
        "pkg.c": {"pkg.a"},
        "pkg.d": {"pkg.a", "pkg.e"},
        "pkg.e": set(),
    }
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    assert third_party(found["pkg.e"]) == {"json"}
    graph["pkg.c"].clear()
    assert circles(graph) == []


# -- the router ---------------------------------------------------------------------------------


def test_the_router_is_parsed() -> None:
    assert {"router.app", "router.decide.policy", "router.process.serve"} <= set(GRAPH)
    assert "router.decide.policy" in GRAPH["router.forward.decider"]


def test_no_import_circle_between_modules() -> None:
    found = circles(GRAPH)
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found)


def test_every_package_has_its_layer() -> None:
    placed = {name for _, units in LAYERS for name in units}
    missing = sorted({unit(m) for m in GRAPH} - placed)
    assert not missing, f"not in LAYERS (tests/test_layout.py): {missing}"


def test_imports_point_down_the_layers() -> None:
    wrong = []
    for module, targets in sorted(GRAPH.items()):
        for target in sorted(targets):
            here, there = unit(module), unit(target)
            if here != there and layer_of(there) >= layer_of(here):
                wrong.append(
                    f"{module} ({LAYERS[layer_of(here)][0]}) imports {target} "
                    f"({LAYERS[layer_of(there)][0]})"
                )
    assert not wrong, "imports that do not point down:\n" + "\n".join(wrong)


@pytest.mark.parametrize("core", [c for c in PURE_CORES if c in ROUTER])
def test_a_pure_core_reaches_no_io(core: str) -> None:
    """A pure core, and everything it imports, imports no I/O package of the router and no
    networking, concurrency or server library."""
    own = [m for m in GRAPH if unit(m) == core]
    reached = closure(own, GRAPH)
    io = sorted(m for m in reached if unit(m) in IO_UNITS)
    assert not io, f"{core} reaches {io}"
    libraries = {m: sorted(third_party(ROUTER[m]) & IO_LIBRARIES) for m in sorted(reached)}
    assert not {m: libs for m, libs in libraries.items() if libs}


def test_the_process_layer_is_imported_by_nothing_but_the_command_line() -> None:
    importers = sorted(
        module
        for module, targets in GRAPH.items()
        if unit(module) not in ("router.process", "router.cli")
        and any(unit(t) == "router.process" for t in targets)
    )
    assert not importers
    cli = (ROOT / "router" / "cli.py").read_text()
    assert '"router.process.serve"' in cli  # reached by name, when `serve` is asked for
