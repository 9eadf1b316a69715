"""Hostile clients against the real router (a large body parsed before anything is allowed,
paths outside the API, slow and flooding clients, the router's own metrics and health in public,
a client that stops reading, headers the router owns; and what already held up, kept so), with a
recording replica behind it to see what got through."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

import httpx
import pytest
from abuse_kit import (
    ALLOWED,
    API_KEY,
    CHAT,
    CHAT_BODY,
    MIB,
    REFUSED_TARGETS,
    ROUTER_MEMORY_LIMIT,
    SMUGGLING,
    RecordingReplica,
    RouterProcess,
    StartRouter,
    accepted_connections,
    closed_within,
    empty_objects_body,
    exchange,
    peak_rss_bytes,
    read_reply,
    request,
)

from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def router(start_router: StartRouter, recorder: RecordingReplica) -> RouterProcess:
    return start_router([recorder.base_url])


# --- a large body is parsed before anything is allowed -----------------------------------------


def test_an_unauthenticated_16_mib_body_is_refused_before_it_is_read(
    start_router: StartRouter, recorder: RecordingReplica
) -> None:
    router = start_router([recorder.base_url], env={"VLLM_API_KEY": API_KEY})
    before = len(recorder.forwarded())
    body = empty_objects_body(int(15.7 * MIB))
    reply = httpx.post(router.base_url + CHAT, content=body, timeout=30)
    peak = peak_rss_bytes(router.pid)
    print(f"router peak RSS after one unauthenticated 15.7 MiB body: {peak / MIB:.0f} MiB")
    assert reply.status_code == 401 and reply.json() == {"error": "Unauthorized"}
    assert len(recorder.forwarded()) == before, "the request reached a replica"
    assert peak < 160 * MIB


def test_bodies_at_the_size_limit_arriving_together_keep_the_router_under_its_memory_limit(
    router: RouterProcess,
) -> None:
    body = empty_objects_body(int(15.7 * MIB))
    statuses: list[int] = []

    def send() -> None:
        statuses.append(httpx.post(router.base_url + CHAT, content=body, timeout=60).status_code)

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    peak = peak_rss_bytes(router.pid)
    print(f"router peak RSS after four 15.7 MiB bodies at once: {peak / MIB:.0f} MiB")
    assert len(statuses) == 4 and all(s in (200, 503) for s in statuses), statuses
    assert peak < ROUTER_MEMORY_LIMIT


# --- paths outside the API reach the replicas --------------------------------------------------

@pytest.mark.parametrize(("method", "target", "status"), REFUSED_TARGETS)
def test_the_router_speaks_only_its_api(router: RouterProcess, recorder: RecordingReplica,
                                        method: str, target: str, status: int) -> None:
    before = len(recorder.forwarded())
    reply = exchange(router.port, request(method, target, b"{}" if method != "GET" else b""))
    assert reply.status == status, reply
    assert len(recorder.forwarded()) == before, recorder.forwarded()[before:]


def test_only_allow_listed_paths_reached_a_replica(router: RouterProcess,
                                                   recorder: RecordingReplica) -> None:
    """Run after the refused targets: everything the router forwarded is on the allow-list."""
    before = len(recorder.forwarded())
    for method, target in sorted(ALLOWED):
        reply = exchange(router.port, request(method, target, b"{}" if method == "POST" else b""))
        assert reply.status == 200, (method, target, reply)
    arrived = {(s.method, s.raw_path) for s in recorder.forwarded()}
    assert arrived <= ALLOWED, arrived - ALLOWED
    # Each request this test sent arrived: the record above is not empty by accident.
    assert {(s.method, s.raw_path) for s in recorder.forwarded()[before:]} == ALLOWED


def test_a_query_string_travels_encoded_as_sent(router: RouterProcess,
                                                recorder: RecordingReplica) -> None:
    reply = exchange(router.port, request("GET", "/v1/models?a=%2F..%2Fb&c=%23"))
    assert reply.status == 200
    seen = recorder.forwarded()[-1]
    assert (seen.raw_path, seen.query) == ("/v1/models", "a=%2F..%2Fb&c=%23")


# --- slow and flooding clients ------------------------------------------------------------------

SLOW_ROUTER_FLAGS = ("--header-timeout", "1", "--body-timeout", "1", "--keep-alive-timeout", "1",
                     "--max-client-connections", "16", "--max-inflight", "2",
                     "--max-header-bytes", "16384", "--max-headers", "64")


@pytest.fixture(scope="module")
def strict_router(start_router: StartRouter, recorder: RecordingReplica) -> RouterProcess:
    return start_router([recorder.base_url], *SLOW_ROUTER_FLAGS)


def _connect(router: RouterProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", router.port), timeout=5)


@pytest.mark.parametrize(("case", "sent"), [
    ("nothing sent", b""),
    ("headers never finished", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"),
    ("body never finished",
     b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"a\""),
])
def test_a_slow_client_is_cut_at_its_deadline(strict_router: RouterProcess, case: str,
                                              sent: bytes) -> None:
    with _connect(strict_router) as sock:
        sock.sendall(sent)
        assert closed_within(sock, 4.0), f"{case}: still open after 4 s"


def test_an_idle_kept_alive_connection_is_closed(strict_router: RouterProcess) -> None:
    with _connect(strict_router) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_reply(sock, 5).status == 200
        assert closed_within(sock, 4.0)


@pytest.mark.parametrize(("case", "headers"), [
    ("one 100 KiB header", {"X-Big": "a" * 100 * 1024}),
    ("2000 headers", {f"X-H{i}": "1" for i in range(2000)}),
])
def test_oversized_headers_get_431_and_reach_no_replica(
    strict_router: RouterProcess, recorder: RecordingReplica, case: str, headers: dict[str, str]
) -> None:
    before = len(recorder.forwarded())
    reply = exchange(strict_router.port, request("POST", CHAT, CHAT_BODY, headers))
    assert reply.status == 431, case
    assert len(recorder.forwarded()) == before


def test_connections_past_the_cap_get_503_with_retry_after(
    strict_router: RouterProcess,
) -> None:
    # No pause: each idle connection is cut 1 s after it opened (the header timeout), and the
    # router takes connections in the order they came.
    idle = [_connect(strict_router) for _ in range(16)]
    try:
        reply = exchange(strict_router.port, request("GET", "/v1/models"))
        assert reply.status == 503 and "retry-after" in reply.headers, reply
    finally:
        for sock in idle:
            sock.close()


def test_requests_past_the_cap_get_503_with_retry_after(
    strict_router: RouterProcess,
) -> None:
    slow = json.dumps({"messages": [{"role": "user", "content": "slow"}]}).encode()
    replies = []

    def send() -> None:
        replies.append(exchange(strict_router.port, request("POST", CHAT, slow), timeout=10))

    threads = [threading.Thread(target=send) for _ in range(2)]
    for thread in threads:
        thread.start()
    # Both held by the replica for 2 s.
    eventually(lambda: _inflight(strict_router) == 2, 5, every=0.05,
               what="2 requests in flight at the router")
    third = exchange(strict_router.port, request("POST", CHAT, slow), timeout=10)
    for thread in threads:
        thread.join(10)
    assert third.status == 503 and "retry-after" in third.headers, third
    assert [r.status for r in replies] == [200, 200]


# --- the router's own metrics and health are public ----------------------------------------------


@pytest.mark.parametrize("path", ["/metrics", "/health"])
def test_metrics_and_health_are_not_on_the_api_port(router: RouterProcess, path: str) -> None:
    assert exchange(router.port, request("GET", path)).status == 404


# --- a client that stops reading keeps its slot --------------------------------------------------


def test_a_client_that_stops_reading_is_cut_and_its_slot_freed(
    start_router: StartRouter, recorder: RecordingReplica
) -> None:
    router = start_router([recorder.base_url], "--send-timeout", "1")
    flood = json.dumps({"messages": [{"role": "user", "content": "flood"}],
                        "stream": True}).encode()
    before = len(recorder.forwarded())
    with _connect(router) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(request("POST", CHAT, flood))
        # The stream reached the replica, so it took a slot; this client reads nothing more.
        eventually(lambda: len(recorder.forwarded()) > before, 5, every=0.05,
                   what="the stream forwarded to the replica")
        eventually(lambda: _inflight(router) == 0, 6, every=0.2,
                   what="nothing in flight at the router")


def test_a_client_cut_at_the_send_timeout_gives_its_connection_back(
    start_router: StartRouter, recorder: RecordingReplica
) -> None:
    """Cut, a client that reads nothing must not keep its connection either: clients that stop
    reading would fill --max-client-connections, and every later client get 503. (The same
    client, held at zero first: test_hold_abuse.py.)"""
    router = start_router([recorder.base_url], "--send-timeout", "1",
                          "--max-client-connections", "4")
    flood = json.dumps({"messages": [{"role": "user", "content": "flood"}],
                        "stream": True}).encode()
    before = len(recorder.forwarded())
    stalled = []
    try:
        for _ in range(4):
            sock = _connect(router)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(request("POST", CHAT, flood))
            stalled.append(sock)
        eventually(lambda: len(recorder.forwarded()) == before + 4, 5, every=0.05,
                   what="the 4 streams forwarded to the replica")
        eventually(lambda: _inflight(router) == 0, 6, every=0.2,
                   what="nothing in flight at the router: each stream cut")
        eventually(lambda: accepted_connections(router.port) == 0, 5, every=0.2,
                   what="the router closing the connections of the clients it cut")
        reply = exchange(router.port, request("GET", "/v1/models"))
        assert reply.status == 200, reply
    finally:
        for sock in stalled:
            sock.close()


def _inflight(router: RouterProcess) -> float | None:
    """The router's in-flight count, or None before it has a sample (no request yet)."""
    text = httpx.get(router.ops_url + "/metrics", timeout=5).text
    samples = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("autoglm_router_inflight{")]
    return sum(samples) if samples else None


