"""The abuse suite through a gateway: real Envoy (testkit.gateway, the GIE shape with the router's
limits) in front of our endpoint picker, a recording replica behind. The picker refuses what
the HTTP router refuses, with the same answers; Envoy holds the connection limits; and with the
picker down and FailOpen, the replicas' own checks hold alone.

Not here, because a gateway owns them, not the picker: X-Forwarded-For and -Host (Envoy appends
the client's address to a client's X-Forwarded-For under its own use_remote_address rules), and
the connection cap's answer (Envoy stops accepting connections; the router answers 503)."""

from __future__ import annotations

import json
import socket
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
    StartGateway,
    StartSim,
    closed_within,
    empty_objects_body,
    exchange,
    peak_rss_bytes,
    read_reply,
    request,
)

from testkit.gateway import Gateway, GatewayLimits
from testkit.probe import metric
from testkit.processes import SimProcess
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(90)

# The picker holds nothing here (no --hold-queue-size): Envoy's request deadline is the body's.
STRICT = GatewayLimits(header_timeout=1, body_timeout=1, keep_alive=1, max_connections=16,
                       max_header_bytes=16384, max_headers=64, hold_seconds=0)


@pytest.fixture(scope="module")
def gateway(gateways: StartGateway, recorder: RecordingReplica) -> Gateway:
    return gateways([recorder.base_url])


@pytest.fixture(scope="module")
def strict(gateways: StartGateway, recorder: RecordingReplica) -> Gateway:
    return gateways([recorder.base_url], "--max-inflight", "2", limits=STRICT)


def picker_inflight(gateway: Gateway) -> float:
    return metric(gateway.picker.ops_url, "autoglm_router_inflight")


# --- a large body read before anything is allowed --------------------------------------------


def test_an_unauthenticated_16_mib_body_never_reaches_the_picker(
    gateways: StartGateway, recorder: RecordingReplica
) -> None:
    gateway = gateways([recorder.base_url], env={"VLLM_API_KEY": API_KEY})
    before = len(recorder.forwarded())
    reply = httpx.post(gateway.base_url + CHAT, content=empty_objects_body(int(15.7 * MIB)),
                       timeout=30)
    picker_peak = peak_rss_bytes(gateway.picker.pid)
    print(f"peak RSS after one unauthenticated 15.7 MiB body: picker {picker_peak / MIB:.0f} "
          f"MiB, Envoy {peak_rss_bytes(gateway.envoy.pid) / MIB:.0f} MiB")
    assert reply.status_code == 401 and reply.json() == {"error": "Unauthorized"}
    assert len(recorder.forwarded()) == before
    assert picker_peak < 160 * MIB


def test_bodies_at_the_size_limit_arriving_together_keep_the_picker_under_its_limit(
    gateway: Gateway,
) -> None:
    """The HTTP router's budget's worth (128 MiB): the picker counts each body twice while it
    decides (gRPC's copy and the message's bytes), so some are refused 503."""
    body = empty_objects_body(int(15.7 * MIB))
    statuses: list[int] = []

    def send() -> None:
        statuses.append(httpx.post(gateway.base_url + CHAT, content=body,
                                   timeout=80).status_code)

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(80)
    peak = peak_rss_bytes(gateway.picker.pid)
    print(f"peak RSS after eight 15.7 MiB bodies at once: picker {peak / MIB:.0f} MiB, "
          f"Envoy {peak_rss_bytes(gateway.envoy.pid) / MIB:.0f} MiB")
    assert len(statuses) == 8 and all(s in (200, 503) for s in statuses), statuses
    assert peak < ROUTER_MEMORY_LIMIT


def test_a_body_over_the_limit_gets_413(gateway: Gateway, recorder: RecordingReplica) -> None:
    before = len(recorder.forwarded())
    reply = httpx.post(gateway.base_url + CHAT, content=b"x" * (16 * MIB + 1), timeout=30)
    assert reply.status_code == 413
    assert len(recorder.forwarded()) == before


# --- paths outside the API --------------------------------------------------------------------


