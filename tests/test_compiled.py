"""router.compiled: the compiled build is used only while its sources are the ones it was built
from, and says what runs.

The stale-build tests copy the installed package (with its extension modules) to a directory of
their own, edit a source there and import it in a fresh interpreter: nothing is mocked. They
need a compiled build (``make venv`` with a C compiler); a pure build has nothing to guard.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import router
from router import compiled

PACKAGE = Path(router.__file__).resolve().parent
BUILT = (PACKAGE / compiled.RECORD).is_file()
needs_build = pytest.mark.skipif(
    not BUILT, reason="a pure build (nothing compiled): no compiled module to guard"
)

# What a fresh interpreter ran: each compiled module's file, and router.compiled.status()
PROBE = """
import json, sys
import router
from router import compiled
for name in compiled.MODULES:
    __import__(name)
print(json.dumps({
    "package": router.__file__,
    "files": {name: sys.modules[name].__file__ for name in compiled.MODULES},
    "status": compiled.status(),
}))
"""


def run_probe(root: Path, **env: str) -> tuple[dict[str, Any], str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root), compiled.PURE_ENV: "", **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    found: dict[str, Any] = json.loads(done.stdout)
    assert Path(found["package"]).resolve().parent == root / "router"  # (the copy, not .venv's)
    return found, done.stderr


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The installed package, extension modules and build record included, in ``tmp_path``."""
    shutil.copytree(PACKAGE, tmp_path / "router", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def suffixes(found: dict[str, Any]) -> set[str]:
    return {Path(f).suffix for f in found["files"].values()}


@needs_build
def test_a_build_that_matches_its_sources_runs_compiled(copy: Path) -> None:
    found, stderr = run_probe(copy)
    assert suffixes(found) == {".so"}
    assert found["status"]["compiled"] is True
    assert found["status"]["compiled_modules"] == list(compiled.MODULES)
    assert found["status"]["pure_reason"] is None
    assert "changed since the compiled build" not in stderr


@needs_build
@pytest.mark.parametrize("edited", ["decide/policy.py", "account/inflight.py", "pools.py"])
def test_an_edited_source_runs_every_compiled_module_from_source(copy: Path, edited: str) -> None:
    # a compiled module, or a router module they import (its Final constants are compiled in)
    path = copy / "router" / edited
    path.write_text(path.read_text() + "\n# edited after the build\n")
    found, stderr = run_probe(copy)
    assert suffixes(found) == {".py"}
    for name, file in found["files"].items():
        assert Path(file) == compiled.source_path(name, copy / "router")
    status = found["status"]
    assert status["compiled"] is False and status["compiled_modules"] == []
    assert edited in status["pure_reason"]
    # said once, in the log
    assert stderr.count("changed since the compiled build") == 1
    assert edited in stderr


@needs_build
def test_spec_router_pure_runs_the_source(copy: Path) -> None:
    found, stderr = run_probe(copy, **{compiled.PURE_ENV: "1"})
    assert suffixes(found) == {".py"}
    assert found["status"]["compiled"] is False
    assert found["status"]["pure_reason"] == f"{compiled.PURE_ENV}=1"
    assert "changed since the compiled build" not in stderr


def test_the_record_holds_the_compiled_sources_and_the_router_modules_they_import() -> None:
    rec = compiled.record(PACKAGE)
    assert rec["modules"] == list(compiled.MODULES)
    for name in compiled.MODULES:
        assert compiled.source_path(name, PACKAGE).relative_to(PACKAGE).as_posix() in rec["sources"]
    # (router.forward.decider imports router.pools and router.decide.params, not compiled)
    assert {"pools.py", "decide/params.py"} <= set(rec["sources"])
    assert all(len(digest) == 64 for digest in rec["sources"].values())


def test_status_says_what_this_process_runs() -> None:
    for name in compiled.MODULES:
        __import__(name)
    status = compiled.status()
    loaded = [n for n in compiled.MODULES if sys.modules[n].__file__.endswith(".so")]  # type: ignore[union-attr]
    assert status["compiled_modules"] == loaded
    assert status["compiled"] is (loaded == list(compiled.MODULES))
    if status["compiled"]:
        assert status["pure_reason"] is None
    else:
        assert status["pure_reason"]
    # ``make test`` runs on a compiled build where it can build one (the Makefile says which)
    expect = os.environ.get("SPEC_ROUTER_EXPECT_BUILD")
    if expect:
        assert ("compiled" if status["compiled"] else "pure") == expect
