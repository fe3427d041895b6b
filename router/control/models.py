"""``GET /v1/models``: the union of what both pools serve, under the public model names."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any

from router.errors import NoBackend
from router.pools import POOLS, Pool
from router.settings import Settings
from router.upstream.client import OriginPool, Timeouts


async def _fetch_models(settings: Settings, client: OriginPool, pool: Pool) -> Any:
    timeouts = Timeouts(
        settings.connect_timeout, settings.health_timeout * 5, settings.health_timeout * 5
    )
    auth = settings.pool_authorization(pool)
    headers = [] if auth is None else [(b"authorization", auth)]
    conn = await client.request(b"GET", b"/v1/models", headers, b"", timeouts)
    try:
        body = await conn.read_all()
        if conn.status != 200:
            raise ValueError(f"{client.origin.url}/v1/models: HTTP {conn.status}")
        return json.loads(body)
    finally:
        conn.release()


async def list_models(
    settings: Settings,
    pools: Mapping[Pool, list[str]],
    clients: Mapping[str, OriginPool],
    usable: Callable[[str], bool],
) -> dict[str, Any]:
    """Ask one usable backend of each pool; a pool that fails is left out, not an error."""
    tasks = []
    for pool in POOLS:
        url = next((u for u in pools[pool] if usable(u)), None)
        if url is not None:
            tasks.append((pool, _fetch_models(settings, clients[url], pool)))
    if not tasks:
        raise NoBackend("no backend can list models right now", settings.retry_after())
    results = await asyncio.gather(*(t for _, t in tasks), return_exceptions=True)
    seen: dict[str, Any] = {}
    for (pool, _), result in zip(tasks, results, strict=True):
        if isinstance(result, BaseException) or not isinstance(result, dict):
            continue
        public = {v: k for k, v in settings.pool_model_map(pool).items()}
        for entry in result.get("data", []):
            if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                served: str = entry["id"]
                name = public.get(served, served)
                seen.setdefault(name, {**entry, "id": name})
    if not seen:
        raise NoBackend("no backend answered /v1/models", settings.retry_after())
    return {"object": "list", "data": list(seen.values())}