# --- headers the router owns ---------------------------------------------------------------------


def test_a_websocket_upgrade_gets_a_4xx(router: RouterProcess) -> None:
    reply = exchange(router.port, request("GET", CHAT, headers={
        "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}))
    assert 400 <= reply.status < 500, reply


def test_the_router_sets_request_id_and_forwarded_headers_itself(
    router: RouterProcess, recorder: RecordingReplica
) -> None:
    reply = exchange(router.port, request("POST", CHAT, CHAT_BODY, {
        "X-Request-Id": "client-chosen", "X-Forwarded-For": "6.6.6.6",
        "X-Forwarded-Host": "evil.example", "X-Forwarded-Proto": "https"}, host="api.example"))
    assert reply.status == 200
    seen = recorder.forwarded()[-1]
    assert seen.header("x-request-id") == [reply.headers["x-request-id"]]
    assert reply.headers["x-request-id"] != "client-chosen"
    assert seen.header("x-forwarded-for") == ["127.0.0.1"]
    assert seen.header("x-forwarded-host") == ["api.example"]
    assert seen.header("x-forwarded-proto") == ["http"]


def test_the_router_counts_each_sequence_of_a_fanned_out_request(
    router: RouterProcess, recorder: RecordingReplica
) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "slow"}], "n": 3}).encode()
    done = threading.Event()

    def send() -> None:
        exchange(router.port, request("POST", CHAT, body), timeout=10)
        done.set()

    threading.Thread(target=send).start()
    try:
        eventually(lambda: _inflight(router) == 3, 3, every=0.05,
                   what="3 requests in flight at the router")  # the replica holds it for 2 s
    finally:
        done.wait(10)


