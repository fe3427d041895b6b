"""``router.app:app`` with a bug planted in the callback path, for tests of its exception
paths: ``uvicorn tests.support.callback_faults:app`` with ``CALLBACK_TEST_FAULT``:

- ``send``: the callback path's ``OriginPool.head`` raises (after the client is watched,
  before anything is sent upstream);
- ``answer``: building the answer's headers raises (after the upstream's head is in).

The coroutine path's own calls are left alone, so a stream it serves still works.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import router.forward.callback as callback
from router.app import app
from router.upstream.client import OriginPool

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
