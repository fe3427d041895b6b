"""Asking an engine about itself: the few GETs ``router.health.info`` reads, in order.

``/v1/models`` first (its ``owned_by`` names the engine), then that engine's own endpoints
(``info.paths_for``). SGLang's ``/get_server_info`` is asked only when ``/server_info`` is
missing (0.5.3): 0.5.23 logs a deprecation warning on every call to it. The GET itself is the
caller's (``Get``): the health poller's own client, or the doctor's.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from router.health.info import (
    GET_SERVER_INFO,
    MODELS,
    SERVER_INFO,
    EngineInfo,
    Reply,
    engine_info,
    flavor_of,
    paths_for,
)

# a path's answer, or None when there was none (refused, reset, timed out)
Get = Callable[[str], Awaitable[Reply | None]]


async def read_engine(url: str, get: Get) -> EngineInfo:
    """What the engine at ``url`` says about itself."""
    replies: dict[str, Reply | None] = {MODELS: await get(MODELS)}
    first = replies[MODELS]
    doc = None
    if first is not None and first.status == 200:
        try:
            doc = json.loads(first.body)
        except ValueError:
            doc = None
    for path in paths_for(flavor_of(doc)):
        if path == GET_SERVER_INFO:
            found = replies.get(SERVER_INFO)
            if found is not None and found.status != 404:
                continue
        replies[path] = await get(path)
    return engine_info(url, replies)