@pytest.mark.parametrize(("method", "target", "status"), REFUSED_TARGETS)
def test_the_picker_speaks_only_the_api(gateway: Gateway, recorder: RecordingReplica,
                                        method: str, target: str, status: int) -> None:
    """Envoy passes the raw path on (no normalize_path): the picker's allow-list judges it."""
    before = len(recorder.forwarded())
    reply = exchange(gateway.envoy.port,
                     request(method, target, b"{}" if method != "GET" else b""))
    assert reply.status == status, reply
    assert len(recorder.forwarded()) == before, recorder.forwarded()[before:]


def test_only_allow_listed_paths_reached_a_replica(gateway: Gateway,
                                                   recorder: RecordingReplica) -> None:
    before = len(recorder.forwarded())
    for method, target in sorted(ALLOWED):
        reply = exchange(gateway.envoy.port,
                         request(method, target, b"{}" if method == "POST" else b""))
        assert reply.status == 200, (method, target, reply)
    arrived = {(s.method, s.raw_path) for s in recorder.forwarded()}
    assert arrived <= ALLOWED, arrived - ALLOWED
    # Each request this test sent arrived: the record above is not empty by accident.
    assert {(s.method, s.raw_path) for s in recorder.forwarded()[before:]} == ALLOWED


def test_a_query_string_travels_encoded_as_sent(gateway: Gateway,
                                                recorder: RecordingReplica) -> None:
    assert exchange(gateway.envoy.port, request("GET", "/v1/models?a=%2F..%2Fb&c=%23")).status \
        == 200
    seen = recorder.forwarded()[-1]
    assert (seen.raw_path, seen.query) == ("/v1/models", "a=%2F..%2Fb&c=%23")


@pytest.mark.parametrize("path", ["/metrics", "/health"])
def test_metrics_and_health_are_not_on_the_gateway(gateway: Gateway, path: str) -> None:
    assert exchange(gateway.envoy.port, request("GET", path)).status == 404


# --- slow and flooding clients, with Envoy holding the limits ----------------------------------


