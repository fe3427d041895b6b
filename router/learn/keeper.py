"""Keeps the crossover current, and is its one owner.

Feeds served requests to the learner, moves the crossover one step at a time (``update``, on the
router's timer: ``router.lifecycle``), swaps in a table an operator PUTs, and pins the crossover
an operator sets (``PUT /router/crossover`` or ``CROSSOVER``): a pinned crossover is not learned
over until a new table is put. Routing reads ``crossover``, ``no_crossover`` and ``gain`` from
here: with no crossover measured (a table's ``"crossover": null``, or what learning finds),
``crossover`` is the highest level measured, which routing holds each speculative engine to
before placing the rest by load, and ``no_crossover`` is True. The shell
around ``router.learn.learner`` and ``router.learn.models``; its one piece of I/O is
``persist``, the table file's atomic write (``router.decide.table.save``).

It reads live state only through the interfaces below (``Counts``, ``Seen``, ``Board``,
``Finished``), which the tracker, the poller's loads, the shared board and the proxy's record
of a request provide: this package imports nothing of them.

Under ``serve --workers N`` every worker has a keeper, but the crossover in force lives on a
``CrossoverBoard`` in shared memory, so all route with one value: any worker's keeper can pin
it or put a table there, only the leader's (worker 0) learns it over time and writes the
table file. The others still learn the curves and models their own requests show.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple, Protocol

from router.decide import table as tables
from router.decide.predict import Gain, PoolModel
from router.decide.snapshot import Traffic
from router.decide.table import Source, Table, no_crossover_advice
from router.learn.learner import Held, LearnConfig, Learner, marginal_gain
from router.learn.models import EngineModels, Sample
from router.pools import POOLS, SPECULATIVE, Pool
from router.settings import DEFAULT_CROSSOVER, Settings


class Counts(Protocol):
    """The in-flight counts a sample is measured against (``router.account.inflight``)."""

    @property
    def pool_of(self) -> Mapping[str, Pool]: ...

    def area(self, backend: str, now: float) -> float: ...

    def stalls(self, backend: str, first: float, per_token: float, end: float) -> float: ...


class Seen(Protocol):
    """What an engine last reported (``router.health.poller.EngineLoad``)."""

    @property
    def accept_length(self) -> float | None: ...

    @property
    def cap(self) -> int | None: ...


class Board(Protocol):
    """The crossover in force for every worker (``router.account.shared.CrossoverBoard``)."""

    def publish(self, value: int, source: Source, pinned: bool, no_crossover: bool) -> None: ...

    def read(self) -> Posted | None: ...


class Posted(NamedTuple):
    """The crossover in force: its value, where it came from, whether an operator pinned it,
    and whether it is no crossover (``value``: the highest level measured)."""

    value: int
    source: Source
    pinned: bool
    no_crossover: bool = False


class Tokens(Protocol):
    """A request's token counts (``router.upstream.stream.Usage``)."""

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def completion_tokens(self) -> int: ...


class Finished(Protocol):
    """What the keeper reads of a finished request (``router.account.outcome.Outcome``)."""

    @property
    def started(self) -> float: ...
    @property
    def stream(self) -> bool: ...
    @property
    def pool(self) -> Pool | None: ...
    @property
    def backend(self) -> str | None: ...
    @property
    def status(self) -> int: ...
    @property
    def first_byte(self) -> float | None: ...
    @property
    def area_first(self) -> float | None: ...
    @property
    def ended(self) -> float: ...
    @property
    def area_end(self) -> float | None: ...
    @property
    def area_at(self) -> float | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def client_gone(self) -> bool: ...
    @property
    def usage(self) -> Tokens | None: ...
    @property
    def sampling(self) -> bool: ...
    @property
    def prompt_chars(self) -> int: ...
    @property
    def load_at_start(self) -> int: ...
    @property
    def joined(self) -> int: ...
    @property
    def prefill_share(self) -> float: ...


log = logging.getLogger("spec_router.tuning")

# A relative change in acceptance length that counts as news (re-target without waiting).
TAU_CHANGE = 0.03


