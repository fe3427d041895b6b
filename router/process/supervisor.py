"""``spec-router serve --workers N``: the supervisor of N router processes on one socket.

The supervisor (this process) binds the socket, maps the shared in-flight table
(``router.account.shared``) and forks the workers, which inherit both; each worker is a whole
router (proxy, health poller, keeper) under its own uvicorn, writing only its own slot of the
table. The kernel hands each new connection to whichever worker accepts it first.

The supervisor routes nothing. It announces the URL once every worker is serving; on SIGTERM
or SIGINT it passes SIGTERM on to each worker (which drains as one process would) and waits;
when a worker dies it reaps it, releases what the worker held in the table (``reclaim``: the
counts that worker's streams held return at once; their clients see the connection break),
and starts a replacement in the same slot. Worker 0 is the leader: the one that learns the
crossover over time and writes the table file (``router.learn.keeper``).

Metrics use prometheus-client's multiprocess mode: each worker writes its counters and
histograms to files in a directory of this run (``PROMETHEUS_MULTIPROC_DIR``), and a scrape of
any worker merges them (``MultiProcessCollector``); the live gauges come from the table.
"""

from __future__ import annotations

import errno
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from router.account.shared import SharedTable
from router.decide import table as tables
from router.members.targets import configured
from router.pools import BASELINE, SPECULATIVE
from router.serving import LISTENING_PREFIX, bind_socket, socket_url
from router.settings import Settings
from router.workers import WorkerContext

# A worker that dies sooner than this after it started is restarted only after a pause, so a
# worker that cannot start does not spin the machine.
QUICK_DEATH = 5.0
RESTART_PAUSE = 1.0
STOP_GRACE_EXTRA = 5.0  # past the workers' own graceful-shutdown window, SIGKILL them
PR_SET_PDEATHSIG = 1  # prctl(2)
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD}


def _log(message: str) -> None:
    print(f"spec-router: {message}", file=sys.stderr, flush=True)


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