@pytest.mark.parametrize(("case", "sent"), [
    ("nothing sent", b""),
    ("headers never finished", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"),
    ("body never finished",
     b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"a\""),
])
def test_a_slow_client_is_cut_at_its_deadline(strict: Gateway, case: str, sent: bytes) -> None:
    with socket.create_connection(("127.0.0.1", strict.envoy.port), timeout=5) as sock:
        sock.sendall(sent)
        assert closed_within(sock, 4.0), f"{case}: still open after 4 s"


def test_an_idle_kept_alive_connection_is_closed(strict: Gateway) -> None:
    with socket.create_connection(("127.0.0.1", strict.envoy.port), timeout=5) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_reply(sock, 5).status == 200
        # Envoy drains a connection past its idle timeout (1 s) for its drain_timeout (5 s).
        assert closed_within(sock, 8.0)


@pytest.mark.parametrize(("case", "headers"), [
    ("one 100 KiB header", {"X-Big": "a" * 100 * 1024}),
    ("2000 headers", {f"X-H{i}": "1" for i in range(2000)}),
])
def test_oversized_headers_get_431_and_reach_no_replica(
    strict: Gateway, recorder: RecordingReplica, case: str, headers: dict[str, str]
) -> None:
    before = len(recorder.forwarded())
    reply = exchange(strict.envoy.port, request("POST", CHAT, CHAT_BODY, headers))
    assert reply.status == 431, case
    assert len(recorder.forwarded()) == before


def test_connections_past_the_cap_are_not_served(strict: Gateway) -> None:
    # Earlier tests' connections may still be draining (drain_timeout 5 s) and hold slots of
    # the cap: start from none, so the 16 below are the ones Envoy holds.
    eventually(lambda: strict.envoy.stats().get("http.gateway.downstream_cx_active") == 0,
               15, every=0.1, what="Envoy holding no connection of earlier tests")
    idle = [socket.create_connection(("127.0.0.1", strict.envoy.port), timeout=5)
            for _ in range(16)]
    try:
        # Envoy counts a connection once a worker accepted it; until all 16 are, a 17th fits.
        eventually(lambda: strict.envoy.stats().get("http.gateway.downstream_cx_active") == 16,
                   5, every=0.05, what="Envoy holding the 16 idle connections")
        assert exchange(strict.envoy.port, request("GET", "/v1/models")).status == 0
    finally:
        for sock in idle:
            sock.close()
    eventually(lambda: exchange(strict.envoy.port, request("GET", "/v1/models")).status == 200, 5,
               every=0.05, what="Envoy answering GET /v1/models")


def test_requests_past_the_pickers_cap_get_the_routers_503(strict: Gateway) -> None:
    slow = json.dumps({"messages": [{"role": "user", "content": "slow"}]}).encode()
    replies = []

    def send() -> None:
        replies.append(exchange(strict.envoy.port, request("POST", CHAT, slow), timeout=10))

    threads = [threading.Thread(target=send) for _ in range(2)]
    for thread in threads:
        thread.start()
    # Both held by the replica for 2 s.
    eventually(lambda: picker_inflight(strict) == 2, 5, every=0.05,
               what="2 requests in flight at the picker")
    third = exchange(strict.envoy.port, request("POST", CHAT, slow), timeout=10)
    for thread in threads:
        thread.join(10)
    assert third.status == 503 and third.headers["retry-after"] == "1", third
    assert json.loads(third.body)["error"]["message"] == \
        "The router is at its request limit; retry shortly."
    assert [r.status for r in replies] == [200, 200]


# --- a client that stops reading keeps its slot ------------------------------------------------


def test_a_client_that_stops_reading_is_cut_and_its_slot_freed(
    gateways: StartGateway, recorder: RecordingReplica
) -> None:
    """Envoy has no timeout for a stalled client alone: its stream idle timeout (3 s here, the
    router's --idle-timeout by default) cuts a stream that moves no bytes either way."""
    gateway = gateways([recorder.base_url], limits=GatewayLimits(stream_idle=3))
    flood = json.dumps({"messages": [{"role": "user", "content": "flood"}],
                        "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", gateway.envoy.port), timeout=5) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(request("POST", CHAT, flood))
        # Started; the client reads no more.
        eventually(lambda: picker_inflight(gateway) == 1, 3, every=0.05,
                   what="the request in flight at the picker")
        eventually(lambda: picker_inflight(gateway) == 0, 10, every=0.2,
                   what="nothing in flight at the picker")


# --- headers -------------------------------------------------------------------------------------


def test_a_websocket_upgrade_gets_a_4xx(gateway: Gateway) -> None:
    reply = exchange(gateway.envoy.port, request("GET", CHAT, headers={
        "Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}))
    assert 400 <= reply.status < 500, reply


def test_a_clients_request_id_is_replaced_by_the_gateways(
    gateway: Gateway, recorder: RecordingReplica
) -> None:
    reply = exchange(gateway.envoy.port, request("POST", CHAT, CHAT_BODY,
                                                 {"X-Request-Id": "client-chosen"}))
    assert reply.status == 200
    seen = recorder.forwarded()[-1]
    assert seen.header("x-request-id") == [reply.headers["x-request-id"]]
    assert reply.headers["x-request-id"] != "client-chosen"


def test_each_sequence_of_a_fanned_out_request_is_counted(gateway: Gateway) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "slow"}], "n": 3}).encode()
    done = threading.Event()

    def send() -> None:
        exchange(gateway.envoy.port, request("POST", CHAT, body), timeout=10)
        done.set()

    threading.Thread(target=send).start()
    try:
        eventually(lambda: picker_inflight(gateway) == 3, 3, every=0.05,
                   what="3 requests in flight at the picker")  # the replica holds it for 2 s
    finally:
        done.wait(10)
    eventually(lambda: picker_inflight(gateway) == 0, 3, every=0.05,
               what="nothing in flight at the picker")


# --- what held up: keep it that way --------------------------------------------------------------