def _held(held: Held) -> str:
    return f"none up to {held.value}" if held.no_crossover else str(held.value)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class CrossoverKeeper:
    def __init__(
        self,
        settings: Settings,
        tracker: Counts,
        loads: Mapping[str, Seen],
        table: Table | None,
        clock: Callable[[], float] = time.monotonic,
        board: Board | None = None,
        leader: bool = True,
    ) -> None:
        self.settings = settings
        self.board = board
        self.leader = leader
        self.tracker = tracker
        self._loads = loads  # the poller's: engine-reported acceptance lengths
        self.clock = clock
        self._posted: Posted
        if settings.crossover is not None:  # an explicit CROSSOVER is not learned over
            self._posted = Posted(settings.crossover, "configured", True)
        elif table is not None:
            self._posted = Posted(table.limit, table.source, False, table.crossover is None)
        else:
            self._posted = Posted(DEFAULT_CROSSOVER, "default", False)
        if board is not None and board.read() is None:
            # the first worker up publishes; the rest (and a restarted one) take what is there
            board.publish(*self._posted)
        self.table_path = settings.table_path if leader else None
        self.start_table = table  # what learning started from (loaded or PUT), for the live page
        self.learning = settings.learn
        self.learner = self._learner(table)
        self.engines = EngineModels(table, settings.learn_decay)
        self._gain: Gain | None = None
        # runs the observations still queued for a later turn (router.forward.ended) before
        # the keeper learns from, shows, replaces or persists what it has observed
        self.settle: Callable[[], None] = lambda: None
        self._models: dict[Pool, PoolModel] | None = None
        self._tau_used: float | None = None
        self._last_persist = clock()
        self._publish_gain()

    # -- what routing reads -----------------------------------------------------------------------
    @property
    def crossover(self) -> int:
        """Requests per speculative engine routing holds to: the crossover, or with
        ``no_crossover`` the highest level measured."""
        return self._state().value

    @property
    def no_crossover(self) -> bool:
        """True when no crossover was measured (see ``crossover``)."""
        return self._state().no_crossover

    @property
    def source(self) -> Source:
        return self._state().source

    @property
    def pinned(self) -> bool:
        return self._state().pinned

    def _state(self) -> Posted:
        state = self.board.read() if self.board is not None else None
        return state if state is not None else self._posted

    @property
    def gain(self) -> Gain | None:
        return self._gain

    @property
    def models(self) -> Mapping[Pool, PoolModel] | None:
        """The slo policy's view of both pools, fixed at the last update (cheap to read)."""
        return self._models

    @property
    def traffic(self) -> Traffic:
        e = self.engines
        return Traffic(e.mean_output.value, e.tokens_per_char.value, e.output_spread())

    def status(self) -> dict[str, Any]:
        learner = self.learner
        target = learner.target()
        return {
            "enabled": self.learning,
            "pinned": self.pinned,
            # what the crossover moves toward: a crossover, or none up to a level
            "target": None if target is None or target.no_crossover else target.value,
            "target_no_crossover_up_to": target.value if target and target.no_crossover else None,
            "samples": {pool: learner.pools[pool].samples for pool in learner.pools},
            "acceptance_length": learner.tau,
            "reference_acceptance_length": learner.ref_tau,
        }

    def curves(self) -> dict[str, Any]:
        """Both pools' per-request decode tok/s against concurrency, in model time: the table
        learning started from (``start``) and what it has learned since (``learned``)."""
        self.settle()
        start = self.start_table
        learner = self.learner
        return {
            "start": None
            if start is None
            else {
                pool: [
                    (p.concurrency, p.decode_tps_p50)
                    for p in start.pool(pool).points
                    if p.decode_tps_p50 > 0
                ]
                for pool in POOLS
            },
            "start_source": None if start is None else start.source,
            "learned": {pool: points for pool, points in learner.speeds().items()},
            "time_scale": learner.time_scale,
            "acceptance_length": learner.tau,
            "reference_acceptance_length": learner.ref_tau,
        }

    def _learner(self, table: Table | None) -> Learner:
        s = self.settings
        cfg = LearnConfig(
            decay=s.learn_decay, max_step=s.learn_max_step, min_samples=s.learn_min_samples
        )
        return Learner(cfg, table)

    def _publish_gain(self) -> None:
        self._gain = marginal_gain(self.learner.curves())
        self._models = self.engines.models()

    def _set(self, posted: Posted) -> None:
        self._posted = posted
        if self.board is not None:
            self.board.publish(*posted)

    def no_crossover_status(
        self, speculative_engines: int | None = None, baseline_engines: int | None = None
    ) -> dict[str, Any] | None:
        """With no crossover measured: up to where, the margin there, and what follows
        (for ``/router/status`` and the live page); None while there is a crossover."""
        state = self._state()
        if not state.no_crossover:
            return None
        found = self.learner.crossing()
        start = self.start_table
        if found is not None and found.crossover is None:
            up_to, margin, reason = found.measured_up_to, found.margin, found.reason
        elif start is not None and start.crossover is None and start.measured_up_to:
            up_to, margin, reason = start.measured_up_to, start.margin, start.reason
        else:
            up_to, margin, reason = state.value, None, ""
        return {
            "measured_up_to": up_to,
            "margin": margin,
            "speculative_limit": state.value,
            "reason": reason,
            "message": f"no crossover measured up to {up_to}",
            "advice": no_crossover_advice(up_to, margin, speculative_engines, baseline_engines),
        }

    # -- input ----------------------------------------------------------------------------------
    def observe(self, out: Finished) -> None:
        """Outcome observer: a finished, complete answer becomes a learning sample (both
        halves below, at once: how the keeper observes when nothing is deferred)."""
        if self._learns(out):
            self._record_traffic(out)
            self._record_curves(out)

    def observe_traffic(self, out: Finished) -> None:
        """Outcome observer, run at once when the rest is deferred (router.forward.ended):
        the traffic averages routing reads per request (``traffic``) never lag."""
        if self._learns(out):
            self._record_traffic(out)

    def observe_curves(self, out: Finished) -> None:
        """Outcome observer, the deferred rest of ``observe`` (its curves and stalls)."""
        if self._learns(out):
            self._record_curves(out)

    def _learns(self, out: Finished) -> bool:
        usage = out.usage
        return not (
            not self.learning
            or out.backend is None
            or out.pool is None
            or usage is None
            or out.status != 200
            or out.client_gone
            or out.error is not None
        )

    @staticmethod
    def _decoded(out: Finished) -> bool:
        """A stream whose decode was timed: a first byte, then at least one more token."""
        usage = out.usage
        first = out.first_byte
        return (
            out.stream
            and first is not None
            and out.area_first is not None
            and usage is not None
            and usage.completion_tokens >= 2
            and out.ended > first
        )

    def _record_traffic(self, out: Finished) -> None:
        usage = out.usage
        assert usage is not None and out.pool is not None
        self.engines.record_traffic(
            out.pool,
            out.sampling,
            usage.prompt_tokens,
            out.prompt_chars,
            usage.completion_tokens,
        )

    def _record_curves(self, out: Finished) -> None:
        usage = out.usage
        assert usage is not None and out.pool is not None and out.backend is not None
        first = out.first_byte
        decode = spt = concurrency = stall = 0.0
        scale = self.learner.time_scale
        area, at = out.area_end, out.area_at
        # (the integral as its lease went, ``Outcome.lease_ends``: never extrapolated
        # afterwards; its mean runs to that moment, when the request itself last counted)
        if (
            area is not None
            and at is not None
            and first is not None
            and at > first
            and self._decoded(out)
        ):
            assert out.area_first is not None
            decode = out.ended - first
            concurrency = (area - out.area_first) / (at - first)
            # in flight is not running: past the engine's cap the rest wait in its queue
            seen = self._loads.get(out.backend)
            if seen is not None and seen.cap is not None:
                concurrency = min(concurrency, float(seen.cap))
            spt = decode / (usage.completion_tokens - 1)
            # the prefills that ran on its engine while it decoded, each stalling an iteration
            stall = self.tracker.stalls(out.backend, first, spt, out.ended)
            self.learner.record(
                out.pool, concurrency, spt, first - out.started, out.ended - out.started
            )
        ttft = (first - out.started) / scale if out.stream and first is not None else 0.0
        sample = Sample(
            out.pool,
            concurrency,
            spt / scale,
            ttft,
            out.sampling,
            usage.prompt_tokens,
            out.prompt_chars,
            usage.completion_tokens,
            out.load_at_start,
            out.prefill_share,
            stall,
            out.joined,
        )
        self.engines.record_curves(sample)

    def _accept_length(self) -> float | None:
        # (an idle engine reports 0: no speculation happened, not an acceptance of 0)
        values = [
            seen.accept_length
            for url, seen in self._loads.items()
            if self.tracker.pool_of.get(url) == SPECULATIVE
            and seen.accept_length is not None
            and seen.accept_length >= 1.0
        ]
        return sum(values) / len(values) if values else None

    # -- the operator -----------------------------------------------------------------------------
    def pin(self, value: int) -> None:
        """An operator's crossover: in force, and not learned over, until a new table."""
        self._set(Posted(value, "configured", True))
        log.info("crossover pinned at %d", value)

    def replace(self, raw: Any, *, publish: bool = True) -> Table:
        """Validate and apply a new table (raises ``TableError``; the old one stays then).

        The table's crossover takes over, and learning resumes from it: a pin is lifted.
        ``publish=False``: another worker took the table and set the board already; only
        this keeper's curves and models follow it.
        """
        table = tables.from_json(raw)
        self.settle()  # (what ended before the new table is learned by the old one)
        self.start_table = table
        self.learner = self._learner(table)
        self.engines = EngineModels(table, self.settings.learn_decay)
        self._tau_used = None
        posted = Posted(table.limit, table.source, False, table.crossover is None)
        if publish or self.board is None:
            self._set(posted)
        else:
            self._posted = posted
        self._publish_gain()
        self.persist()
        return table

    # -- the timer ------------------------------------------------------------------------------
    def update(self) -> int | None:
        """One learning step; returns the new crossover if it moved."""
        self.settle()
        tau = self._accept_length()
        self.learner.observe_accept(tau)
        self.engines.observe_accept(tau)
        changed = (
            tau is not None
            and self._tau_used is not None
            and abs(tau - self._tau_used) / self._tau_used > TAU_CHANGE
        )
        if tau is not None and (self._tau_used is None or changed):
            self._tau_used = tau
        self._publish_gain()
        state = self._state()
        if state.pinned or not self.learning or not self.leader:
            return None
        current = Held(state.value, state.no_crossover)
        new = self.learner.step(current, changed or self._tau_moved_since_seed())
        if new is None:
            return None
        target = self.learner.target()
        log.info(
            "crossover %s -> %s (learned; target %s, acceptance %s)",
            _held(current),
            _held(new),
            "n/a" if target is None else _held(target),
            "n/a" if tau is None else f"{tau:.2f}",
        )
        self._set(Posted(new.value, "learned", False, new.no_crossover))
        return new.value

    def _tau_moved_since_seed(self) -> bool:
        tau = self.learner.tau
        ref = self.learner.ref_tau
        return tau is not None and ref > 1.0 and abs(tau - ref) / ref > TAU_CHANGE

    def table(self) -> Table:
        self.settle()
        state = self._state()
        return self.learner.table(Held(state.value, state.no_crossover), state.source, _now_iso())

    def has_own_table(self) -> bool:
        """Whether the table this keeper would write is one of its own: it started from one
        (TABLE_PATH's, or an operator's PUT) or it has learned points for both pools. Without
        either the table is the default one, which is never written: a path it did not read a
        table from (TABLE_FRESH) gets a table once it has learned something worth reading at
        the next start."""
        if self.start_table is not None:
            return True
        return all(self.learner.pools[pool].points(1.0) for pool in POOLS)

    def persist(self) -> None:
        self.settle()  # (the queued samples may be what makes the table its own)
        if self.table_path is None or not self.has_own_table():
            return
        try:
            tables.save(self.table(), self.table_path)
        except OSError as exc:
            log.warning("cannot write the crossover table to %s: %s", self.table_path, exc)
        self._last_persist = self.clock()

    def persist_due(self) -> bool:
        """Whether ``PERSIST_INTERVAL`` has passed since the table was last written."""
        return self.clock() - self._last_persist >= self.settings.persist_interval
