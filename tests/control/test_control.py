"""The control endpoints against a stand-in router (the ``Controlled`` protocol), over
``httpx.ASGITransport``: what each endpoint answers, who may call the admin ones, and the
OpenAI-shaped errors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import pytest
from prometheus_client import CONTENT_TYPE_LATEST

from router.control.app import build_control_app
from router.control.controlled import Controlled
from router.control.feed import Feed
from router.decide import table as tables
from router.errors import NoBackend
from router.members.member import Member
from router.members.store import LocalStore, NotMember
from router.membership import NotOwned, checked_url
from router.pools import BASELINE, SPECULATIVE, Pool
from router.settings import Settings
from tests.support.tables import model_table

pytestmark = pytest.mark.anyio

TOKEN = "s3cret"
ADMIN = {"authorization": f"Bearer {TOKEN}"}
MODELS = {"object": "list", "data": [{"id": "m", "object": "model"}]}


class Router:
    """Plain values behind the views; records the operator actions it is asked for."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.pools: dict[Pool, bool] = {SPECULATIVE: True, BASELINE: False}
        self.document: dict[str, Any] = {"policy": "spillover", "crossover": 4, "pools": {}}
        self.current = model_table(1024, 256, crossover=4)
        self.pinned: list[int] = []
        self.models_fail = False
        self.feed = Feed(lambda: {"policy": "spillover"}, 0.05)
        self.store = LocalStore(4)
        self.store.join(SPECULATIVE, "http://s1:30000", "static", None, 0.0)
        self.store.join(BASELINE, "http://10.0.0.9:30000", "dns", "engines.local", 0.0)
        self.flight: dict[str, int] = {"http://s1:30000": 2}

    def status(self) -> dict[str, Any]:
        return self.document

    def usable_pools(self) -> dict[Pool, bool]:
        return dict(self.pools)

    def metrics_text(self) -> bytes:
        return b"# TYPE spec_router_crossover gauge\nspec_router_crossover 4.0\n"

    def table(self) -> tables.Table:
        return self.current

    def replace_table(self, raw: Any) -> tables.Table:
        self.current = tables.from_json(raw)
        return self.current

    def pin_crossover(self, value: int) -> None:
        self.pinned.append(value)

    async def list_models(self) -> dict[str, Any]:
        if self.models_fail:
            raise NoBackend("no backend can list models right now", 3)
        return MODELS

    # the members: a real store, with the rules the router's own membership adds to it
    def clock(self) -> float:
        return 100.0

    def add_backend(self, pool: Pool, url: str) -> Member:
        return self.store.join(pool, checked_url(url), "admin", None, self.clock())

    def remove_backend(self, pool: Pool, url: str) -> Member:
        current = next((m for m in self.store.read()[1] if m.url == url), None)
        if current is None or current.pool != pool:
            raise NotMember(f"{url} is not a backend of the {pool} pool")
        if current.source == "dns":
            raise NotOwned(f"{url} comes from DNS")
        return self.store.drain(url, self.clock(), self.clock() + 30.0)

    def members(self, pool: Pool) -> list[Member]:
        return [m for m in self.store.read()[1] if m.pool == pool]

    def in_flight(self) -> Mapping[str, int]:
        return self.flight

    def plan(self) -> dict[str, Any]:
        return {"planner": "off", "status": "off"}


def serve(router: Controlled) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=build_control_app(router))
    return httpx.AsyncClient(transport=transport, base_url="http://router")


@pytest.fixture
def router() -> Router:
    return Router(Settings(admin_token=TOKEN))


@pytest.fixture
async def client(router: Router) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(router) as c:
        yield c