@dataclass
class Supervisor:
    settings: Settings
    sock: socket.socket
    context_of: list[WorkerContext]
    log_level: str
    http: str
    graceful: float = 30.0
    children: dict[int, int] = field(default_factory=dict)  # pid -> slot
    born: dict[int, float] = field(default_factory=dict)  # slot -> when it was started
    restart_at: dict[int, float] = field(default_factory=dict)  # slot -> when to restart
    stopping: float | None = None  # when the stop began

    def run(self) -> int:
        ready_r, self._ready_w = os.pipe()
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # handled in the loop, woken by the fd
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        self._fds = (ready_r, wake_r, wake_w)
        ready: set[int] = set()
        announced = False
        try:
            for slot in range(len(self.context_of)):
                self._spawn(slot)
            buffer = b""
            while self.children or (self.stopping is None and self.restart_at):
                readable, _, _ = select.select([ready_r, wake_r], [], [], self._timeout())
                if ready_r in readable:
                    buffer += os.read(ready_r, 4096)
                    *lines, buffer = buffer.split(b"\n")
                    ready.update(int(line) for line in lines if line)
                if wake_r in readable:
                    _drain(wake_r)
                failed = self._reap(announced)
                if failed is not None:
                    return failed
                if not announced and len(ready) == len(self.context_of):
                    announced = True
                    print(f"{LISTENING_PREFIX}{socket_url(self.sock)}", flush=True)
                self._restart_due()
                self._force_if_late()
            return 0 if announced else 3
        finally:
            self._kill_all()
            signal.set_wakeup_fd(old_wakeup)
            for fd in (ready_r, self._ready_w, wake_r, wake_w):
                os.close(fd)

    # -- signals ----------------------------------------------------------------------------
    def _on_stop(self, signum: int, frame: object) -> None:
        if self.stopping is None:
            self.stopping = time.monotonic()
            self.restart_at.clear()
        for pid in list(self.children):
            _signal(pid, signal.SIGTERM)

    def _timeout(self) -> float:
        if self.restart_at:
            return max(0.0, min(self.restart_at.values()) - time.monotonic())
        return 1.0

    def _force_if_late(self) -> None:
        if self.stopping is not None and time.monotonic() - self.stopping > (
            self.graceful + STOP_GRACE_EXTRA
        ):
            for pid in list(self.children):
                _signal(pid, signal.SIGKILL)

    def _kill_all(self) -> None:
        for pid in list(self.children):
            _signal(pid, signal.SIGKILL)
        for pid in list(self.children):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            self._released(pid)

    # -- workers ----------------------------------------------------------------------------
    def _spawn(self, slot: int) -> None:
        ctx = self.context_of[slot]
        parent = os.getpid()
        # no stop signal between the fork and the new pid's entry in ``children``
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                code = self._become_worker(ctx, parent)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        self.children[pid] = slot
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        self.born[slot] = time.monotonic()
        ctx.table.claim(slot, pid)
        _log(f"worker {slot} started (pid {pid})")

    def _become_worker(self, ctx: WorkerContext, parent: int) -> int:
        signal.set_wakeup_fd(-1)
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        _die_with(parent)
        for fd in self._fds:
            os.close(fd)
        from router.process.worker import run_worker

        return run_worker(self.settings, self.sock, ctx, self._ready_w, self.log_level, self.http)

    def _reap(self, announced: bool) -> int | None:
        """Collect dead workers; a start-up failure returns the exit code to stop with."""
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid == 0:
                return None
            slot = self.children.get(pid)
            if slot is None:
                continue
            held = self._released(pid)
            if self.stopping is not None:
                continue
            _log(f"worker {slot} (pid {pid}) {_describe(status)}; released {held} in flight")
            if not announced:
                _log("a worker failed to start; stopping")
                self._on_stop(signal.SIGTERM, None)
                code = os.waitstatus_to_exitcode(status)
                return code if code > 0 else 3
            quick = time.monotonic() - self.born[slot] < QUICK_DEATH
            self.restart_at[slot] = time.monotonic() + (RESTART_PAUSE if quick else 0.0)
        return None

    def _released(self, pid: int) -> int:
        slot = self.children.pop(pid)
        ctx = self.context_of[slot]
        held = ctx.table.reclaim(slot, time.monotonic())
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, str(ctx.metrics_dir))
        return held

    def _restart_due(self) -> None:
        now = time.monotonic()
        for slot, at in list(self.restart_at.items()):
            if at <= now:
                del self.restart_at[slot]
                self._spawn(slot)


def _die_with(parent: int) -> None:
    """A worker whose supervisor was killed (so nobody reclaims or restarts) stops too: Linux
    sends it SIGTERM then (PR_SET_PDEATHSIG); elsewhere it outlives the supervisor."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError as exc:
        if exc.errno != errno.ESRCH:
            raise


def serve(settings: Settings, host: str, port: int, workers: int, log_level: str, http: str) -> int:
    """Run ``workers`` router processes on one socket until SIGTERM/SIGINT; an exit code."""
    path = settings.table_path
    if path is not None and path.exists():
        try:  # refuse a bad table once, here, rather than in every worker
            tables.load(path)
        except tables.TableError as exc:
            _log(f"SPEC_ROUTER_TABLE_PATH: {exc}")
            return 2
    try:
        sock = bind_socket(host, port)
    except OSError as exc:
        _log(f"cannot listen on {host}:{port}: {exc.strerror}")
        return 1
    rundir = Path(tempfile.mkdtemp(prefix="spec-router-"))
    (rundir / "metrics").mkdir()
    # Read by prometheus-client when a worker creates its metrics, and by the collector.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(rundir / "metrics")
    # the configured members, in the shared table before any worker starts (the leader then
    # discovers the rest, under SPEC_ROUTER_DISCOVERY=dns)
    seeds, _ = configured(
        {SPECULATIVE: settings.speculative_urls, BASELINE: settings.baseline_urls},
        settings.discovery,
    )
    table = SharedTable.create(workers, seeds, capacity=settings.max_backends)
    contexts = [WorkerContext(slot, workers, table, rundir) for slot in range(workers)]
    supervisor = Supervisor(settings, sock, contexts, log_level, http)
    try:
        return supervisor.run()
    finally:
        sock.close()
        shutil.rmtree(rundir, ignore_errors=True)
