"""A loop whose clock only the test moves, and a client transport that keeps what is written:
for driving uvicorn's HTTP protocols in process, as uvicorn's own tests/protocols/test_http.py
does (tests/fastpath)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class Timer:
    """A pending ``call_at``, fired by ``FakeLoop.advance``."""

    def __init__(self, when: float, callback: Callable[..., object], args: tuple[Any, ...]):
        self._when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """What the protocol asks of its loop, with a clock only ``advance`` moves; tasks run on
    the test's real loop."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[Timer] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> Timer:
        timer = Timer(when, callback, args)
        self.timers.append(timer)
        return timer

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Timer:
        return self.call_at(self.now + delay, callback, *args)

    def create_task(self, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        return asyncio.get_running_loop().create_task(coro, **kwargs)

    def pending(self) -> list[Timer]:
        return [t for t in self.timers if not t.cancelled]

    async def advance(self, seconds: float) -> None:
        """Move the clock, firing every timer that comes due on the way, in order, and letting
        the app's tasks run after each."""
        end = self.now + seconds
        while True:
            await settle()
            due = sorted((t for t in self.pending() if t.when() <= end), key=Timer.when)
            if not due:
                break
            timer = due[0]
            self.timers.remove(timer)
            self.now = max(self.now, timer.when())
            timer.callback(*timer.args)
        self.now = end
        await settle()


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


class Transport:
    """A client's transport that keeps what the server writes."""

    def __init__(self) -> None:
        self.buffer = b""
        self.closed = False
        self.eof = False
        self.read_paused = False
        self.protocol: Any = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(
            name, default
        )

    def write(self, data: bytes) -> None:
        assert not self.closed and not self.eof, "written after the end"
        self.buffer += data

    def take(self) -> bytes:
        data, self.buffer = self.buffer, b""
        return data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def pause_reading(self) -> None:
        self.read_paused = True

    def resume_reading(self) -> None:
        self.read_paused = False

    def get_protocol(self) -> Any:
        return self.protocol

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol
