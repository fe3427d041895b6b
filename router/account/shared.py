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

import contextlib
import fcntl
import mmap
import os
import tempfile
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from router.account.inflight import InflightTracker, PrefillLog
from router.decide.table import SOURCES, Source
from router.learn.keeper import Posted
from router.members.member import ACTIVE, DRAINING, Member
from router.members.member import SOURCES as MEMBER_SOURCES
from router.members.member import Source as MemberSource
from router.members.store import Full, NotMember, refuse_join
from router.pools import POOLS, Pool
from router.settings import MAX_URL_BYTES

MAGIC = 0x5350_4543_524F_5554  # "SPECROUT"
WORD = 8
HEADER_WORDS = 8
H_MAGIC, H_SLOTS, H_BACKENDS, H_CROSSOVER, H_TABLE_SEQ, H_MEMBERS_SEQ, H_INCARNATIONS = range(7)
# slot: sequence, owner pid, total, per pool (in flight, slow clients), the membership
# generation this worker applied, then per backend place
S_SEQ, S_PID, S_TOTAL = 0, 1, 2
S_POOL = 3
S_SLOW = S_POOL + len(POOLS)
S_ACK = 7
S_BACKENDS = 8
B_IN, B_STARTED, B_AREA, B_SINCE = range(4)
B_WORDS = 4
# member records (one per backend place, after the slots): state, pool, incarnation, when it
# joined, started draining and is cut, the generation its place was freed at, its source,
# the lengths of its URL and name, then the URL's and the name's bytes
M_STATE, M_POOL, M_INCARNATION, M_JOINED, M_DRAIN_SINCE, M_DEADLINE, M_RETIRED, M_SOURCE = range(8)
M_URL_LEN, M_NAME_LEN = 8, 9
M_URL = 10
TEXT_WORDS = 32  # 256 bytes each for the URL and the name
M_NAME = M_URL + TEXT_WORDS
M_WORDS = 80  # (74 used, rounded up to whole cache lines)
FREE, ACTIVE_CODE, DRAINING_CODE = 0, 1, 2
# A reader gives up waiting for a consistent slot after this many tries: only a writer stopped
# between its two sequence writes (descheduled, or dead until reclaimed) holds it odd that long.
READ_TRIES = 100
assert MAX_URL_BYTES <= TEXT_WORDS * WORD


