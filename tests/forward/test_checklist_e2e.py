"""The fault and bad-input checklist (``../shared/reliability-checklist.md``), case by case, over
real sockets. Each test names its case; cases proved elsewhere are mapped in tests/README.md.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import RouterFactory
from tests.health.test_health_e2e import CHAT, assert_clean, configure, metrics
from tests.support.http import metric_value, router_status, sim_running
from tests.support.processes import Proc
from tests.support.raw_http import check_answer, check_error_shape, exchange
from tests.support.scripted_upstream import ScriptedUpstream

ROUTED_CHAT = "/v1/chat/completions"


def post(url: str, **kwargs: object) -> httpx.Response:
    return httpx.post(f"{url}{ROUTED_CHAT}", json={**CHAT, "max_tokens": 3}, **kwargs)  # type: ignore[arg-type]


def openai_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert "x-spec-router-pool" not in response.headers  # the router's own answer
    check_error_shape(response.content)
    assert response.json()["error"]["code"] == code


def nothing_routed(router_url: str) -> None:
    text = metrics(router_url)
    assert metric_value(text, "spec_router_routing_decisions_total") == 0
    assert router_status(router_url)["in_flight"]["total"] == 0


@pytest.fixture
def scripted() -> Iterator[ScriptedUpstream]:
    upstream = ScriptedUpstream()
    with upstream.running():
        yield upstream


# -- 1. backend refuses the connection --------------------------------------------------------


def test_case_01_a_refused_connection_fails_over_at_once_and_is_counted(
    start_router: RouterFactory, own_sims: dict[str, Proc]
) -> None:
    spec, base = own_sims["speculative"], own_sims["baseline"]
    router = start_router(spec.url, base.url, policy="spillover", health_interval="30")
    spec.kill()  # the poller will not notice for 30 s: the request finds out, by a refusal
    r = post(router.url)
    assert r.status_code == 200 and r.headers["x-spec-router-pool"] == "baseline"
    text = metrics(router.url)
    labels = {"pool": "speculative", "backend": spec.url, "kind": "connect"}
    assert metric_value(text, "spec_router_upstream_errors_total", **labels) == 1
    assert metric_value(text, "spec_router_retries_total", pool="speculative", kind="connect") == 1
    assert_clean(router.url, base.url)


# -- 2. reset after bytes were sent -----------------------------------------------------------


def test_case_02_a_reset_inside_a_plain_body_truncates_the_client_and_is_not_retried(
    start_router: RouterFactory, sims: dict[str, Proc]
) -> None:
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
    upstream = ScriptedUpstream(answer + b'{"partial":', reset=True)
    with upstream.running():
        router = start_router(upstream.url, sims["baseline"].url, policy="spillover")
        with pytest.raises(httpx.RemoteProtocolError):  # shorter than its Content-Length
            post(router.url)
        text = metrics(router.url)
        assert metric_value(text, "spec_router_retries_total") == 0
        labels = {"backend": upstream.url, "kind": "reset"}
        assert metric_value(text, "spec_router_upstream_errors_total", **labels) == 1
        assert len(upstream.heads) == 1
        assert_clean(router.url)


# -- 5. 5xx from an engine --------------------------------------------------------------------


def test_case_05_an_engine_500_passes_through_untouched_is_not_retried_nor_ejected(
    start_router: RouterFactory, own_sims: dict[str, Proc]
) -> None:
    # A 500 is one request's failure, not a dead engine (vLLM 0.34: "a request-level error
    # that does not mark the engine as unhealthy"; issue 12 item 7): counted, passed through,
    # and the backend keeps its traffic. (A 502/503/504 ejects: test_verdicts.py.)
    spec, base = own_sims["speculative"], own_sims["baseline"]
    router = start_router(spec.url, base.url, policy="spillover", eject_base="30")
    configure(spec.url, fault="status=500")
    r = post(router.url)
    assert r.status_code == 500 and r.headers["x-spec-router-pool"] == "speculative"
    body = r.json()  # the sim's own body (SGLang's flat shape, an int code), not the router's
    assert body["object"] == "error" and body["code"] == 500
    text = metrics(router.url)
    assert metric_value(text, "spec_router_retries_total") == 0
    labels = {"backend": spec.url, "kind": "http_500"}
    assert metric_value(text, "spec_router_upstream_errors_total", **labels) == 1
    backend = router_status(router.url)["pools"]["speculative"]["backends"][0]
    assert backend["ejected_for_s"] == 0 and backend["usable"]
    again = post(router.url)  # not ejected: the next request goes there too
    assert again.status_code == 500 and again.headers["x-spec-router-pool"] == "speculative"
    configure(spec.url, fault="none")
    assert_clean(router.url, spec.url, base.url)


# -- 6. invalid backend response; malformed client JSON ---------------------------------------


def test_case_06_junk_from_an_engine_is_a_502_and_a_counted_failure(
    start_router: RouterFactory, sims: dict[str, Proc]
) -> None:
    upstream = ScriptedUpstream(b"SSH-2.0-OpenSSH_9.6\r\n\r\n", close=True)
    with upstream.running():
        router = start_router(upstream.url, sims["baseline"].url, policy="spillover")
        openai_error(post(router.url), 502, "upstream_unavailable")
        labels = {"backend": upstream.url, "kind": "protocol"}
        assert metric_value(metrics(router.url), "spec_router_upstream_errors_total", **labels) == 1
        assert_clean(router.url)


def test_case_06_deeply_nested_json_is_a_400_without_touching_a_backend(
    start_router: RouterFactory,
) -> None:
    router = start_router()
    body = b"[" * 100_000 + b"]" * 100_000
    r = httpx.post(f"{router.url}{ROUTED_CHAT}", content=body)
    openai_error(r, 400, "invalid_json")
    assert "nested" in r.json()["error"]["message"]
    nothing_routed(router.url)


# -- 8. huge body -----------------------------------------------------------------------------


def test_case_08_a_chunked_body_past_the_limit_is_413_without_a_length(
    start_router: RouterFactory,
) -> None:
    router = start_router(max_body_bytes="1024")
    sent = []

    def body() -> Iterator[bytes]:  # no Content-Length: only reading can tell it is too big
        for _ in range(64):
            sent.append(1)
            yield b"x" * 512

    r = httpx.post(f"{router.url}{ROUTED_CHAT}", content=body())
    assert "content-length" not in r.request.headers  # (chunked: no length to refuse early)
    assert len(sent) * 512 > 1024  # the client did send past the limit before the answer
    openai_error(r, 413, "body_too_large")
    nothing_routed(router.url)


# -- 9. slowloris -----------------------------------------------------------------------------


def raw_socket(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    """What the router sends up to ``marker`` (or all it sends before closing)."""
    answer = b""
    while marker not in answer and (data := sock.recv(65536)):
        answer += data
    return answer


def send_on_then_read_the_end(sock: socket.socket, data: bytes) -> bytes:
    """A client that has not stopped: send ``data`` three more times, then read to the end.
    After a close that reset the connection this raises (BrokenPipeError or
    ConnectionResetError); after a lingering one it returns what was left (b"")."""
    for _ in range(3):
        sock.sendall(data)
    return read_until_closed(sock)


def trickle(sock: socket.socket, data: bytes) -> bytes:
    """Send ``data`` a byte every 0.1 s (each byte would reset uvicorn's keep-alive timer)
    until the router answers; return all it sent before closing."""
    answer = b""
    sock.settimeout(0.1)
    for byte in data:
        try:
            sock.send(bytes([byte]))
            answer = sock.recv(65536)
            break  # an answer, or b"": closed
        except TimeoutError:
            continue
        except OSError:
            break
    sock.settimeout(10)
    return answer + read_until_closed(sock)


def test_case_09_a_head_that_never_completes_gets_408_at_the_deadline_however_it_trickles(
    start_router: RouterFactory,
) -> None:
    router = start_router(request_timeout="0.5")
    with raw_socket(router.url) as sock:
        began = time.monotonic()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")
        answer = trickle(sock, b"host: 127.0.0.1\r\nx-slow: " + b"a" * 40)
        elapsed = time.monotonic() - began
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b'"code":"request_timeout"' in answer
    assert elapsed > 0.4  # (at the deadline, not at the first trickled byte)
    nothing_routed(router.url)


def test_case_09_an_idle_connection_is_closed_and_a_slow_body_gets_408_without_a_lease(
    start_router: RouterFactory, sims: dict[str, Proc]
) -> None:
    router = start_router(request_timeout="0.5")
    with raw_socket(router.url) as sock:  # connected, nothing sent
        began = time.monotonic()
        assert read_until_closed(sock) == b""
        assert time.monotonic() - began > 0.4  # (at the deadline, not at once)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n"
    with raw_socket(router.url) as sock:
        sock.sendall(head + b'{"model":')
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"connection: close" in answer
    assert b'"code":"request_timeout"' in answer
    # the deadline counts again from the first byte of each request on a kept-alive connection
    first = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
    with raw_socket(router.url) as sock:
        sock.sendall(first)
        ok = b""
        while not ok.endswith(b'{"status":"ok"}'):
            ok += sock.recv(65536)
        assert ok.startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        assert read_until_closed(sock).startswith(b"HTTP/1.1 408 ")
    text = metrics(router.url)
    assert metric_value(text, "spec_router_requests_total", pool="none", code="408") == 1
    nothing_routed(router.url)
    assert sim_running(sims["speculative"].url) == 0


def test_case_09_a_kept_alive_request_gets_its_whole_deadline_from_its_own_first_byte(
    start_router: RouterFactory,
) -> None:
    """One timer serves a connection's requests (router.fastpath.protocol): the connection's
    first deadline passes while the second request is on its way, and must not cut it short."""
    router = start_router(request_timeout="1.0")
    first = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
    with raw_socket(router.url) as sock:
        sock.sendall(first)
        ok = b""
        while not ok.endswith(b'{"status":"ok"}'):
            ok += sock.recv(65536)
        # idle for most of the connection's first deadline (the client's own pace, not a wait
        # for the router), then a head that never completes
        time.sleep(0.6)
        began = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        answer = read_until_closed(sock)
        elapsed = time.monotonic() - began
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert elapsed > 0.9, elapsed  # (the connection's first deadline was 0.4 s after began)
    # a body that stalls on a kept-alive connection: the proxy's own 408, from its first byte
    with raw_socket(router.url) as sock:
        sock.sendall(first)
        ok = b""
        while not ok.endswith(b'{"status":"ok"}'):
            ok += sock.recv(65536)
        time.sleep(0.6)
        began = time.monotonic()
        head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n"
        sock.sendall(head + b'{"model":')
        answer = read_until_closed(sock)
        elapsed = time.monotonic() - began
    assert answer.startswith(b"HTTP/1.1 408 ") and b'"code":"request_timeout"' in answer
    assert elapsed > 0.9, elapsed
    nothing_routed(router.url)


# -- 10. header injection ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", [b"a\x00b", b"a\rb", b"a\r\n b", b"a\x7fb"])
def test_case_10_cr_lf_or_nul_in_a_header_value_is_a_400_in_the_openai_shape(
    start_router: RouterFactory, bad: bytes
) -> None:
    router = start_router()
    body = b'{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-injected: " + bad + b"\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    response = exchange(router.url, request)
    assert response is not None and response.status == 400
    check_answer(response.status, False, response.body)
    nothing_routed(router.url)


# -- 11, 12, 13. hop-by-hop headers, X-Forwarded-For, Authorization ---------------------------


@pytest.mark.parametrize("trusted", [False, True])
def test_cases_11_12_13_what_reaches_the_engine_and_what_comes_back(
    start_router: RouterFactory, sims: dict[str, Proc], scripted: ScriptedUpstream, trusted: bool
) -> None:
    settings = {"trusted_proxies": "127.0.0.0/8"} if trusted else {}
    router = start_router(scripted.url, sims["baseline"].url, policy="spillover", **settings)
    r = post(
        router.url,
        headers={
            "connection": "keep-alive, x-secret",
            "x-secret": "hop",
            "keep-alive": "timeout=5",
            "proxy-authorization": "Basic cHJveHk6cGFzcw==",
            "te": "trailers",
            "x-forwarded-for": "6.6.6.6",
            "authorization": "Bearer client-key",
            "x-request-id": "r-1",
        },
    )
    assert r.status_code == 200 and r.headers["x-spec-router-pool"] == "speculative"
    seen = dict(scripted.headers())
    for hop in (b"connection", b"x-secret", b"keep-alive", b"proxy-authorization"):
        assert hop not in seen, hop  # case 11
    assert seen[b"te"] == b"trailers"  # case 11: the one TE kept
    assert seen[b"authorization"] == b"Bearer client-key"  # case 13: end to end
    assert seen[b"x-request-id"] == b"r-1"
    # case 12: the client's own address appended; an untrusted client's claim dropped
    assert seen[b"x-forwarded-for"] == (b"6.6.6.6, 127.0.0.1" if trusted else b"127.0.0.1")
    # the engine's Connection-named header does not reach the client
    assert "x-upstream-secret" not in r.headers
    assert_clean(router.url)


# -- 14. admin and engine-internal endpoints --------------------------------------------------


def test_case_14_engine_internal_endpoints_are_never_reached_through_the_router(
    start_router: RouterFactory, own_sims: dict[str, Proc]
) -> None:
    spec, base = own_sims["speculative"], own_sims["baseline"]
    router = start_router(spec.url, base.url)
    port = spec.url.rsplit(":", 1)[1].encode()
    body = b'{"fault":"status=500"}'
    targets = [
        b"/sim/config",
        b"/v1/../sim/config",
        b"/v1/%2e%2e/sim/config",
        b"/v1/%2E%2E%2Fsim%2Fconfig",
        b"/v1/..%5csim%5cconfig",
        b"http://127.0.0.1:" + port + b"/sim/config",
        b"/pause",
        b"/abort_requests",
        b"/update_weights",
        b"/tokenize",
        b"/flush_cache",
        b"/v1/load_lora_adapter",
    ]
    for target in targets:
        request = b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n" % target
        response = exchange(
            router.url, request + b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        assert response is not None, target
        assert b"x-spec-router-pool" not in response.headers, target  # the router answered
        assert response.status in (400, 404, 405), (target, response.status)
        check_answer(response.status, False, response.body)
    for sim in (spec, base):
        assert httpx.get(f"{sim.url}/sim/config").json()["fault"] is None
    nothing_routed(router.url)


# -- 15. a POST is not retried once it was sent -----------------------------------------------


def test_case_15_a_request_the_engine_may_have_started_is_not_retried(
    start_router: RouterFactory, own_sims: dict[str, Proc]
) -> None:
    spec, base = own_sims["speculative"], own_sims["baseline"]
    # (a non-stream: NON_STREAM_TIMEOUT bounds its whole answer)
    router = start_router(spec.url, base.url, policy="spillover", non_stream_timeout="0.5")
    configure(spec.url, fault="hang_before_headers")
    openai_error(post(router.url), 504, "upstream_timeout")
    text = metrics(router.url)
    assert metric_value(text, "spec_router_retries_total") == 0
    assert metric_value(text, "spec_router_routing_decisions_total", pool="baseline") == 0
    configure(spec.url, fault="none")
    assert_clean(router.url, spec.url, base.url)


# -- 19. more streams than connections --------------------------------------------------------


def test_case_19_past_the_connection_limit_requests_are_shed_with_a_503(
    start_router: RouterFactory, sims: dict[str, Proc]
) -> None:
    router = start_router(max_connections_per_backend="1", connect_timeout="0.3")
    body = {**CHAT, "max_tokens": 2000, "stream": True}
    with (
        httpx.Client(base_url=router.url, timeout=30) as a,
        httpx.Client(base_url=router.url, timeout=30) as b,
    ):
        with (
            a.stream("POST", ROUTED_CHAT, json=body) as one,
            b.stream("POST", ROUTED_CHAT, json=body) as two,
        ):
            pools = {one.headers["x-spec-router-pool"], two.headers["x-spec-router-pool"]}
            assert pools == {"speculative", "baseline"}  # each backend's only connection
            shed = post(router.url)  # (a router that waited for a connection would answer 200)
            openai_error(shed, 503, "no_backend_available")
            assert int(shed.headers["retry-after"]) >= 1
    assert_clean(router.url, sims["speculative"].url, sims["baseline"].url)


def test_case_09_an_answer_that_ends_the_connection_survives_a_client_still_sending(
    start_router: RouterFactory,
) -> None:
    """The router's 408 ends the connection while the client is still sending its head: the
    router half-closes and drops what still comes (a lingering close), so the client reads the
    answer and a clean end, not a reset that can destroy the answer before it is read."""
    router = start_router(request_timeout="0.5")
    with raw_socket(router.url) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        answer = read_until(sock, b'"request_timeout"')
        rest = send_on_then_read_the_end(sock, b"x-still-sending: " + b"a" * 4000 + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 408 ") and rest == b""
    nothing_routed(router.url)


def test_case_01_garbage_pipelined_behind_a_request_ends_the_connection_quietly(
    start_router: RouterFactory,
) -> None:
    """A good request and an unparseable one in one packet: the first is being answered when
    the parser fails on the second, so the connection just ends (no 400 to linger over, and no
    write after a half-close failing in the application's log)."""
    router = start_router()
    with raw_socket(router.url) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n\x01bad\r\n\r\n")
        read_until_closed(sock)
    assert httpx.get(f"{router.url}/health").status_code == 200  # still serving
    router.stop()  # (its whole log, read to the end)
    assert not any("Exception in ASGI application" in line for line in router.output)


def test_case_09_a_408_for_a_slow_body_survives_a_client_still_sending_it(
    start_router: RouterFactory,
) -> None:
    """The proxy's own 408 for a body that missed the deadline ends the connection while the
    client is still sending the body: that close lingers too (the client reads the answer and
    a clean end, not a reset)."""
    router = start_router(request_timeout="0.5")
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n"
    with raw_socket(router.url) as sock:
        sock.sendall(head + b'{"model":')
        answer = read_until(sock, b'"request_timeout"')
        rest = send_on_then_read_the_end(sock, b" " * 4000)
    assert answer.startswith(b"HTTP/1.1 408 ") and rest == b""
    nothing_routed(router.url)


def test_case_08_a_413_survives_a_client_uploading_past_the_deadline(
    start_router: RouterFactory,
) -> None:
    """A body over the limit is answered 413 at once; a client that goes on uploading it past
    the request's deadline has the connection end under it, with a lingering close: it reads
    the 413 and a clean end, not a reset."""
    router = start_router(request_timeout="0.5", max_body_bytes="1024")
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000000\r\n\r\n"
    with raw_socket(router.url) as sock:
        sock.sendall(head + b'{"model":')
        answer = read_until(sock, b'"body_too_large"')
        sock.settimeout(0.05)
        ended = None
        for _ in range(100):  # past the deadline and its grace, still uploading
            try:
                sock.sendall(b" " * 1000)
                ended = sock.recv(65536)
                break  # the router's end of the connection (b"")
            except TimeoutError:
                continue
        sock.settimeout(10)
        rest = send_on_then_read_the_end(sock, b" " * 4000)
    assert answer.startswith(b"HTTP/1.1 413 ") and ended == b"" and rest == b""
    nothing_routed(router.url)
