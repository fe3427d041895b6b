"""The guide documents every setting, metric and endpoint, each once, on its page.

Read from the code, not from a list kept by hand: the settings from ``Settings``' fields, the
metrics from a router's registry, the endpoints from its control app's routes. A failure names
what is missing and where it goes (for a setting, the row to add).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric
from pydantic import SecretStr
from starlette.routing import Route

from router.app import RouterApp
from router.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def rows(page: str) -> list[list[str]]:
    """The cells of every table row in ``docs/<page>`` whose first cell is code."""
    found = []
    for line in (DOCS / page).read_text(encoding="utf-8").splitlines():
        if line.startswith("| `"):
            found.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return found


def first_cells(page: str) -> Counter[str]:
    return Counter(cells[0] for cells in rows(page))


def once(names: set[str], page: str, kind: str) -> list[str]:
    """What is wrong with ``page``'s rows for ``names``: missing, listed twice, or rows for
    a name of this ``kind`` (a regex on the cell) that is not among them."""
    counts = first_cells(page)
    cells = {f"`{n}`" for n in names}
    problems = [f"missing: {c}" for c in sorted(cells) if counts[c] == 0]
    problems += [f"{c} has {counts[c]} rows" for c in sorted(cells) if counts[c] > 1]
    extra = {c for c in counts if re.match(kind, c)} - cells
    problems += [f"{c} is listed but does not exist" for c in sorted(extra)]
    return problems


def test_the_readme_stays_a_front_door() -> None:
    """The README says what it is, the two commands, a first deployment, the picture and where
    to read on (issue 32: at most ~250 lines); the manual is docs/."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    assert "make demo" in readme and "make test" in readme


# -- settings ------------------------------------------------------------------------------------


def shown_default(name: str) -> str:
    """A field's default as docs/configuration.md shows it."""
    field = Settings.model_fields[name]
    value: Any = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
    if value is None or value == [] or value == {}:
        return "`—`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, list):
        shown = (v.get_secret_value() if isinstance(v, SecretStr) else v for v in value)
        return "`" + ",".join(shown) + "`"
    return f"`{value}`"


def test_every_setting_is_in_the_configuration_table_once_with_its_default() -> None:
    table = {cells[0]: cells for cells in rows("configuration.md")}
    counts = first_cells("configuration.md")
    problems = []
    for name in Settings.model_fields:
        key = f"`{name.upper()}`"
        if key not in table:
            problems.append(f"missing: | {key} | {shown_default(name)} | <what it does> |")
        elif counts[key] > 1:
            problems.append(f"{key} has {counts[key]} rows")
        elif table[key][1] != shown_default(name):
            problems.append(f"{key}: default {table[key][1]}, Settings has {shown_default(name)}")
    known = {f"`{name.upper()}`" for name in Settings.model_fields}
    problems += [f"{key} is not a setting" for key in table if key not in known]
    assert not problems, "docs/configuration.md:\n" + "\n".join(problems)


def test_the_settings_check_reads_the_rows_it_checks() -> None:
    """(So that a page the parser cannot read does not pass as a page with nothing missing.)"""
    assert len(rows("configuration.md")) == len(Settings.model_fields)


# -- metrics -------------------------------------------------------------------------------------


def exported_name(family: Metric) -> str:
    """The name a scrape shows for a family: counters end in _total, infos in _info."""
    suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
    return family.name + suffix


@pytest.fixture(scope="module")
def router() -> RouterApp:
    # (a queue, a backend per pool and the planner: every collector has something to report)
    return RouterApp(Settings(queue_size=4, planner="advisory"))


def test_every_metric_the_router_exports_is_in_the_observability_page_once(
    router: RouterApp,
) -> None:
    names = {exported_name(family) for family in router.registry.collect()}
    assert len(names) >= 20, names  # (the registry was read)
    problems = once(names, "observability.md", r"`spec_router_")
    assert not problems, "docs/observability.md, metrics table:\n" + "\n".join(problems)


# -- endpoints -----------------------------------------------------------------------------------


def endpoints(router: RouterApp) -> set[str]:
    """``METHOD /path`` for every route of the control app, plus the proxied /v1/*."""
    found = {"POST /v1/*"}
    for route in router.control.routes:
        if not isinstance(route, Route) or route.path == "/v1/{rest:path}":
            continue  # (the not-yet-started catch-all is the proxy's path)
        for method in sorted((route.methods or set()) - {"HEAD"}):
            found.add(f"{method} {route.path}")
    return found


def test_every_endpoint_is_in_the_http_api_page_once(router: RouterApp) -> None:
    found = endpoints(router)
    assert {"GET /health", "GET /metrics", "PUT /router/table"} <= found  # (the routes were read)
    problems = once(found, "endpoints.md", r"`(GET|PUT|POST|DELETE|PATCH) /")
    assert not problems, "docs/endpoints.md, endpoints table:\n" + "\n".join(problems)