def assert_error(r: httpx.Response, status: int, type_: str, code: str) -> str:
    """The OpenAI error shape with this status, type and code; returns the message."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == (type_, None, code)
    assert isinstance(error["message"], str) and error["message"]
    message: str = error["message"]
    return message


# -- the views ------------------------------------------------------------------------------------


async def test_health(client: httpx.AsyncClient) -> None:
    r = await client.get("/health")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})


async def test_ready_while_one_pool_can_serve(client: httpx.AsyncClient, router: Router) -> None:
    r = await client.get("/ready")
    assert r.status_code == 200
    assert r.json() == {"ready": True, "pools": {"speculative": True, "baseline": False}}
    router.pools[SPECULATIVE] = False
    r = await client.get("/ready")
    assert r.status_code == 503
    assert r.json() == {"ready": False, "pools": {"speculative": False, "baseline": False}}


async def test_metrics_are_the_routers_text_in_prometheus_format(
    client: httpx.AsyncClient, router: Router
) -> None:
    r = await client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == CONTENT_TYPE_LATEST
    assert r.content == router.metrics_text()


async def test_status_is_the_routers_document(client: httpx.AsyncClient, router: Router) -> None:
    router.document = {"policy": "predictive", "crossover": 11, "in_flight": {"total": 3}}
    r = await client.get("/router/status")
    assert (r.status_code, r.json()) == (200, router.document)


async def test_get_table(client: httpx.AsyncClient, router: Router) -> None:
    r = await client.get("/router/table")
    assert r.status_code == 200
    assert tables.from_json(r.json()) == router.current


async def test_an_unknown_path_is_a_404_in_the_openai_shape(client: httpx.AsyncClient) -> None:
    message = assert_error(await client.get("/nope"), 404, "invalid_request_error", "not_found")
    assert message == "no route for GET /nope"


async def test_a_wrong_method_keeps_the_shape(client: httpx.AsyncClient) -> None:
    assert_error(await client.delete("/health"), 405, "invalid_request_error", "http_405")


async def test_the_proxy_paths_say_starting_until_the_lifespan_ran(
    client: httpx.AsyncClient,
) -> None:
    r = await client.post("/v1/chat/completions", json={})
    assert_error(r, 503, "server_error", "starting")
    assert r.headers["retry-after"] == "1"


# -- /v1/models --------------------------------------------------------------------------------


async def test_models_without_api_keys_are_open(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/models")
    assert (r.status_code, r.json()) == (200, MODELS)


async def test_models_with_api_keys_need_one() -> None:
    router = Router(Settings(api_keys=["k-one", "k-two"]))
    async with serve(router) as client:
        for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "k-two"}):
            r = await client.get("/v1/models", headers=headers)
            assert_error(r, 401, "authentication_error", "invalid_api_key")
            assert r.headers["www-authenticate"] == "Bearer"
        for headers in ({"authorization": "Bearer k-two"}, {"x-api-key": "k-one"}):
            r = await client.get("/v1/models", headers=headers)
            assert (r.status_code, r.json()) == (200, MODELS), headers


async def test_models_when_no_backend_can_answer(client: httpx.AsyncClient, router: Router) -> None:
    router.models_fail = True
    r = await client.get("/v1/models")
    assert_error(r, 503, "server_error", "no_backend_available")
    assert r.headers["retry-after"] == "3"


# -- admin: who may -------------------------------------------------------------------------------

ADMIN_CALLS = [("/router/crossover", {"crossover": 5}), ("/router/table", {"crossover": 5})]


@pytest.mark.parametrize(("path", "body"), ADMIN_CALLS)
async def test_admin_endpoints_are_off_without_a_token(path: str, body: dict[str, Any]) -> None:
    router = Router(Settings())
    before = router.current
    async with serve(router) as client:
        r = await client.put(path, json=body, headers=ADMIN)
    message = assert_error(r, 403, "permission_error", "admin_disabled")
    assert "SPEC_ROUTER_ADMIN_TOKEN" in message
    assert router.pinned == [] and router.current is before


@pytest.mark.parametrize(("path", "body"), ADMIN_CALLS)
@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer wrong"}, {"authorization": TOKEN}, {"x-api-key": TOKEN}],
)
async def test_admin_endpoints_refuse_a_wrong_or_missing_token(
    client: httpx.AsyncClient,
    router: Router,
    path: str,
    body: dict[str, Any],
    headers: dict[str, str],
) -> None:
    before = router.current
    r = await client.put(path, json=body, headers=headers)
    assert_error(r, 401, "authentication_error", "invalid_admin_token")
    assert router.pinned == [] and router.current is before


# -- admin: PUT /router/crossover ------------------------------------------------------------------


async def test_put_crossover_pins_it(client: httpx.AsyncClient, router: Router) -> None:
    r = await client.put("/router/crossover", json={"crossover": 0}, headers=ADMIN)
    assert (r.status_code, r.json()) == (200, {"crossover": 0, "crossover_source": "configured"})
    r = await client.put("/router/crossover", json={"crossover": 12}, headers=ADMIN)
    assert r.status_code == 200
    assert router.pinned == [0, 12]


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"",
        b"[5]",
        b"{}",
        b'{"crossover": -1}',
        b'{"crossover": 2.5}',
        b'{"crossover": "3"}',
        b'{"crossover": true}',
        b'{"crossover": null}',
        b'{"value": 3}',
    ],
)
async def test_put_crossover_refuses_anything_but_a_non_negative_integer(
    client: httpx.AsyncClient, router: Router, content: bytes
) -> None:
    r = await client.put("/router/crossover", content=content, headers=ADMIN)
    message = assert_error(r, 400, "invalid_request_error", "invalid_request")
    assert "non-negative integer" in message
    assert router.pinned == []


# -- admin: PUT /router/table ----------------------------------------------------------------------


async def test_put_table_replaces_it(client: httpx.AsyncClient, router: Router) -> None:
    new = tables.to_json(model_table(1024, 256, crossover=12))
    r = await client.put("/router/table", json=new, headers=ADMIN)
    expected = {"crossover": 12, "crossover_source": "calibrated", "measured_up_to": 32}
    assert (r.status_code, r.json()) == (200, expected)
    assert router.current.crossover == 12


async def test_put_table_refuses_a_bad_one_and_keeps_the_old(
    client: httpx.AsyncClient, router: Router
) -> None:
    before = router.current
    bad = tables.to_json(model_table(1024, 256, crossover=12)) | {"version": 99}
    r = await client.put("/router/table", json=bad, headers=ADMIN)
    message = assert_error(r, 400, "invalid_request_error", "invalid_table")
    assert message.startswith("table refused:") and "version" in message
    r = await client.put("/router/table", content=b"{oops", headers=ADMIN)
    message = assert_error(r, 400, "invalid_request_error", "invalid_json")
    assert message.startswith("table is not valid JSON")
    assert router.current is before


# -- admin: a pool's backends ----------------------------------------------------------------------

BACKENDS = "/router/pools/speculative/backends"


async def test_pool_backends_are_listed_without_a_token(client: httpx.AsyncClient) -> None:
    r = await client.get(BACKENDS)
    assert r.status_code == 200
    assert r.json() == {
        "pool": "speculative",
        "backends": [
            {
                "pool": "speculative",
                "url": "http://s1:30000",
                "source": "static",
                "name": None,
                "membership": "active",
                "in_flight": 2,
                "drain_deadline_in_s": None,
            }
        ],
    }
    r = await client.get("/router/pools/turbo/backends")
    assert "turbo" in assert_error(r, 404, "invalid_request_error", "not_found")


async def test_adding_and_removing_a_backend(client: httpx.AsyncClient, router: Router) -> None:
    r = await client.post(BACKENDS, json={"url": "http://10.0.0.7:30000/"}, headers=ADMIN)
    assert r.status_code == 201
    assert (r.json()["url"], r.json()["source"]) == ("http://10.0.0.7:30000", "admin")
    r = await client.delete(BACKENDS, params={"url": "http://s1:30000"}, headers=ADMIN)
    assert r.status_code == 202
    assert (r.json()["membership"], r.json()["in_flight"]) == ("draining", 2)
    assert r.json()["drain_deadline_in_s"] == 30.0
    assert [m.url for m in router.members("speculative")] == [
        "http://s1:30000",
        "http://10.0.0.7:30000",
    ]


@pytest.mark.parametrize(
    ("method", "kwargs", "status", "code"),
    [
        ("post", {"content": b"{oops"}, 400, "invalid_request"),
        ("post", {"json": {"address": "http://10.0.0.7:30000"}}, 400, "invalid_request"),
        ("post", {"json": {"url": "ftp://10.0.0.7"}}, 400, "invalid_url"),
        ("post", {"json": {"url": "http://s1:30000"}}, 409, "backend_exists"),
        ("delete", {}, 400, "missing_url"),
        ("delete", {"params": {"url": "http://nowhere:1"}}, 404, "backend_not_found"),
    ],
)
async def test_bad_changes_of_a_pool_get_the_error_shape(
    client: httpx.AsyncClient,
    router: Router,
    method: str,
    kwargs: dict[str, Any],
    status: int,
    code: str,
) -> None:
    before = router.store.read()
    r = await client.request(method.upper(), BACKENDS, headers=ADMIN, **kwargs)
    type_ = "invalid_request_error" if status < 500 else "server_error"
    assert_error(r, status, type_, code)
    assert router.store.read() == before


async def test_the_rules_of_membership_answer_409(client: httpx.AsyncClient) -> None:
    # in the other pool
    r = await client.post(
        "/router/pools/baseline/backends", json={"url": "http://s1:30000"}, headers=ADMIN
    )
    assert "is in the speculative pool" in assert_error(
        r, 409, "invalid_request_error", "backend_in_other_pool"
    )
    # discovered through DNS: it leaves when its name stops answering with it
    r = await client.delete(
        "/router/pools/baseline/backends", params={"url": "http://10.0.0.9:30000"}, headers=ADMIN
    )
    assert "comes from DNS" in assert_error(r, 409, "invalid_request_error", "backend_discovered")
    # the capacity (4 here), draining backends included
    for n in (1, 2):
        r = await client.post(BACKENDS, json={"url": f"http://10.0.1.{n}:1"}, headers=ADMIN)
        assert r.status_code == 201
    r = await client.post(BACKENDS, json={"url": "http://10.0.1.3:1"}, headers=ADMIN)
    assert_error(r, 409, "invalid_request_error", "too_many_backends")


@pytest.mark.parametrize("method", ["POST", "DELETE"])
async def test_changing_a_pool_needs_the_admin_token(method: str) -> None:
    async with serve(Router(Settings())) as off:
        r = await off.request(method, BACKENDS, json={"url": "http://10.0.0.7:1"})
        assert_error(r, 403, "permission_error", "admin_disabled")
    async with serve(Router(Settings(admin_token=TOKEN))) as on:
        r = await on.request(method, BACKENDS, json={"url": "http://10.0.0.7:1"})
        assert_error(r, 401, "authentication_error", "invalid_admin_token")
