"""Machine-wide in-flight counts for ``spec-router serve --workers N``: one table, N writers.

The supervisor maps one anonymous shared region before it forks the workers. Each worker owns
one slot and is the only process that writes it, so the hot path takes no lock: a count is
one aligned 8-byte word, read and written whole. Readers sum a field over all slots. A worker
that dies leaves its slot to the supervisor, which folds what was in flight into the time
integral and zeroes the counts (``reclaim``) before a replacement takes the slot over.

The three words behind a backend's in-flight integral (count, integral, its time) change
together; a per-slot sequence number (a seqlock: odd while the owner writes) lets a reader
retry instead of mixing two states. Counts alone need no such care.

``SharedTracker`` is ``InflightTracker`` over this table: the same readers (routing, status,
metrics, the learner) see the machine's counts, and ``own_by_backend`` this worker's.

The header also carries the crossover in force, so that every worker routes with one value
(``CrossoverBoard``), and a sequence number for operator tables (``router.workers``).
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from router.account.inflight import InflightTracker
from router.decide.table import SOURCES, Source
from router.learn.keeper import Posted
from router.pools import POOLS, Pool

MAGIC = 0x5350_4543_524F_5554  # "SPECROUT"
WORD = 8
HEADER_WORDS = 8
H_MAGIC, H_SLOTS, H_BACKENDS, H_CROSSOVER, H_TABLE_SEQ = range(5)
# slot: sequence, owner pid, total, per pool (in flight, slow clients), then per backend
S_SEQ, S_PID, S_TOTAL = 0, 1, 2
S_POOL = 3
S_SLOW = S_POOL + len(POOLS)
S_BACKENDS = 8
B_IN, B_STARTED, B_AREA, B_SINCE = range(4)
B_WORDS = 4
# A reader gives up waiting for a consistent slot after this many tries: only a writer stopped
# between its two sequence writes (descheduled, or dead until reclaimed) holds it odd that long.
READ_TRIES = 100


def slot_words(backends: int) -> int:
    """Words per slot, rounded up to a 64-byte line so that two writers never share one."""
    words = S_BACKENDS + B_WORDS * backends
    return -(-words // 8) * 8


class SharedTable:
    """The region's layout and the reads and writes that are not one worker's hot path."""

    def __init__(self, buffer: Any, slots: int, backends: Sequence[tuple[Pool, str]]) -> None:
        self.buffer = buffer
        self.ints = memoryview(buffer).cast("q")
        self.floats = memoryview(buffer).cast("d")
        self.slots = slots
        self.backends = list(backends)
        self.index = {url: i for i, (_, url) in enumerate(self.backends)}
        self.stride = slot_words(len(self.backends))
        self.bases = tuple(HEADER_WORDS + w * self.stride for w in range(slots))

    @classmethod
    def create(cls, slots: int, backends: Sequence[tuple[Pool, str]]) -> SharedTable:
        """A zeroed anonymous shared mapping, inherited by processes forked after this."""
        size = (HEADER_WORDS + slots * slot_words(len(backends))) * WORD
        buffer = mmap.mmap(-1, size, flags=mmap.MAP_SHARED)
        table = cls(buffer, slots, backends)
        table.ints[H_MAGIC] = MAGIC
        table.ints[H_SLOTS] = slots
        table.ints[H_BACKENDS] = len(backends)
        return table

    def backend_word(self, slot: int, backend: int, field: int) -> int:
        return self.bases[slot] + S_BACKENDS + backend * B_WORDS + field

    def sum(self, offset: int) -> int:
        """One field summed over every slot (``offset`` within a slot)."""
        ints = self.ints
        return sum([ints[base + offset] for base in self.bases])

    def area(self, backend: int, now: float) -> float:
        """The machine's in-flight integral for one backend, up to ``now``."""
        total = 0.0
        ints, floats = self.ints, self.floats
        off = S_BACKENDS + backend * B_WORDS
        for base in self.bases:
            seq_at, b = base + S_SEQ, base + off
            for _ in range(READ_TRIES):
                seq = ints[seq_at]
                area, n, since = floats[b + B_AREA], ints[b + B_IN], floats[b + B_SINCE]
                if not seq & 1 and ints[seq_at] == seq:
                    break
            # (past READ_TRIES the writer is stopped mid-write -- descheduled, or dead until
            # reclaimed: what was read is at most one count's update off)
            total += area + n * (now - since) if n else area
        return total

    def claim(self, slot: int, pid: int) -> None:
        self.ints[self.bases[slot] + S_PID] = pid

    def reclaim(self, slot: int, now: float) -> int:
        """Release what a dead worker held: its in-flight requests ended ``now``. Returns how
        many it held. Only for a slot whose owner is gone (the caller reaped it)."""
        ints, floats, base = self.ints, self.floats, self.bases[slot]
        held = ints[base + S_TOTAL]
        ints[base + S_SEQ] |= 1  # odd: readers wait (it may be odd already, left mid-write)
        for i in range(len(self.backends)):
            b = base + S_BACKENDS + i * B_WORDS
            n = ints[b + B_IN]
            if n:
                floats[b + B_AREA] += n * (now - floats[b + B_SINCE])
            floats[b + B_SINCE] = now
            ints[b + B_IN] = 0
        for i in range(len(POOLS)):
            ints[base + S_POOL + i] = 0
            ints[base + S_SLOW + i] = 0
        ints[base + S_TOTAL] = 0
        ints[base + S_PID] = 0
        ints[base + S_SEQ] += 1
        return held

    def workers(self) -> list[dict[str, Any]]:
        """Each slot's owner and its share of the counts (for /router/status)."""
        ints = self.ints
        rows = []
        for slot, base in enumerate(self.bases):
            started = sum(
                ints[self.backend_word(slot, i, B_STARTED)] for i in range(len(self.backends))
            )
            rows.append(
                {
                    "worker": slot,
                    "pid": ints[base + S_PID] or None,
                    "in_flight": ints[base + S_TOTAL],
                    "by_pool": {p: ints[base + S_POOL + i] for i, p in enumerate(POOLS)},
                    # requests this slot's workers (a replacement continues it) ever sent on
                    "started": started,
                }
            )
        return rows

    # -- the header's shared values -------------------------------------------------------------
    @property
    def table_seq(self) -> int:
        return self.ints[H_TABLE_SEQ]

    def bump_table_seq(self) -> int:
        # (one writer at a time in practice: an operator's PUT; a lost bump would only delay)
        self.ints[H_TABLE_SEQ] += 1
        return self.ints[H_TABLE_SEQ]


