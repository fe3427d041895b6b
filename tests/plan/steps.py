"""Counting the planner's work in steps, not seconds: the lines executed in ``router/plan``
while a call runs (``sys.settrace``), so a bound on work holds on any machine, loaded or not."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")


class OverBudget(AssertionError):
    """More lines ran in ``router/plan`` than the budget allows."""


def within(budget: int, fn: Callable[[], T]) -> tuple[T, int]:
    """``fn()`` and the lines it ran in ``router/plan``; raises ``OverBudget`` as soon as they
    pass ``budget`` (so a call that would not end fails instead of hanging)."""
    count = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
            if count > budget:
                raise OverBudget(f"over {budget} lines in router/plan")
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Any:
        return local if "/router/plan/" in frame.f_code.co_filename.replace("\\", "/") else None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        return fn(), count
    finally:
        sys.settrace(previous)