@pytest.mark.parametrize(("case", "raw"), SMUGGLING)
def test_request_smuggling_is_refused(gateway: Gateway, recorder: RecordingReplica,
                                      case: str, raw: bytes) -> None:
    before = len(recorder.forwarded())
    reply = exchange(gateway.envoy.port, raw)
    assert reply.status in (0, 400), (case, reply)
    assert all(s.raw_path == CHAT for s in recorder.forwarded()[before:]), case


def test_hop_by_hop_headers_are_dropped(gateway: Gateway, recorder: RecordingReplica) -> None:
    """Envoy keeps TE and Proxy-Authorization; the picker removes them, as the router does."""
    reply = exchange(gateway.envoy.port, request("POST", CHAT, CHAT_BODY, {
        "Connection": "close, x-secret", "X-Secret": "1", "Keep-Alive": "timeout=5",
        "TE": "trailers", "Proxy-Authorization": "Basic eA=="}))
    assert reply.status == 200
    names = {k for k, _ in recorder.forwarded()[-1].headers}
    assert not names & {"x-secret", "keep-alive", "te", "proxy-authorization"}


def test_an_absolute_uri_target_goes_to_the_pickers_replica(
    gateway: Gateway, recorder: RecordingReplica
) -> None:
    reply = exchange(gateway.envoy.port, request("GET", "http://169.254.169.254/v1/models"))
    assert reply.status == 200, reply
    assert recorder.forwarded()[-1].raw_path == "/v1/models"


# --- FailOpen: past the picker, the replicas' own checks hold alone ----------------------------


@pytest.fixture(scope="module")
def open_past_a_dead_picker(gateways: StartGateway, start_sim: StartSim
                            ) -> tuple[Gateway, SimProcess]:  # fmt: skip
    sim = start_sim(env={"VLLM_API_KEY": API_KEY})
    gateway = gateways([sim.base_url], shape="override_host", fail_open=True)
    gateway.picker.stop()
    return gateway, sim


KEY = {"Authorization": f"Bearer {API_KEY}"}


def _chat(*parts: dict[str, object], **extra: object) -> bytes:
    content = [{"type": "text", "text": "what is on the screen?"}, *parts]
    return json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": 4,
                       **extra}).encode()


def _image(url: str) -> dict[str, object]:
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.mark.parametrize(("case", "path", "body", "headers", "status"), [
    ("no key", CHAT, _chat(), {}, 401),
    ("a metadata address", CHAT, _chat(_image("http://169.254.169.254/latest/meta-data/")),
     KEY, 400),
    ("a cluster-internal name", CHAT, _chat(_image("http://kubernetes.default.svc/api/v1/")),
     KEY, 400),
    ("a file URL", CHAT, _chat(_image("file:///etc/passwd")), KEY, 400),
    ("a 5001-digit max_tokens", CHAT,
     b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1' + b"0" * 5000 + b"}",
     KEY, 400),
    ("a route that renders messages", "/tokenize", _chat(), KEY, 404),
    ("n past the cap", CHAT, _chat(n=64), KEY, 400),
])
def test_the_replicas_refuse_alone_what_the_picker_would_have(
    open_past_a_dead_picker: tuple[Gateway, SimProcess], case: str, path: str, body: bytes,
    headers: dict[str, str], status: int
) -> None:
    gateway, sim = open_past_a_dead_picker
    admitted = metric(sim.base_url, "autoglm_requests_admitted_total")
    reply = httpx.post(gateway.base_url + path, content=body, timeout=20,
                       headers={"Content-Type": "application/json", **headers})
    assert reply.status_code == status, (case, reply.text)
    assert metric(sim.base_url, "autoglm_requests_admitted_total") == admitted, case


def test_fail_open_serves_a_request_the_replica_accepts(
    open_past_a_dead_picker: tuple[Gateway, SimProcess],
) -> None:
    gateway, _ = open_past_a_dead_picker
    reply = httpx.post(gateway.base_url + CHAT, content=_chat(), timeout=20,
                       headers={"Content-Type": "application/json", **KEY})
    assert reply.status_code == 200, reply.text
