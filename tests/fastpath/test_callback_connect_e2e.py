"""The callback path opening its own upstream connections (``SPEC_ROUTER_CALLBACK_CONNECT``).

Where no kept-alive upstream connection is idle (the first requests, a wave past the idle ones,
those ``KEEPALIVE_EXPIRY`` closed), ``router.forward.callback`` opens one in a task of its own
and serves the stream from callbacks once it is open. ``uvicorn router.app:app`` over real
sockets, as in test_callback_e2e: every way the connect ends (open, refused, timed out, a backend
that closes it at once, a client that leaves meanwhile, a bug) releases the lease, the
connection and the stream, and a failure gets what the proxy's coroutine answers (its retries,
the OpenAI error shape). ``/router/status``'s ``fast_path.callback_connected`` counts the
connections opened there (each backend's ``connections.connecting``: the connects under way).
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.fastpath.test_callback_e2e import STREAM, Router, on_callbacks, stream, urls_of
from tests.fastpath.test_fast_path_e2e import post, read_response
from tests.support.bulk_upstream import DONE, HEAD, BulkUpstream, chunk, sse_event
from tests.support.http import wait_for
from tests.support.processes import Proc
from tests.support.threaded import EMPTY_JSON


def connected(router: Router) -> int:
    """Upstream connections the callback path opened so far."""
    return int(router.status()["fast_path"]["callback_connected"])


def backends(router: Router) -> dict[str, dict[str, Any]]:
    """Each backend's status, by URL."""
    return {
        backend["url"]: {**backend, "pool": name}
        for name, found in router.status()["pools"].items()
        for backend in found["backends"]
    }


