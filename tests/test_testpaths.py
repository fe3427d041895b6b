"""``make test`` collects every test directory but tests/real, which needs a built engine; and
the test tree mirrors the package: tests/<name>/ for each package router/<name>/."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# Test directories that are not a package of the router, and what they hold instead.
NOT_PACKAGES = {
    "deploy": "deploy/: the manifests, the dashboard, the alert rules",
    "ui": "the live page (router/control/ui/) in a real browser",
    "real": "the real-engine tier (llama.cpp): make test-real",
    "support": "helpers the tests share",
}


def test_every_test_directory_but_real_is_collected_by_default() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    testpaths = set(config["tool"]["pytest"]["ini_options"]["testpaths"])
    with_tests = {
        f"tests/{d.name}" for d in TESTS.iterdir() if d.is_dir() and any(d.glob("test_*.py"))
    }
    if any(TESTS.glob("test_*.py")):
        with_tests.add("tests/test_*.py")
    assert "tests/real" in with_tests and "tests/real" not in testpaths
    assert with_tests - {"tests/real"} == testpaths


def test_the_test_tree_mirrors_the_package() -> None:
    packages = {d.name for d in (ROOT / "router").iterdir() if (d / "__init__.py").exists()}
    test_dirs = {d.name for d in TESTS.iterdir() if (d / "__init__.py").exists()}
    assert test_dirs - NOT_PACKAGES.keys() == packages
