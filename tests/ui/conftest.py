"""A headless Chromium for the live page's tests: the system's Debian ``chromium``
(``scripts/ensure-chromium.sh``), driven by Playwright; Playwright's own browsers are never
downloaded or used."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, sync_playwright


def chromium_path() -> str:
    found = os.environ.get("SPEC_ROUTER_CHROMIUM") or shutil.which("chromium")
    if not found:
        raise RuntimeError("no chromium on PATH: run scripts/ensure-chromium.sh (make test does)")
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # (per module, not per session: Playwright's sync API keeps an event loop running in this
    # thread while it is open, and the anyio tests after tests/ui need the thread free)
    # as root (CI, containers) Chromium refuses to start with its sandbox on
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=args)
        try:
            yield browser
        finally:
            browser.close()
