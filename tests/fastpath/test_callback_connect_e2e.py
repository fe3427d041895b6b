"""The callback path opening its own upstream connections (``SPEC_ROUTER_CALLBACK_CONNECT``).

Where no kept-alive upstream connection is idle (the first requests, a wave past the idle ones,
those ``KEEPALIVE_EXPIRY`` closed), ``router.forward.callback`` opens one in a task of its own
and serves the stream from callbacks once it is open. ``uvicorn router.app:app`` over real
sockets, as in test_callback_e2e: every way the connect ends (open, refused, timed out, a backend
that closes it at once, a client that leaves meanwhile, a bug) releases the lease, the
connection and the stream, and a failure gets what the proxy's coroutine answers (its retries,
the OpenAI error shape). ``/router/status``'s ``fast_path.callback_connected`` counts the
connects.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.fastpath.test_callback_e2e import STREAM, Router, on_callbacks, stream, urls_of
from tests.fastpath.test_fast_path_e2e import post
from tests.support.bulk_upstream import DONE, HEAD, BulkUpstream, chunk, sse_event
from tests.support.http import wait_for
from tests.support.processes import Proc
from tests.support.threaded import EMPTY_JSON


def connected(router: Router) -> int:
    """Upstream connections the callback path opened so far."""
    return int(router.status()["fast_path"]["callback_connected"])


def open_connections(router: Router, pool: str | None = None) -> int:
    """Upstream connections open (to ``pool``'s backends, or to every backend)."""
    return sum(
        backend["connections"]["open"]
        for name, found in router.status()["pools"].items()
        if pool is None or name == pool
        for backend in found["backends"]
    )


def test_a_wave_after_the_idle_connections_expired_is_served_from_callbacks(
    sims: dict[str, Proc],
) -> None:
    """tail.py's spike: ~5 s into a run the idle connections at the bottom of the pool's
    stack have expired, and a wave of streams finds none idle. With ``KEEPALIVE_EXPIRY`` 0
    every idle connection has expired by the time a request looks: each stream of a wave
    opens its own from the callbacks and is served there (none handed to the coroutine), and
    the expired ones are closed when the pool next looks, none left behind."""
    router = on_callbacks(urls_of(sims), keepalive_expiry="0")
    try:
        assert stream(router)[0].status == 200
        wait_for(router.settled())
        assert (router.served(), router.handed(), connected(router)) == (1, 0, 1)
        wave = 32
        with ThreadPoolExecutor(wave) as pool:
            answers = list(pool.map(lambda _: stream(router), range(wave)))
        for response, body in answers:
            assert response.status == 200 and body.endswith(DONE)
        wait_for(router.settled())
        assert (router.served(), router.handed(), connected(router)) == (1 + wave, 0, 1 + wave)
        assert router.metric("spec_router_requests_total", code="200") == 1 + wave
        assert router.metric("spec_router_output_tokens_total") == (1 + wave) * 8
        # the wave's connections went back to their pools, expired: the next stream's look
        # closes every one of its pool's and opens its own, which alone stays
        response, _ = stream(router)
        assert response.status == 200
        wait_for(router.settled())
        assert open_connections(router, response.headers[b"x-spec-router-pool"].decode()) == 1
    finally:
        router.stop()


def test_a_wave_past_the_idle_connections_opens_only_what_it_lacks(sims: dict[str, Proc]) -> None:
    """With the default expiry a wave takes the idle connections first and opens the rest."""
    router = on_callbacks(urls_of(sims))
    try:
        assert stream(router)[0].status == 200
        wait_for(router.settled())
        assert open_connections(router) == 1
        wave = 16
        with ThreadPoolExecutor(wave) as pool:
            answers = list(pool.map(lambda _: stream(router), range(wave)))
        assert all(response.status == 200 for response, _ in answers)
        wait_for(router.settled())
        opened = connected(router) - 1
        assert opened == open_connections(router) - 1  # (each one kept alive: none leaked)
        assert wave - 1 <= opened <= wave  # (the idle one taken, if its pool was chosen)
        assert (router.served(), router.handed()) == (1 + wave, 0)
    finally:
        router.stop()


def test_a_refused_connect_is_retried_then_answered_in_the_openai_shape() -> None:
    """Both backends gone (their ports refuse): the connect from the callbacks fails, the
    proxy's coroutine takes it from there (a retry elsewhere, as after any attempt that
    failed to connect), and the client gets the coroutine's 503 in the OpenAI shape."""
    with contextlib.ExitStack() as stack:
        spec = stack.enter_context(BulkUpstream(size=10, events=1).running())
        base = stack.enter_context(BulkUpstream(size=10, events=1).running())
        router = on_callbacks((spec.url, base.url), keepalive_expiry="0", health_interval="30")
        try:
            stack.close()  # (the upstreams stop: nothing listens on their ports)
            response, body = stream(router)
            assert response.status == 503
            error = json.loads(body)["error"]
            assert error["message"] and "connect" in error["message"]
            assert (router.handed(), connected(router)) == (1, 1)
            wait_for(router.settled())
            assert router.metric("spec_router_retries_total", kind="connect") == 1
            assert router.metric("spec_router_upstream_errors_total", kind="connect") == 2
            assert open_connections(router) == 0
        finally:
            router.stop()


class GatedUpstream:
    """An upstream whose connects can be made to hang: ``hold`` stops it accepting and fills
    its accept queue (``listen(0)``), so the kernel drops the next connect's SYN and the
    connect waits; ``release`` accepts again. It answers GETs with ``{}``, a POST with a
    short stream or, while ``closing``, by closing the connection without a byte. One thread
    accepts, one serves each connection."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(0)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.closing = False
        self._open = threading.Event()
        self._open.set()
        self._accepted = 0
        self._changed = threading.Condition()
        self._fillers: list[socket.socket] = []
        self._conns: list[socket.socket] = []
        self._stopping = False

    @contextlib.contextmanager
    def running(self) -> Iterator[GatedUpstream]:
        accepting = threading.Thread(target=self._accept, daemon=True)
        accepting.start()
        try:
            yield self
        finally:
            self._stopping = True
            self._open.set()
            self._listener.shutdown(socket.SHUT_RDWR)  # (wakes the accept: OSError)
            accepting.join(10)
            self._listener.close()
            for sock in self._fillers + self._conns:
                sock.close()

    def hold(self) -> None:
        """From now on a new connect to it hangs (until ``release``)."""
        self._open.clear()
        with self._changed:
            before = self._accepted
        # the accept under way takes this one, then waits for the gate
        self._fillers.append(socket.create_connection(self._listener.getsockname()))
        with self._changed:
            self._changed.wait_for(lambda: self._accepted > before, 10)
        for _ in range(3):  # (one fills the queue of listen(0); the rest in case it holds more)
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(self._listener.getsockname())
            self._fillers.append(filler)

    def release(self) -> None:
        self._open.set()

    def _accept(self) -> None:
        while True:
            self._open.wait()
            try:
                conn, _ = self._listener.accept()
            except OSError:  # (stopping)
                return
            if self._stopping:
                conn.close()
                return
            with self._changed:
                self._accepted += 1
                self._changed.notify_all()
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        data = b""
        with contextlib.suppress(OSError):
            while True:
                while b"\r\n\r\n" not in data:
                    more = conn.recv(1 << 16)
                    if not more:
                        return
                    data += more
                head, _, data = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                while len(data) < length:
                    more = conn.recv(1 << 16)
                    if not more:
                        return
                    data += more
                data = data[length:]
                if not head.startswith(b"POST"):
                    conn.sendall(EMPTY_JSON)
                elif self.closing:
                    conn.close()
                    return
                else:
                    body = b"".join(chunk(sse_event(n, 64)) for n in range(3))
                    conn.sendall(HEAD + body + chunk(DONE) + b"0\r\n\r\n")


@pytest.fixture
def gated() -> Iterator[tuple[GatedUpstream, GatedUpstream]]:
    with GatedUpstream().running() as spec, GatedUpstream().running() as base:
        yield spec, base


@contextlib.contextmanager
def in_front_of(gated: tuple[GatedUpstream, GatedUpstream], **settings: str) -> Iterator[Router]:
    """The router in front of both, one stream served (its connection left idle expires at
    once: every later stream connects), nothing in flight; stopped after."""
    spec, base = gated
    router = on_callbacks(
        (spec.url, base.url), keepalive_expiry="0", health_interval="30", **settings
    )
    try:
        assert stream(router)[0].status == 200
        wait_for(router.settled())
        yield router
    finally:
        router.stop()


def hold(gated: tuple[GatedUpstream, GatedUpstream]) -> None:
    for upstream in gated:
        upstream.hold()


def release(gated: tuple[GatedUpstream, GatedUpstream]) -> None:
    for upstream in gated:
        upstream.release()


def test_a_client_that_leaves_while_the_router_connects_releases_everything(
    gated: tuple[GatedUpstream, GatedUpstream],
) -> None:
    with in_front_of(gated, connect_timeout="30") as router:
        hold(gated)
        before = connected(router)
        with router.connect() as sock:
            sock.sendall(post("/v1/chat/completions", STREAM))
            # (its lease taken, its connect under way: the connect hangs)
            wait_for(lambda: connected(router) == before + 1)
            assert router.status()["in_flight"]["total"] == 1
        wait_for(router.settled())  # the connect cancelled, the lease released
        assert router.metric("spec_router_client_disconnects_total") == 1
        assert open_connections(router) <= 1  # (the first stream's, expired, if still there)
        release(gated)
        response, body = stream(router)  # and the router goes on serving
        assert response.status == 200 and body.endswith(DONE)
        assert router.handed() == 0


def test_a_connect_that_times_out_is_retried_then_refused(
    gated: tuple[GatedUpstream, GatedUpstream],
) -> None:
    with in_front_of(gated, connect_timeout="0.3") as router:
        hold(gated)
        response, body = stream(router)
        # (both backends tried: the coroutine's 503, as for any attempt that failed to connect)
        assert response.status == 503
        assert "timed out" in json.loads(body)["error"]["message"]
        assert router.handed() == 1
        wait_for(router.settled())
        assert router.metric("spec_router_retries_total", kind="connect_timeout") == 1
        assert open_connections(router) <= 1


def test_a_backend_that_closes_a_new_connection_is_retried_then_refused(
    gated: tuple[GatedUpstream, GatedUpstream],
) -> None:
    """A new connection closed before a byte came back is not a stale one (not sent again on
    the same backend): the coroutine's verdict retries it elsewhere, then answers a 503."""
    with in_front_of(gated) as router:
        for upstream in gated:
            upstream.closing = True
        response, body = stream(router)
        assert response.status == 503
        assert json.loads(body)["error"]["message"]
        assert router.handed() == 1
        wait_for(router.settled())
        assert router.metric("spec_router_retries_total", kind="reset") == 1
        assert open_connections(router) <= 1  # (the first stream's, expired, if still there)


def test_a_bug_before_the_send_on_a_new_connection_gets_a_500_and_releases_once(
    sims: dict[str, Proc], monkeypatch: pytest.MonkeyPatch
) -> None:
    """test_callback_e2e's planted bug (``send``), on a stream that found no idle connection."""
    monkeypatch.setenv("CALLBACK_TEST_FAULT", "send")
    router = on_callbacks(urls_of(sims), app="tests.support.callback_faults:app")
    try:
        response, body = stream(router)
        assert response.status == 500
        assert json.loads(body)["error"]["type"] == "server_error"
        wait_for(router.settled())
        assert router.metric("spec_router_requests_total", code="500") == 1
        assert open_connections(router) == 0
    finally:
        output = router.stop()
    assert "a planted bug" in output
