"""The admin API at the serving pod, where a client must not reach it: off the engine. It is served
on a port of its own (as the launcher serves it; here the sim, which serves it the same way), never
on the API port, and it refuses every call without the token before anything changes. The engine's
environment holding no token: tests/servers/runtime/test_launcher_process.py (sim) and
tests/engine/test_modes.py (vLLM). Reachable only from the operator: the chart's NetworkPolicy,
checked rendered in tests/helm/test_chart_networkpolicy.py."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from abuse_kit import (
    ADMIN_TOKEN,
    accepted_connections,
    closed_within,
    exchange,
    read_reply,
    request,
)

from autoglm_api.profiles import DRAIN_PATH, MODE_PATH
from autoglm_runtime import admin
from testkit.processes import SimProcess
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(60)

BEARER = f"Bearer {ADMIN_TOKEN}"
CALLS = [("PUT", MODE_PATH, b'{"mode": "batching"}'), ("GET", MODE_PATH, b""),
         ("POST", DRAIN_PATH, b"")]
# Authorization headers that must not open the admin API (None: no header at all).
REFUSED_AUTH = {
    "missing": None,
    "basic-scheme": f"Basic {ADMIN_TOKEN}",
    "token-scheme": f"Token {ADMIN_TOKEN}",
    "no-scheme": ADMIN_TOKEN,
    "empty-token": "Bearer ",
    "scheme-only": "Bearer",
    "wrong-token": "Bearer nope",
    "token-prefix": f"Bearer {ADMIN_TOKEN[:-1]}",
    "token-with-more": f"Bearer {ADMIN_TOKEN}x",
    "two-tokens": f"Bearer nope {ADMIN_TOKEN}",
    "lower-case-scheme-wrong-token": "bearer nope",
}


def state(sim: SimProcess) -> dict[str, object]:
    reply = httpx.get(sim.admin_url + MODE_PATH, headers={"Authorization": BEARER}, timeout=5)
    assert reply.status_code == 200, reply.text
    return reply.json()  # type: ignore[no-any-return]


def unchanged(sim: SimProcess, before: dict[str, object]) -> None:
    after = state(sim)
    for key in ("mode", "switches", "draining"):
        assert after[key] == before[key], (key, before, after)
    assert httpx.get(sim.base_url + "/health", timeout=5).status_code == 200


@pytest.mark.parametrize(("method", "path", "body"), CALLS)
def test_the_api_port_serves_no_admin_path_even_with_the_token(
    sim: SimProcess, method: str, path: str, body: bytes
) -> None:
    """What a client of `<name>-streaming` (or of the router, which 404s it itself) could
    send: the admin token is no use on the API port."""
    before = state(sim)
    headers = {"Authorization": BEARER, "Content-Type": "application/json"}
    reply = exchange(sim.port, request(method, path, body, headers))
    assert reply.status == 404 and b"admin port" in reply.body, reply
    unchanged(sim, before)


@pytest.mark.parametrize(("method", "path", "body"), CALLS)
def test_with_an_api_key_the_admin_paths_are_401_first(
    keyed_sim: SimProcess, method: str, path: str, body: bytes
) -> None:
    """A client without the API key learns nothing of what the API port serves."""
    before = state(keyed_sim)
    reply = exchange(keyed_sim.port, request(method, path, body, {"Authorization": BEARER}))
    assert reply.status == 401 and b"admin" not in reply.body, reply
    unchanged(keyed_sim, before)


@pytest.mark.parametrize("header", list(REFUSED_AUTH.values()), ids=list(REFUSED_AUTH))
@pytest.mark.parametrize(("method", "path", "body"), CALLS)
def test_the_admin_port_refuses_a_missing_or_wrong_token_and_nothing_changes(
    sim: SimProcess, header: str | None, method: str, path: str, body: bytes
) -> None:
    before = state(sim)
    headers = {"Content-Type": "application/json"}
    if header is not None:
        headers["Authorization"] = header
    reply = exchange(sim.admin_port, request(method, path, body, headers))
    assert reply.status == 401, reply
    assert reply.headers["www-authenticate"] == "Bearer"
    assert ADMIN_TOKEN.encode() not in reply.body
    unchanged(sim, before)


def test_a_body_without_the_token_is_refused_before_it_is_read(sim: SimProcess) -> None:
    """A client declaring a large body gets its 401 at once; the server reads none of it."""
    head = (f"PUT {MODE_PATH} HTTP/1.1\r\nHost: pod\r\nContent-Length: 60000\r\n"
            f"Content-Type: application/json\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", sim.admin_port), timeout=5) as sock:
        sock.sendall(head)
        reply = read_reply(sock, timeout=5)
    assert reply.status == 401


@pytest.mark.parametrize(("raw", "status"), [
    (request("PUT", MODE_PATH, b'{"mode": "' + b"b" * 100_000 + b'"}',
             {"Authorization": BEARER}), 413),
    (request("GET", MODE_PATH, headers={"Authorization": BEARER, "X-Big": "x" * 20_000}), 431),
    (request("PUT", MODE_PATH, headers={"Authorization": BEARER,
                                        "Transfer-Encoding": "chunked"}), 411),
    (f"GET {MODE_PATH} HTTP/1.1\r\nAuthorization: {BEARER}\r\nAuthorization: Bearer nope"
     "\r\n\r\n".encode(), 400),
    (f"GET {MODE_PATH} HTTP/1.1\r\nHost: a\r\n Authorization: {BEARER}\r\n\r\n".encode(), 400),
    (request("GET", "/metrics", headers={"Authorization": BEARER}), 404),
    (request("GET", "/v1/models", headers={"Authorization": BEARER}), 404),
])  # fmt: skip
def test_the_admin_port_speaks_only_the_admin_api_within_bounds(sim: SimProcess, raw: bytes,
                                                                 status: int) -> None:
    before = state(sim)
    reply = exchange(sim.admin_port, raw)
    assert reply.status == status, reply
    unchanged(sim, before)


def test_a_slow_client_is_cut_and_a_flood_of_them_ends(sim: SimProcess) -> None:
    """Headers sent a byte at a time, or never finished, hold a connection at most
    admin.REQUEST_SECONDS; past admin.MAX_CONNECTIONS the port answers 503 at once."""
    held = []
    try:
        for _ in range(admin.MAX_CONNECTIONS):
            sock = socket.create_connection(("127.0.0.1", sim.admin_port), timeout=5)
            sock.sendall(f"GET {MODE_PATH} HTTP/1.1\r\nHost: a\r\n".encode())
            held.append(sock)
        # The sim holds every one of them (accepted, its head still unread) before one more
        # arrives: the next connection is past the cap.
        eventually(lambda: accepted_connections(sim.admin_port) == admin.MAX_CONNECTIONS, 5,
                   every=0.05, what=f"the sim holding {admin.MAX_CONNECTIONS} admin connections")
        busy = exchange(sim.admin_port, request("GET", MODE_PATH,
                                                headers={"Authorization": BEARER}))
        assert busy.status == 503 and busy.headers["retry-after"] == "1"
        started = time.monotonic()
        assert all(closed_within(sock, admin.REQUEST_SECONDS + 3) for sock in held)
        assert time.monotonic() - started < admin.REQUEST_SECONDS + 3
    finally:
        for sock in held:
            sock.close()
    assert state(sim)["mode"] in ("streaming", "batching")  # answering again
