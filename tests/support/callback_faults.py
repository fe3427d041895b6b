"""``router.app:app`` with a bug planted in the callback path, for tests of its exception
paths: ``uvicorn tests.support.callback_faults:app`` with ``CALLBACK_TEST_FAULT``:

- ``send``: the callback path's ``OriginPool.head`` raises (after the client is watched,
  before anything is sent upstream);
- ``answer``: building the answer's headers raises (after the upstream's head is in);
- ``late_open``: not a bug but an order of events: a connection the callback path opens
  (``OriginPool.connect_soon``) is handed to it only once the backend's end of it is read
  (or after 2 s), as on a loop busy enough that the backend's FIN beats the connect's done
  callback (review-s13 H1: every time with the loop busy 2 ms a turn).

The coroutine path's own calls are left alone, so a stream it serves still works.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from typing import Any

import router.forward.callback as callback
from router.app import app
from router.upstream.client import Connection, OriginPool

__all__ = ["app"]

FAULT = os.environ.get("CALLBACK_TEST_FAULT", "")


def _planted(*args: Any) -> Any:
    raise RuntimeError("a planted bug")


if FAULT == "send":
    _head = OriginPool.head

    def head(self: OriginPool, *args: Any) -> Any:
        if sys._getframe(1).f_globals["__name__"] == callback.__name__:  # (its call only)
            _planted()
        return _head(self, *args)

    OriginPool.head = head  # type: ignore[method-assign,assignment]
elif FAULT == "answer":
    setattr(callback, "_deciding_as_header", _planted)  # noqa: B010 (a name mypy knows the type of)
elif FAULT == "late_open":

    async def _late(pool: OriginPool, timeout: float) -> Connection:
        conn = await pool._connect(timeout)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2):
                while conn.error is None:
                    await conn._wait()
        return conn

    def connect_soon(self: OriginPool, timeout: float) -> asyncio.Task[Connection]:
        return self.loop.create_task(_late(self, timeout))

    OriginPool.connect_soon = connect_soon  # type: ignore[method-assign]