def connecting(router: Router) -> int:
    """The router's connects under way, to every backend."""
    return sum(backend["connections"]["connecting"] for backend in backends(router).values())


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
        # (at most one a stream; fewer where a stream ended before another looked and left its
        # connection idle for it: how much of the wave overlaps is the host's timing)
        assert 1 <= opened <= wave
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
            assert (router.handed(), connected(router)) == (1, 0)  # (counted once open)
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
    short stream or, while ``closing``, by closing the connection without a byte (with
    ``once``, a connection's second POST only: a kept-alive connection the engine had closed);
    while ``closing_at_accept``, it closes each connection as it accepts it (in the accepting
    thread: the FIN goes out at once); while ``stalled`` is clear, a POST's answer waits for it.
    One thread accepts, one serves each connection."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(0)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.closing = False
        self.once = False
        self.closing_at_accept = False
        self.stalled = threading.Event()
        self.stalled.set()
        self.posts = 0  # POSTs read
        self.cut_stale = 0  # connections closed on their second POST (``once``)
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
            self.stalled.set()
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

    @property
    def accepted(self) -> int:
        """Connections accepted so far (``hold``'s own included)."""
        with self._changed:
            return self._accepted

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
            if self.closing_at_accept:
                conn.close()
                continue
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        data = b""
        posts = 0  # on this connection
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
                    continue
                posts += 1
                with self._changed:
                    self.posts += 1
                    self._changed.notify_all()
                if self.closing and (not self.once or posts > 1):
                    if self.once:
                        with self._changed:
                            self.cut_stale += 1
                    conn.close()
                    return
                self.stalled.wait()
                body = b"".join(chunk(sse_event(n, 64)) for n in range(3))
                conn.sendall(HEAD + body + chunk(DONE) + b"0\r\n\r\n")


@pytest.fixture
def gated() -> Iterator[tuple[GatedUpstream, GatedUpstream]]:
    with GatedUpstream().running() as spec, GatedUpstream().running() as base:
        yield spec, base


@contextlib.contextmanager
def in_front_of(
    gated: tuple[GatedUpstream, GatedUpstream], app: str = "router.app:app", **settings: str
) -> Iterator[Router]:
    """The router in front of both, one stream served (its connection left idle expires at
    once, unless ``keepalive_expiry`` says otherwise: every later stream connects), nothing in
    flight; stopped after."""
    spec, base = gated
    settings = {"keepalive_expiry": "0", "health_interval": "30", **settings}
    router = on_callbacks((spec.url, base.url), app=app, **settings)
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
            wait_for(lambda: connecting(router) == 1)
            assert router.status()["in_flight"]["total"] == 1
            assert connected(router) == before
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


@pytest.mark.parametrize("late", [False, True])
def test_a_backend_that_closes_each_new_connection_at_once_gets_one_connect_per_attempt(
    gated: tuple[GatedUpstream, GatedUpstream], monkeypatch: pytest.MonkeyPatch, late: bool
) -> None:
    """An engine restarting, or a sidecar with nothing healthy behind it: each connection
    accepted and closed at once. A new connection closed before a byte came back is a failed
    attempt, not a stale one: one connect from the callbacks, its failure handed to the
    coroutine, which tries the other backend once and answers its 503. Whether the FIN comes
    after the request went out, or before (``late``: the connection handed over only once its
    end is read, as on a busy loop), where it was sent again on a new connection, and again:
    tens of connects for one request (review-s13 H1)."""
    app = "router.app:app"
    if late:
        monkeypatch.setenv("CALLBACK_TEST_FAULT", "late_open")
        app = "tests.support.callback_faults:app"
    with in_front_of(gated, app=app) as router:
        for upstream in gated:
            upstream.closing_at_accept = True
        before, accepted = connected(router), sum(upstream.accepted for upstream in gated)
        with router.connect() as sock:
            sock.settimeout(20)  # (it hung here, connecting again and again)
            sock.sendall(post("/v1/chat/completions", STREAM))
            response = read_response(sock)
        body = bytes(response.body)
        assert response.status == 503
        assert json.loads(body)["error"]["message"]
        wait_for(router.settled())
        assert connected(router) == before + 1  # (the connect succeeded; what it sent did not)
        assert sum(upstream.accepted for upstream in gated) == accepted + 2  # (one per backend)
        assert router.handed() == 1
        assert router.metric("spec_router_retries_total", kind="reset") == 1
        assert router.status()["in_flight"]["total"] == 0
        assert open_connections(router) == 0


def test_the_callback_path_keeps_to_max_connections_per_backend(
    gated: tuple[GatedUpstream, GatedUpstream],
) -> None:
    """A wave decided while the connects hang: the connects under way count against
    ``MAX_CONNECTIONS_PER_BACKEND`` (they did not: 10 of 10 opened at a cap of 2, review-s13
    M1). Those past it are handed to the coroutine, which waits for a connection; all are
    answered once the engines accept, and each connection is kept alive: what is open after
    is what was opened, at most 2 a backend."""
    wave = 10
    with in_front_of(
        gated, max_connections_per_backend="2", connect_timeout="30", keepalive_expiry="30"
    ) as router:
        hold(gated)
        for upstream in gated:
            upstream.stalled.clear()  # (none freed meanwhile: the warm-up's answers late too)
        with ThreadPoolExecutor(wave) as pool:
            answers = [pool.submit(stream, router) for _ in range(wave)]
            try:  # (each stream connecting, waiting for a connection, or on the warm-up's)
                wait_for(lambda: router.status()["in_flight"]["total"] == wave)
                for backend in backends(router).values():
                    connections = backend["connections"]
                    assert connections["open"] + connections["connecting"] <= 2, backend
            finally:
                release(gated)
                for upstream in gated:
                    upstream.stalled.set()
            results = [answer.result() for answer in answers]
        for response, body in results:
            assert response.status == 200 and body.endswith(DONE)
        wait_for(router.settled())
        assert router.handed() >= wave - 4
        assert router.served() + router.handed() == 1 + wave
        assert router.metric("spec_router_requests_total", code="200") == 1 + wave
        for backend in backends(router).values():
            assert backend["connections"]["open"] <= 2, backend
            assert backend["connections"]["connecting"] == 0, backend


def test_a_stale_kept_alive_connection_is_sent_again_on_one_the_callbacks_open(
    gated: tuple[GatedUpstream, GatedUpstream],
) -> None:
    """Both engines close a kept-alive connection as its second request comes in, without a
    byte (as an engine closes one idle past its keep-alive): a stream that finds one idle
    sends it again, once, on a connection the callbacks open, and is served there. Each
    stream connects once: to a backend with nothing idle, or in place of the stale one."""
    for upstream in gated:
        upstream.closing = upstream.once = True
    router = on_callbacks(urls_of_gated(gated), health_interval="30")
    try:
        streams = 6
        for _ in range(streams):
            response, body = stream(router)
            assert response.status == 200 and body.endswith(DONE)
            wait_for(router.settled())
        assert sum(upstream.cut_stale for upstream in gated) >= streams - 2
        assert connected(router) == streams
        assert (router.served(), router.handed()) == (streams, 0)
        # (each backend's last connection kept alive, the stale ones closed)
        assert open_connections(router) == sum(1 for upstream in gated if upstream.posts)
    finally:
        router.stop()


def urls_of_gated(gated: tuple[GatedUpstream, GatedUpstream]) -> tuple[str, str]:
    return gated[0].url, gated[1].url


ADMIN_TOKEN = "admin-s3cret"


@pytest.mark.parametrize("callback_connect", ["true", "false"])
def test_a_backend_removed_while_the_router_connects_to_it(
    gated: tuple[GatedUpstream, GatedUpstream], callback_connect: str
) -> None:
    """The backend leaves its pool (admin API) and its drain times out while the router's
    connect to it hangs: the cut counts that connect, and once it is open nothing is sent on
    it (the pool is closed); the request goes to the other backend. From the callbacks and
    from the proxy's coroutine (``SPEC_ROUTER_CALLBACK_CONNECT`` off), which sent it on the
    removed backend's connection (review-s13 L3)."""
    with in_front_of(
        gated,
        connect_timeout="30",
        drain_timeout="0.2",
        admin_token=ADMIN_TOKEN,
        callback_connect=callback_connect,
    ) as router:
        hold(gated)
        with router.connect() as sock:
            sock.sendall(post("/v1/chat/completions", STREAM))

            def connecting_to() -> str | None:
                for url, backend in backends(router).items():
                    if backend["connections"]["connecting"]:
                        return url
                return None

            wait_for(lambda: connecting_to() is not None)
            url = connecting_to()
            assert url is not None
            pool = backends(router)[url]["pool"]
            left = httpx.delete(
                f"{router.url}/router/pools/{pool}/backends",
                params={"url": url},
                headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
                timeout=5,
            )
            assert left.status_code == 202, left.text
            # (the drain timed out: the connect under way was cut)
            wait_for(lambda: router.metric("spec_router_drain_cuts_total", pool=pool) == 1)
            release(gated)
            response = read_response(sock)
        assert response.status == 200 and bytes(response.body).endswith(DONE)
        assert response.headers[b"x-spec-router-pool"].decode() != pool
        wait_for(router.settled())
        assert router.metric("spec_router_retries_total", kind="connect") == 1
        wait_for(lambda: url not in backends(router))  # (drained: removed)
        assert open_connections(router, pool) == 0
        assert router.status()["in_flight"]["total"] == 0


def test_a_shutdown_while_the_router_connects_answers_503_and_releases(
    gated: tuple[GatedUpstream, GatedUpstream],
) -> None:
    """uvicorn's graceful shutdown ends while a stream's connect hangs: the connect is
    cancelled, the client gets a 503 in the OpenAI shape (nothing was written yet), and the
    router exits."""
    spec, base = gated
    router = Router(
        (spec.url, base.url), "--no-access-log", "--timeout-graceful-shutdown", "1",
        callback_streams="true", scrape_metrics="false", keepalive_expiry="0",
        health_interval="30", connect_timeout="30",
    )  # fmt: skip
    try:
        assert stream(router)[0].status == 200
        wait_for(router.settled())
        hold(gated)
        with router.connect() as sock:
            sock.sendall(post("/v1/chat/completions", STREAM))
            wait_for(lambda: connecting(router) == 1)
            assert router.status()["in_flight"]["total"] == 1
            router.proc.send_signal(signal.SIGTERM)
            response = read_response(sock)
        assert response.status == 503
        error = json.loads(bytes(response.body))["error"]
        assert error["message"] and error["type"]
        # (uvicorn >= 0.29 re-raises the signal it caught once it has shut down)
        assert router.proc.wait(timeout=30) in (0, -signal.SIGTERM)
    finally:
        release(gated)
        router.stop()
