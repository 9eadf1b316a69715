"""The admin API at the serving pod, where a client must not reach it: off the engine. It is served
on a port of its own (as the launcher serves it; here the sim, which serves it the same way), never
on the API port, and it refuses every call without the token before anything changes. The engine's
environment holding no token: tests/servers/runtime/test_launcher_process.py (sim) and
tests/engine/test_modes.py (vLLM). Reachable only from the operator: the chart's NetworkPolicy,
checked rendered in tests/helm/test_chart_networkpolicy.py.

Sleep and wake (scale to zero's standby, docs/operations/scale-to-zero.md) are admin calls too:
refused without the token, a body naming no sleep level vLLM has refused before anything
sleeps, a sim without sleep mode answering 409, and repeated calls changing nothing twice."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from abuse_kit import (
    ADMIN_TOKEN,
    CHAT,
    Reply,
    StartSim,
    accepted_connections,
    closed_within,
    exchange,
    read_reply,
    request,
)

from autoglm_api.profiles import DRAIN_PATH, MODE_PATH
from autoglm_api.standby import SLEEP_PATH, SLEEPING_METRIC, WAKE_PATH
from autoglm_runtime import admin
from testkit.probe import metric
from testkit.processes import SimProcess
from testkit.waiting import TIME_SCALE, eventually

pytestmark = pytest.mark.timeout(60)

BEARER = f"Bearer {ADMIN_TOKEN}"
CALLS = [("PUT", MODE_PATH, b'{"mode": "batching"}'), ("GET", MODE_PATH, b""),
         ("POST", DRAIN_PATH, b""), ("POST", SLEEP_PATH, b'{"level": 1}'),
         ("POST", WAKE_PATH, b"")]
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


# A sim's level-1 wake, in seconds: long enough that calls sent meanwhile arrive during it.
WAKE_SECONDS = 2.0


@pytest.fixture(scope="module")
def sleepy_sim(start_sim: StartSim) -> SimProcess:
    """A sim started with sleep mode (vLLM's --enable-sleep-mode), at real time: a sleep that
    got through would show. Every test leaves it awake."""
    return start_sim("--enable-sleep-mode", "--time-factor", "1",
                     "--wake-seconds", str(WAKE_SECONDS))


def state(sim: SimProcess) -> dict[str, object]:
    reply = httpx.get(sim.admin_url + MODE_PATH, headers={"Authorization": BEARER}, timeout=5)
    assert reply.status_code == 200, reply.text
    return reply.json()  # type: ignore[no-any-return]


def unchanged(sim: SimProcess, before: dict[str, object]) -> None:
    after = state(sim)
    for key in ("mode", "switches", "draining", "sleeping"):
        assert after[key] == before[key], (key, before, after)
    assert after["sleeping"] is False, after
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
    sleepy_sim: SimProcess, header: str | None, method: str, path: str, body: bytes
) -> None:
    """On a sim that can sleep: a sleep that got past the token would leave it sleeping."""
    before = state(sleepy_sim)
    headers = {"Content-Type": "application/json"}
    if header is not None:
        headers["Authorization"] = header
    reply = exchange(sleepy_sim.admin_port, request(method, path, body, headers))
    assert reply.status == 401, reply
    assert reply.headers["www-authenticate"] == "Bearer"
    assert ADMIN_TOKEN.encode() not in reply.body
    unchanged(sleepy_sim, before)


@pytest.mark.parametrize(("method", "path"), [("PUT", MODE_PATH), ("POST", SLEEP_PATH)])
def test_a_body_without_the_token_is_refused_before_it_is_read(sim: SimProcess, method: str,
                                                                path: str) -> None:
    """A client declaring a large body gets its 401 at once; the server reads none of it."""
    head = (f"{method} {path} HTTP/1.1\r\nHost: pod\r\nContent-Length: 60000\r\n"
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
        bound = admin.REQUEST_SECONDS + 3 * TIME_SCALE
        assert all(closed_within(sock, bound) for sock in held)
        assert time.monotonic() - started < bound
    finally:
        for sock in held:
            sock.close()
    assert state(sim)["mode"] in ("streaming", "batching")  # answering again


# --- sleep and wake (scale to zero's standby) -----------------------------------------------

def admin_call(sim: SimProcess, method: str, path: str, body: bytes = b"") -> Reply:
    """A call with the right token."""
    return exchange(sim.admin_port, request(method, path, body, {
        "Authorization": BEARER, "Content-Type": "application/json"}))


HUGE = b"1" + b"0" * 4000  # 4001 digits: Python's JSON parser makes an int of it
HOSTILE_SLEEP_BODIES = {
    # case: (body, status, the parameter the error names)
    "level-0": (b'{"level": 0}', 400, "level"),
    "level-3": (b'{"level": 3}', 400, "level"),
    "level-negative": (b'{"level": -1}', 400, "level"),
    "level-fraction": (b'{"level": 1.5}', 400, "level"),
    "level-a-string": (b'{"level": "1"}', 400, "level"),
    "level-true": (b'{"level": true}', 400, "level"),
    "level-null": (b'{"level": null}', 400, "level"),
    "level-a-list": (b'{"level": [1]}', 400, "level"),
    "level-an-object": (b'{"level": {"level": 1}}', 400, "level"),
    "level-nan": (b'{"level": NaN}', 400, "level"),
    "level-infinity": (b'{"level": Infinity}', 400, "level"),
    "level-huge": (b'{"level": ' + HUGE + b"}", 400, "level"),
    # Past the 4300 digits Python converts to an int: no JSON it reads.
    "level-too-many-digits": (b'{"level": ' + b"1" * 5000 + b"}", 400, None),
    "body-a-list": (b'[{"level": 1}]', 400, "level"),
    "body-null": (b"null", 400, "level"),
    "body-a-number": (b"1", 400, "level"),
    "not-json": (b"level=1", 400, None),
    "truncated-json": (b'{"level": 1', 400, None),
    "nested-past-the-parser's-depth": (b"[" * 30_000 + b"]" * 30_000, 400, None),
    # A valid level, in a body over the limit: refused before it is read.
    "over-max-body-bytes": (b'{"level": 1, "pad": "' + b"x" * admin.MAX_BODY_BYTES + b'"}',
                            413, None),
}


@pytest.mark.parametrize(("body", "status", "param"), list(HOSTILE_SLEEP_BODIES.values()),
                         ids=list(HOSTILE_SLEEP_BODIES))
def test_a_sleep_whose_body_names_no_sleep_level_is_a_4xx_and_nothing_sleeps(
    sleepy_sim: SimProcess, body: bytes, status: int, param: str | None
) -> None:
    before = state(sleepy_sim)
    reply = admin_call(sleepy_sim, "POST", SLEEP_PATH, body)
    assert reply.status == status, reply
    error = json.loads(reply.body)["error"]
    assert (error["code"], error["param"]) == (status, param), error
    assert error["message"], error
    unchanged(sleepy_sim, before)
    assert metric(sleepy_sim.base_url, SLEEPING_METRIC) == 0


@pytest.mark.parametrize("body", [b"", b'{"level": 1}', b'{"level": 2}'],
                         ids=["no-body", "level-1", "level-2"])
def test_a_sleep_on_a_sim_without_sleep_mode_is_409_and_changes_nothing(
    sim: SimProcess, body: bytes
) -> None:
    before = state(sim)
    reply = admin_call(sim, "POST", SLEEP_PATH, body)
    assert reply.status == 409, reply
    assert b"--enable-sleep-mode" in reply.body
    unchanged(sim, before)
    assert metric(sim.base_url, SLEEPING_METRIC) == 0


def test_a_wake_of_a_replica_awake_changes_nothing(sim: SimProcess) -> None:
    before = state(sim)
    reply = admin_call(sim, "POST", WAKE_PATH)
    assert reply.status == 202 and json.loads(reply.body)["sleeping"] is False, reply
    unchanged(sim, before)


def test_sleep_and_wake_sent_twice_in_a_row_act_once_and_the_state_ends_consistent(
    sleepy_sim: SimProcess,
) -> None:
    """What an operator that retries (or two of them) sends: a second sleep or wake while the
    first is under way starts nothing more, and a sleep during a wake is refused, to retry."""
    sim = sleepy_sim
    before = state(sim)
    sleeps = metric(sim.base_url, "autoglm_sleeps_total")
    wakes = metric(sim.base_url, "autoglm_wake_seconds_count")

    def sleeps_total() -> float:
        return metric(sim.base_url, "autoglm_sleeps_total")

    def awake() -> bool:
        return state(sim)["sleeping"] is False

    slept = admin_call(sim, "POST", SLEEP_PATH, b'{"level": 1}')
    assert slept.status == 202 and json.loads(slept.body)["sleeping"] is True, slept
    eventually(lambda: sleeps_total() == sleeps + 1, 10, what="the sim asleep")

    # A wake twice in a row: one wake, which takes WAKE_SECONDS.
    woken = [admin_call(sim, "POST", WAKE_PATH) for _ in range(2)]
    assert [w.status for w in woken] == [202, 202], woken
    assert all(json.loads(w.body)["sleeping"] is True for w in woken)  # until the wake ends
    during = admin_call(sim, "POST", SLEEP_PATH, b'{"level": 1}')
    assert during.status == 409 and during.headers["retry-after"] == "1", during
    eventually(awake, WAKE_SECONDS + 5, what="the sim awake after its wake")
    assert metric(sim.base_url, "autoglm_wake_seconds_count") == wakes + 1

    # A sleep twice in a row: one sleep.
    twice = [admin_call(sim, "POST", SLEEP_PATH, b'{"level": 1}') for _ in range(2)]
    assert [r.status for r in twice] == [202, 202], twice
    assert all(json.loads(r.body)["sleeping"] is True for r in twice)
    eventually(lambda: sleeps_total() == sleeps + 2, 10, what="the sim asleep again")
    assert metric(sim.base_url, "vllm:engine_sleep_state", sleep_state="weights_offloaded") == 1

    # Woken once more, it is where it started, and serves.
    assert admin_call(sim, "POST", WAKE_PATH).status == 202
    eventually(awake, WAKE_SECONDS + 5, what="the sim awake after its second wake")
    unchanged(sim, before)
    assert sleeps_total() == sleeps + 2
    assert metric(sim.base_url, "autoglm_wake_seconds_count") == wakes + 2
    assert metric(sim.base_url, SLEEPING_METRIC) == 0
    assert metric(sim.base_url, "vllm:engine_sleep_state", sleep_state="awake") == 1
    chat = httpx.post(sim.base_url + CHAT, timeout=30, json={
        "model": "autoglm-phone-9b", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4})
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"], chat.text