class _Summed(Mapping[str, int]):
    """A field of every slot, summed on each read: the machine-wide count."""

    __slots__ = ("_ints", "_words")

    def __init__(self, table: SharedTable, offsets: dict[str, int]) -> None:
        self._ints = table.ints
        # per key, the word of each slot (routing reads these per request: a plain loop over
        # precomputed indices is the cheapest sum in CPython)
        self._words = {
            key: tuple(base + off for base in table.bases) for key, off in offsets.items()
        }

    def __getitem__(self, key: str) -> int:
        ints = self._ints
        total = 0
        for word in self._words[key]:
            total += ints[word]
        return total

    def __iter__(self) -> Iterator[str]:
        return iter(self._words)

    def __len__(self) -> int:
        return len(self._words)


class _Own(Mapping[str, int]):
    """A field of one slot: this worker's share."""

    __slots__ = ("_ints", "_words")

    def __init__(self, table: SharedTable, words: dict[str, int]) -> None:
        self._ints = table.ints
        self._words = words

    def __getitem__(self, key: str) -> int:
        return self._ints[self._words[key]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._words)

    def __len__(self) -> int:
        return len(self._words)


class SharedTracker(InflightTracker):
    """``InflightTracker`` whose counts live in ``table``; this worker writes slot ``slot``.

    A slot taken over from a dead worker keeps its ``started`` counts and integrals (reclaim
    zeroed only what was in flight), so the machine's totals never step back.
    """

    def __init__(
        self,
        backends: Sequence[tuple[Pool, str]],
        table: SharedTable,
        slot: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(backends, clock)
        if [url for _, url in backends] != [url for _, url in table.backends]:
            raise ValueError("the shared table was made for other backends")
        self.table = table
        self.slot = slot
        self._ints, self._floats = table.ints, table.floats
        base = table.bases[slot]
        self._seq_w = base + S_SEQ
        self._total_w = base + S_TOTAL
        self._pool_w = {pool: base + S_POOL + i for i, pool in enumerate(POOLS)}
        self._slow_w = {pool: base + S_SLOW + i for i, pool in enumerate(POOLS)}
        idx = table.index
        # per backend: (its in-flight word, its pool's in-flight word), and the rest
        self._words = {
            url: (table.backend_word(slot, idx[url], B_IN), self._pool_w[pool])
            for pool, url in backends
        }
        self._started_w = {url: table.backend_word(slot, idx[url], B_STARTED) for url in idx}
        self._area_w = {url: table.backend_word(slot, idx[url], B_AREA) for url in idx}
        self._since_w = {url: table.backend_word(slot, idx[url], B_SINCE) for url in idx}
        in_off = {url: S_BACKENDS + i * B_WORDS + B_IN for url, i in idx.items()}
        started_off = {url: S_BACKENDS + i * B_WORDS + B_STARTED for url, i in idx.items()}
        self.by_backend = _Summed(table, in_off)
        self.started = _Summed(table, started_off)
        self.by_pool = _Summed(table, {p: S_POOL + i for i, p in enumerate(POOLS)})
        self.slow_clients = _Summed(table, {p: S_SLOW + i for i, p in enumerate(POOLS)})
        self.own_by_backend = _Own(table, {url: words[0] for url, words in self._words.items()})
        self._idx = idx
        table.claim(slot, os.getpid())

    @property
    def total(self) -> int:
        return self.table.sum(S_TOTAL)

    def area(self, backend: str, now: float) -> float:
        return self.table.area(self._idx[backend], now)

    def _add(self, backend: str, delta: int) -> None:
        ints, floats = self._ints, self._floats
        in_w, pool_w = self._words[backend]
        area_w, since_w = self._area_w[backend], self._since_w[backend]
        now = self.clock()
        ints[self._seq_w] += 1
        floats[area_w] += ints[in_w] * (now - floats[since_w])
        floats[since_w] = now
        ints[in_w] += delta
        ints[self._seq_w] += 1
        ints[pool_w] += delta

    def _open(self, backend: str) -> None:
        self._ints[self._total_w] += 1
        self._add(backend, 1)
        self._ints[self._started_w[backend]] += 1

    def _move(self, old: str, new: str) -> None:
        self._add(old, -1)
        self._add(new, 1)
        self._ints[self._started_w[new]] += 1

    def _close(self, backend: str, slow: bool) -> None:
        self._add(backend, -1)
        self._ints[self._total_w] -= 1
        if slow:
            self._ints[self._slow_w[self.pool_of[backend]]] -= 1

    def _slow_client(self, backend: str) -> None:
        self._ints[self._slow_w[self.pool_of[backend]]] += 1


# -- the crossover in force, one value for every worker -------------------------------------
_PINNED = 1 << 40
_SET = 1 << 41
_NONE = 1 << 42  # no crossover measured: the value is the highest level measured


class CrossoverBoard:
    """The crossover every worker routes with, in one header word (read and written whole):
    its value, where it came from, whether an operator pinned it, and whether it is no
    crossover (none measured up to the value). 0: nothing published."""

    def __init__(self, table: SharedTable) -> None:
        self._ints = table.ints

    def publish(self, value: int, source: Source, pinned: bool, no_crossover: bool) -> None:
        word = _SET | (value & 0xFFFF_FFFF) | (SOURCES.index(source) << 32)
        word |= (_PINNED if pinned else 0) | (_NONE if no_crossover else 0)
        self._ints[H_CROSSOVER] = word

    def read(self) -> Posted | None:
        word = self._ints[H_CROSSOVER]
        if not word & _SET:
            return None
        return Posted(
            word & 0xFFFF_FFFF,
            SOURCES[(word >> 32) & 0xFF],
            bool(word & _PINNED),
            bool(word & _NONE),
        )
