"""The progress of a sweep on stderr: a bar redrawn in place on a terminal, plain lines when
the output goes to a file or a pipe (one per level, with its numbers, either way)."""

from __future__ import annotations

import time
from typing import TextIO

from router.decide.table import Point


class Progress:
    """A one-line bar redrawn in place on a terminal; one plain line per level otherwise."""

    WIDTH = 24

    def __init__(self, stream: TextIO, levels: int, tty: bool | None = None) -> None:
        self.stream, self.levels = stream, levels
        self.tty = stream.isatty() if tty is None else tty
        self.index = 0
        self.label = ""
        self.wanted = 1
        self.began = time.monotonic()
        self._drawn = 0.0

    def start(self, pool: str, concurrency: int, wanted: int, attempt: int = 0) -> None:
        self.index += attempt == 0
        again = " (again)" if attempt else ""
        self.label = f"[{self.index}/{self.levels}] {pool:<11} c={concurrency:<3}{again}"
        self.wanted = wanted
        self.update(0, force=True)

    def update(self, done: int, force: bool = False) -> None:
        now = time.monotonic()
        if not self.tty or (not force and now - self._drawn < 0.1 and done < self.wanted):
            return
        self._drawn = now
        filled = self.WIDTH * done // max(1, self.wanted)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        elapsed = _clock(now - self.began)
        self.stream.write(f"\r\x1b[2K{self.label} {bar} {done}/{self.wanted}  {elapsed}")
        self.stream.flush()

    def finish(self, point: Point, seconds: float, load: float | None = None) -> None:
        engine = "" if load is None else f"  engine load {load:5.1f}"
        line = (
            f"{self.label} decode p50 {point.decode_tps_p50:7.1f} tok/s  "
            f"total {point.total_tps:8.1f} tok/s  TTFT p50 {point.ttft_p50:7.3f} s  "
            f"e2e p50 {point.e2e_p50:7.2f} s  n={point.samples}{engine}  ({seconds:.1f} s)"
        )
        self.say(line)

    def say(self, line: str) -> None:
        self.stream.write(("\r\x1b[2K" if self.tty else "") + line + "\n")
        self.stream.flush()


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"
