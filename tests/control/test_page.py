"""``/router/ui``: the page and its files from the package, read-only, and behind the API keys
when they are set (header, ``?key=`` then a cookie)."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.control.page import COOKIE, load_assets
from router.settings import Settings
from tests.control.test_control import Router, assert_error, serve

pytestmark = pytest.mark.anyio

UI = Path(__file__).resolve().parents[2] / "router" / "control" / "ui"


def closed_feed(router: Router) -> Router:
    # ASGITransport buffers whole responses: a closed feed answers and ends at once
    router.feed.close()
    return router


async def test_the_page_its_files_and_its_feed() -> None:
    async with serve(closed_feed(Router(Settings()))) as client:
        r = await client.get("/router/ui")
        assert r.status_code == 307 and r.headers["location"] == "ui/"
        r = await client.get("/router/ui/")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert r.content == (UI / "index.html").read_bytes()
        csp = r.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "connect-src 'self'" in csp
        for name, kind in [
            ("ui.js", "text/javascript"),
            ("ui.css", "text/css"),
            ("vendor/uPlot.iife.min.js", "text/javascript"),
            ("vendor/uPlot.min.css", "text/css"),
        ]:
            r = await client.get(f"/router/ui/{name}")
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind), name
            assert r.content == (UI / name).read_bytes()
        r = await client.get("/router/ui/events")
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert r.content.startswith(b"retry: ")
        r = await client.get("/router/ui/nothing.js")
        assert_error(r, 404, "invalid_request_error", "not_found")
        r = await client.get("/router/ui/../app.py")
        assert r.status_code == 404


def test_every_file_of_the_page_is_package_data() -> None:
    """What pyproject's package-data ships is what the page needs (``ui/*``, ``ui/vendor/*``)."""
    on_disk = {str(p.relative_to(UI)) for p in UI.rglob("*") if p.is_file()}
    assert set(load_assets()) == on_disk
    assert all(name.count("/") <= 1 for name in on_disk)
    pyproject = (UI.parents[2] / "pyproject.toml").read_text()
    assert '"router.control" = ["ui/*", "ui/vendor/*"]' in pyproject
    assert (UI / "vendor" / "uPlot.LICENSE").read_text().startswith("The MIT License")


@pytest.mark.parametrize("path", ["/router/ui/", "/router/ui/events", "/router/ui/ui.js"])
async def test_nothing_on_the_page_can_change_the_router(path: str) -> None:
    async with serve(Router(Settings())) as client:
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            r = await client.request(method, path)
            assert_error(r, 405, "invalid_request_error", "http_405")


async def test_with_api_keys_the_page_and_feed_need_one() -> None:
    async with serve(closed_feed(Router(Settings(api_keys=["k-one", "k-two"])))) as client:
        for path in ("/router/ui/", "/router/ui/events", "/router/ui/ui.js"):
            for headers in ({}, {"authorization": "Bearer nope"}):
                r = await client.get(path, headers=headers)
                assert_error(r, 401, "authentication_error", "invalid_api_key")
            r = await client.get(path, params={"key": "wrong"})
            assert_error(r, 401, "authentication_error", "invalid_api_key")
            r = await client.get(path, headers={"cookie": f"{COOKIE}=wrong"})
            assert_error(r, 401, "authentication_error", "invalid_api_key")
            for headers in ({"authorization": "Bearer k-two"}, {"x-api-key": "k-one"}):
                r = await client.get(path, headers=headers)
                assert r.status_code == 200, (path, headers)
                assert "set-cookie" not in r.headers
        # the redirect keeps the key; the page then sets it as a cookie for its files and feed
        r = await client.get("/router/ui", params={"key": "k-two"})
        assert r.headers["location"] == "ui/?key=k-two"
        r = await client.get("/router/ui/", params={"key": "k-two"})
        assert r.status_code == 200
        cookie = r.headers["set-cookie"].lower()
        assert f"{COOKIE}=k-two" in cookie
        for flag in ("httponly", "samesite=strict", "path=/router/ui"):
            assert flag in cookie
    async with serve(closed_feed(Router(Settings(api_keys=["k-one"])))) as client:
        for path in ("/router/ui/ui.js", "/router/ui/events"):
            r = await client.get(path, headers={"cookie": f"{COOKIE}=k-one"})
            assert r.status_code == 200, path


async def test_without_api_keys_no_cookie_is_set() -> None:
    async with serve(Router(Settings())) as client:
        r = await client.get("/router/ui/", params={"key": "anything"})
    assert r.status_code == 200 and "set-cookie" not in r.headers