# --- what held up: keep it that way --------------------------------------------------------------

@pytest.mark.parametrize(("case", "raw"), SMUGGLING)
def test_request_smuggling_is_refused(router: RouterProcess, recorder: RecordingReplica,
                                      case: str, raw: bytes) -> None:
    before = len(recorder.forwarded())
    reply = exchange(router.port, raw)
    assert reply.status in (0, 400), (case, reply)
    assert all(s.raw_path == CHAT for s in recorder.forwarded()[before:]), case


def test_hop_by_hop_headers_are_dropped(router: RouterProcess,
                                        recorder: RecordingReplica) -> None:
    reply = exchange(router.port, request("POST", CHAT, CHAT_BODY, {
        "Connection": "close, x-secret", "X-Secret": "1", "Keep-Alive": "timeout=5",
        "TE": "trailers", "Proxy-Authorization": "Basic eA=="}))
    assert reply.status == 200
    names = {k for k, _ in recorder.forwarded()[-1].headers}
    assert not names & {"x-secret", "keep-alive", "te", "proxy-authorization"}


def test_an_absolute_uri_target_goes_to_the_configured_replica(
    router: RouterProcess, recorder: RecordingReplica
) -> None:
    reply = exchange(router.port, request("GET", "http://169.254.169.254/v1/models"))
    assert reply.status == 200, reply
    assert recorder.forwarded()[-1].raw_path == "/v1/models"


def test_a_body_over_the_limit_gets_413(router: RouterProcess, recorder: RecordingReplica) -> None:
    before = len(recorder.forwarded())
    reply = httpx.post(router.base_url + CHAT, content=b"x" * (16 * MIB + 1), timeout=30)
    assert reply.status_code == 413
    assert len(recorder.forwarded()) == before


@pytest.mark.parametrize("value", ["0", "-1", "1e9", "many"])
def test_a_pixel_budget_that_is_not_a_positive_integer_stops_the_router_at_start(
    value: str,
) -> None:
    """--image-max-pixels prices every screenshot; a wrong one must not start a router that
    prices images at nothing (or at anything)."""
    done = subprocess.run(
        [sys.executable, "-m", "autoglm_router.cli", "--endpoint", "http://127.0.0.1:9",
         "--image-max-pixels", value], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "--image-max-pixels" in done.stderr