def slot_words(backends: int) -> int:
    """Words per slot, rounded up to a 64-byte line so that two writers never share one."""
    words = S_BACKENDS + B_WORDS * backends
    return -(-words // 8) * 8


class SharedTable:
    """The region's layout and the reads and writes that are not one worker's hot path.

    It has room for ``capacity`` backends (SPEC_ROUTER_MAX_BACKENDS): each member of either
    pool holds one place, the same in every slot, for as long as it is a member. The members
    themselves are records after the slots, written under a lock (``writing``: an advisory
    lock on a file every process inherited) with a sequence number readers check (even when
    stable; the membership's generation).
    """

    def __init__(self, buffer: Any, slots: int, capacity: int, lock: int) -> None:
        self.buffer = buffer
        self.ints = memoryview(buffer).cast("q")
        self.floats = memoryview(buffer).cast("d")
        self.slots = slots
        self.capacity = capacity
        self.stride = slot_words(capacity)
        self.bases = tuple(HEADER_WORDS + w * self.stride for w in range(slots))
        self.records = HEADER_WORDS + slots * self.stride
        self._lock = lock  # a file descriptor: POSIX record locks are per process, inherited or not

    @classmethod
    def create(
        cls, slots: int, backends: Sequence[tuple[Pool, str]] = (), capacity: int | None = None
    ) -> SharedTable:
        """A zeroed anonymous shared mapping, inherited by processes forked after this, with
        ``backends`` as its first members (the configured ones)."""
        capacity = max(capacity or 0, len(backends), 1)
        words = HEADER_WORDS + slots * slot_words(capacity) + capacity * M_WORDS
        buffer = mmap.mmap(-1, words * WORD, flags=mmap.MAP_SHARED)
        fd, path = tempfile.mkstemp(prefix="spec-router-members-")
        os.unlink(path)  # (the open descriptor is all the lock needs; children inherit it)
        table = cls(buffer, slots, capacity, fd)
        weakref.finalize(table, os.close, fd)
        table.ints[H_MAGIC] = MAGIC
        table.ints[H_SLOTS] = slots
        table.ints[H_BACKENDS] = capacity
        now = time.monotonic()
        for pool, url in backends:
            table.join(pool, url, "static", None, now)
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
        many it held. Only for a slot whose owner is gone (the caller reaped it). What it
        kept of backends that are no longer members goes too, so a place given to a new
        member starts from nothing."""
        ints, floats, base = self.ints, self.floats, self.bases[slot]
        held = ints[base + S_TOTAL]
        ints[base + S_SEQ] |= 1  # odd: readers wait (it may be odd already, left mid-write)
        for i in range(self.capacity):
            b = base + S_BACKENDS + i * B_WORDS
            if ints[self.records + i * M_WORDS + M_STATE] == FREE:
                for field in range(B_WORDS):
                    ints[b + field] = 0
                continue
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
            started = sum(ints[self.backend_word(slot, i, B_STARTED)] for i in range(self.capacity))
            rows.append(
                {
                    "worker": slot,
                    "pid": ints[base + S_PID] or None,
                    "in_flight": ints[base + S_TOTAL],
                    "by_pool": {p: ints[base + S_POOL + i] for i, p in enumerate(POOLS)},
                    # requests this slot's workers (a replacement continues it) ever sent on
                    "started": started,
                    # the membership generation it last applied
                    "membership_generation": ints[base + S_ACK],
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

    # -- the members ------------------------------------------------------------------------------
    @property
    def generation(self) -> int:
        """The membership's sequence number: even when stable, odd while being written."""
        return self.ints[H_MEMBERS_SEQ]

    def read_members(self) -> tuple[int, tuple[Member, ...], dict[str, int]]:
        """The generation, the members in the order they joined, and each one's place."""
        ints = self.ints
        tries = 0
        while True:
            seq = ints[H_MEMBERS_SEQ]
            if seq & 1:  # a writer holds the lock, for microseconds
                tries += 1
                if tries % READ_TRIES == 0:
                    self._mend()
                time.sleep(0)
                continue
            found = [(self._member(i), i) for i in range(self.capacity) if self._state(i)]
            if ints[H_MEMBERS_SEQ] == seq:
                break
        found.sort(key=lambda pair: pair[0].incarnation)
        return seq, tuple(m for m, _ in found), {m.url: i for m, i in found}

    def place_of(self, url: str) -> int:
        _, _, places = self.read_members()
        try:
            return places[url]
        except KeyError:
            raise NotMember(f"{url} is not a backend of either pool") from None

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the membership lock, with the sequence number odd, for one change."""
        fd = self._lock
        fcntl.lockf(fd, fcntl.LOCK_EX)
        try:
            self.ints[H_MEMBERS_SEQ] |= 1  # (odd already if a writer died mid-change)
            try:
                yield
            finally:
                self.ints[H_MEMBERS_SEQ] += 1
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN)

    def join(
        self, pool: Pool, url: str, source: MemberSource, name: str | None, now: float
    ) -> Member:
        with self.writing():
            _, members, places = self._read_locked()
            current = next((m for m in members if m.url == url), None)
            if current is not None:
                refused = refuse_join(current, pool)
                if refused is not None:
                    raise refused
                i = places[url]
                r = self.records + i * M_WORDS
                self.ints[r + M_STATE] = ACTIVE_CODE
                self.floats[r + M_DRAIN_SINCE] = 0.0
                self.floats[r + M_DEADLINE] = 0.0
                self.ints[r + M_SOURCE] = MEMBER_SOURCES.index(source)
                self._write_text(r + M_NAME_LEN, r + M_NAME, name or "")
                return self._member(i)
            place = self._free_place()
            if place is None:
                raise Full(
                    f"the router holds at most {self.capacity} backends "
                    "(SPEC_ROUTER_MAX_BACKENDS), draining ones included"
                )
            i = place
            self.ints[H_INCARNATIONS] += 1
            r = self.records + i * M_WORDS
            self.ints[r + M_POOL] = POOLS.index(pool)
            self.ints[r + M_INCARNATION] = self.ints[H_INCARNATIONS]
            self.floats[r + M_JOINED] = now
            self.floats[r + M_DRAIN_SINCE] = 0.0
            self.floats[r + M_DEADLINE] = 0.0
            self.ints[r + M_SOURCE] = MEMBER_SOURCES.index(source)
            self._write_text(r + M_URL_LEN, r + M_URL, url)
            self._write_text(r + M_NAME_LEN, r + M_NAME, name or "")
            self.ints[r + M_STATE] = ACTIVE_CODE
            return self._member(i)

    def drain(self, url: str, now: float, deadline: float) -> Member:
        with self.writing():
            _, members, places = self._read_locked()
            current = next((m for m in members if m.url == url), None)
            if current is None:
                raise NotMember(f"{url} is not a backend of either pool")
            i = places[url]
            if current.active:
                r = self.records + i * M_WORDS
                self.floats[r + M_DRAIN_SINCE] = now
                self.floats[r + M_DEADLINE] = deadline
                self.ints[r + M_STATE] = DRAINING_CODE
            return self._member(i)

    def remove(self, url: str) -> None:
        with self.writing():
            _, _, places = self._read_locked()
            i = places.get(url)
            if i is None:
                return
            r = self.records + i * M_WORDS
            self.ints[r + M_STATE] = FREE
            # (the generation this change ends at: a place is given again only once every
            # worker has applied it, and so let go of what it counted there)
            self.ints[r + M_RETIRED] = self.ints[H_MEMBERS_SEQ] + 1

    def _mend(self) -> None:
        """The sequence stayed odd: wait for the lock, and if it is still odd then, its
        writer died mid-change (the lock went with it): make it even again."""
        fd = self._lock
        fcntl.lockf(fd, fcntl.LOCK_EX)
        try:
            if self.ints[H_MEMBERS_SEQ] & 1:
                self.ints[H_MEMBERS_SEQ] += 1
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN)

    # -- (the members' records) ---------------------------------------------------------------
    def _state(self, i: int) -> int:
        return self.ints[self.records + i * M_WORDS + M_STATE]

    def _read_locked(self) -> tuple[int, tuple[Member, ...], dict[str, int]]:
        found = [(self._member(i), i) for i in range(self.capacity) if self._state(i)]
        return self.ints[H_MEMBERS_SEQ], tuple(m for m, _ in found), {m.url: i for m, i in found}

    def _member(self, i: int) -> Member:
        ints, floats = self.ints, self.floats
        r = self.records + i * M_WORDS
        draining = ints[r + M_STATE] == DRAINING_CODE
        name = self._read_text(r + M_NAME_LEN, r + M_NAME)
        return Member(
            pool=POOLS[ints[r + M_POOL]],
            url=self._read_text(r + M_URL_LEN, r + M_URL),
            source=MEMBER_SOURCES[ints[r + M_SOURCE]],
            name=name or None,
            incarnation=ints[r + M_INCARNATION],
            joined=floats[r + M_JOINED],
            state=DRAINING if draining else ACTIVE,
            drain_since=floats[r + M_DRAIN_SINCE] if draining else None,
            drain_deadline=floats[r + M_DEADLINE] if draining else None,
        )

    def _read_text(self, length_word: int, at: int) -> str:
        n = self.ints[length_word]
        start = at * WORD
        return bytes(self.buffer[start : start + n]).decode()

    def _write_text(self, length_word: int, at: int, text: str) -> None:
        data = text.encode()
        if len(data) > TEXT_WORDS * WORD:
            raise ValueError(f"longer than {TEXT_WORDS * WORD} bytes: {text[:60]}...")
        start = at * WORD
        self.buffer[start : start + len(data)] = data
        self.ints[length_word] = len(data)

    def _free_place(self) -> int | None:
        """A free place every worker has let go of (the one freed longest ago first)."""
        ints = self.ints
        applied = min(ints[base + S_ACK] for base in self.bases)
        best: tuple[int, int] | None = None
        for i in range(self.capacity):
            r = self.records + i * M_WORDS
            if ints[r + M_STATE] != FREE:
                continue
            retired = ints[r + M_RETIRED]
            if retired <= applied and (best is None or retired < best[0]):
                best = (retired, i)
        return None if best is None else best[1]


class SharedStore:
    """``router.members.store.Store`` over the shared table: every worker's roster reads the
    same members; any worker may change them (the admin API), under the table's lock."""

    def __init__(self, table: SharedTable, slot: int | None = None) -> None:
        self.table = table
        self.slot = slot  # this worker's slot: where it acknowledges what it applied

    @property
    def capacity(self) -> int:
        return self.table.capacity

    @property
    def generation(self) -> int:
        return self.table.generation

    def read(self) -> tuple[int, tuple[Member, ...]]:
        generation, members, _ = self.table.read_members()
        return generation, members

    def join(
        self, pool: Pool, url: str, source: MemberSource, name: str | None, now: float
    ) -> Member:
        return self.table.join(pool, url, source, name, now)

    def drain(self, url: str, now: float, deadline: float) -> Member:
        return self.table.drain(url, now, deadline)

    def remove(self, url: str) -> None:
        self.table.remove(url)

    def applied(self, generation: int) -> None:
        if self.slot is not None:
            self.table.ints[self.table.bases[self.slot] + S_ACK] = generation


class _Summed(Mapping[str, int]):
    """A field of every slot, summed on each read: the machine-wide count."""

    __slots__ = ("_ints", "_bases", "_words")

    def __init__(self, table: SharedTable, offsets: dict[str, int]) -> None:
        self._ints = table.ints
        self._bases = table.bases
        # per key, the word of each slot (routing reads these per request: a plain loop over
        # precomputed indices is the cheapest sum in CPython)
        self._words: dict[str, tuple[int, ...]] = {}
        for key, off in offsets.items():
            self.set(key, off)

    def set(self, key: str, offset: int) -> None:
        self._words[key] = tuple(base + offset for base in self._bases)

    def drop(self, key: str) -> None:
        self._words.pop(key, None)

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
        self._words = dict(words)

    def set(self, key: str, word: int) -> None:
        self._words[key] = word

    def drop(self, key: str) -> None:
        self._words.pop(key, None)

    def __getitem__(self, key: str) -> int:
        return self._ints[self._words[key]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._words)

    def __len__(self) -> int:
        return len(self._words)


class SharedTracker(InflightTracker):
    """``InflightTracker`` whose counts live in ``table``; this worker writes slot ``slot``.

    A slot taken over from a dead worker keeps its ``started`` counts and integrals (reclaim
    zeroed only what was in flight), so the machine's totals never step back. Backends join
    and leave with the members (``add``, ``remove``): each at its place in the table.
    """

    def __init__(
        self,
        backends: Sequence[tuple[Pool, str]],
        table: SharedTable,
        slot: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table = table
        self.slot = slot
        self._ints, self._floats = table.ints, table.floats
        base = table.bases[slot]
        self._seq_w = base + S_SEQ
        self._total_w = base + S_TOTAL
        self._pool_w = {pool: base + S_POOL + i for i, pool in enumerate(POOLS)}
        self._slow_w = {pool: base + S_SLOW + i for i, pool in enumerate(POOLS)}
        # per backend: (its in-flight word, its pool's in-flight word), and the rest
        self._words: dict[str, tuple[int, int]] = {}
        self._started_w: dict[str, int] = {}
        self._area_w: dict[str, int] = {}
        self._since_w: dict[str, int] = {}
        self._idx: dict[str, int] = {}
        self._in_sum = _Summed(table, {})
        self._started_sum = _Summed(table, {})
        self._own = _Own(table, {})
        # (what this slot kept of places no member holds is nothing: a replacement of a dead
        # worker starts clean there, as the supervisor's reclaim left it)
        _, members, places = table.read_members()
        held = set(places.values())
        for i in range(table.capacity):
            if i not in held:
                for field in range(B_WORDS):
                    self._ints[table.backend_word(slot, i, field)] = 0
        super().__init__(backends, clock)
        self.by_backend = self._in_sum
        self.started = self._started_sum
        self.by_pool = _Summed(table, {p: S_POOL + i for i, p in enumerate(POOLS)})
        self.slow_clients = _Summed(table, {p: S_SLOW + i for i, p in enumerate(POOLS)})
        self.own_by_backend = self._own
        table.claim(slot, os.getpid())

    def add(self, pool: Pool, url: str) -> None:
        """A member that joined, at its place in the table (raises ``NotMember`` if it has
        none)."""
        i = self.table.place_of(url)
        table, slot = self.table, self.slot
        self.pool_of[url] = pool
        self._idx[url] = i
        in_w = table.backend_word(slot, i, B_IN)
        self._words[url] = (in_w, self._pool_w[pool])
        self._started_w[url] = table.backend_word(slot, i, B_STARTED)
        self._area_w[url] = table.backend_word(slot, i, B_AREA)
        self._since_w[url] = table.backend_word(slot, i, B_SINCE)
        self._in_sum.set(url, S_BACKENDS + i * B_WORDS + B_IN)
        self._started_sum.set(url, S_BACKENDS + i * B_WORDS + B_STARTED)
        self._own.set(url, in_w)
        self._begun[url] = PrefillLog()
        self._lingering[url] = deque()
        self.flights[url] = {}

    def remove(self, url: str) -> None:
        """A member that left: nothing of it is in flight anywhere (its drain ended), and
        this slot's words at its place go back to 0 for whoever gets the place next."""
        held = self.by_backend.get(url, 0)
        if held:
            raise ValueError(f"{url} still has {held} request(s) in flight")
        i = self._idx.pop(url, None)
        if i is None:
            return
        ints = self._ints
        ints[self._seq_w] += 1
        for field in range(B_WORDS):
            ints[self.table.backend_word(self.slot, i, field)] = 0
        ints[self._seq_w] += 1
        for table in (self._words, self._started_w, self._area_w, self._since_w):
            table.pop(url, None)
        self._in_sum.drop(url)
        self._started_sum.drop(url)
        self._own.drop(url)
        self._begun.pop(url, None)
        self._lingering.pop(url, None)
        self.flights.pop(url, None)
        self.pool_of.pop(url, None)

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
