"""Which command lines the start-up guard takes for uvicorn running the router (the refusal
itself, over real processes: tests/process/test_startup_e2e.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.uvicorn_guard import uvicorn_argv, uvicorn_workers

PY = "/venv/bin/python3"


@pytest.mark.parametrize(
    ("orig_argv", "argv"),
    [
        ([PY, "/venv/bin/uvicorn", "router.app:app", "--workers", "2"],
         ["/venv/bin/uvicorn", "router.app:app", "--workers", "2"]),
        ([PY, "-u", "-m", "uvicorn", "router.app:app"], ["uvicorn", "router.app:app"]),
        ([PY, "-X", "dev", "-m", "uvicorn", "x:y"], ["uvicorn", "x:y"]),
        ([PY, "-m", "gunicorn", "router.app:app"], None),
        ([PY, "-c", "import uvicorn", "router.app:app"], None),
        ([PY, "/venv/bin/spec-router", "serve"], None),
        ([PY], None),
    ],
)  # fmt: skip
def test_uvicorn_is_found_as_a_script_or_a_module(
    orig_argv: list[str], argv: list[str] | None
) -> None:
    assert uvicorn_argv(orig_argv) == argv
    if argv is not None:
        assert uvicorn_workers(argv, {"WEB_CONCURRENCY": "3"}) == (2 if "--workers" in argv else 3)


def test_the_pth_line_imports_the_guard_only_for_the_router() -> None:
    line = (Path(__file__).parent.parent / "router" / "spec_router_uvicorn.pth").read_text()
    assert line.count("\n") == 1 and line.startswith("import sys; ")  # (one exec'd line)
    assert '"router.app:app" in sys.orig_argv and' in line
