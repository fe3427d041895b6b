"""``make test`` collects every test directory but tests/real, which needs a built engine."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_test_directory_but_real_is_collected_by_default() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    testpaths = set(config["tool"]["pytest"]["ini_options"]["testpaths"])
    with_tests = {
        f"tests/{d.name}"
        for d in (ROOT / "tests").iterdir()
        if d.is_dir() and any(d.glob("test_*.py"))
    } | {f"tests/{f.name}" for f in (ROOT / "tests").glob("test_*.py")}
    assert "tests/real" in with_tests and "tests/real" not in testpaths
    assert with_tests - {"tests/real"} == testpaths
