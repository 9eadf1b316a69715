"""The admin API apart from the engine (admin.py): the launcher's HTTP side fed raw bytes in
process, and the relay to the middleware over a Unix socket, driven by the app's lifespan."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from asgi_kit import FakeEngine, FakeEngineClient, Host, MakeClient

from autoglm_api.profiles import DRAIN_PATH, MODE_PATH
from autoglm_api.standby import SLEEP_PATH, WAKE_PATH
from autoglm_runtime import admin
from autoglm_runtime.admin import AdminServer, CallRefused, RelayError, RelayRefused, relay_to
from testkit.virtual_time import on_virtual_clock
from testkit.waiting import eventually_async

TOKEN = "test-admin-token"
STATE = {"mode": "streaming", "switches": 0, "inflight": 0, "queued": 0, "draining": False}


class FakeRelay:
    """Answers every relayed call with a state; records the calls."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.down = False
        self.refusal: CallRefused | None = None  # the middleware turns the calls down

    async def __call__(self, call: dict[str, Any]) -> dict[str, Any]:
        if self.down:
            raise RelayError("not listening")
        self.calls.append(call)
        if self.refusal is not None:
            raise RelayRefused(self.refusal)
        return {**STATE, "mode": call.get("mode", "streaming")}


def raw(method: str, path: str, body: bytes = b"", authorization: str | None = None,
        **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: pod"]
    if authorization is not None:
        lines.append(f"Authorization: {authorization}")
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    if body or method in ("PUT", "POST"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + body


async def answer(request: bytes, relay: FakeRelay, token: str | None = TOKEN,
                 eof: bool = True) -> admin.Answer:
    """What the admin server answers `request` (no socket: its reader is fed the bytes)."""
    reader = asyncio.StreamReader(limit=admin.MAX_HEAD_BYTES)
    reader.feed_data(request)
    if eof:
        reader.feed_eof()
    server = AdminServer(lambda: token, relay)
    return await asyncio.wait_for(server._answer(reader), 2)


def error(reply: admin.Answer) -> dict[str, Any]:
    return json.loads(reply.body)["error"]  # type: ignore[no-any-return]


BEARER = f"Bearer {TOKEN}"


async def test_the_token_lets_the_mode_be_read_set_and_the_replica_drained() -> None:
    relay = FakeRelay()
    read = await answer(raw("GET", MODE_PATH, authorization=BEARER), relay)
    put = await answer(raw("PUT", MODE_PATH, b'{"mode": "batching"}', BEARER), relay)
    drained = await answer(raw("POST", DRAIN_PATH, authorization=BEARER), relay)
    assert (read.status, put.status, drained.status) == (200, 200, 202)
    assert json.loads(put.body)["mode"] == "batching"
    assert relay.calls == [{"op": "state"}, {"op": "mode", "mode": "batching"}, {"op": "drain"}]


async def test_sleep_and_wake_are_relayed_and_answer_the_state_at_once() -> None:
    relay = FakeRelay()
    slept = await answer(raw("POST", SLEEP_PATH, b'{"level": 2}', BEARER), relay)
    default = await answer(raw("POST", SLEEP_PATH, authorization=BEARER), relay)
    named_none = await answer(raw("POST", SLEEP_PATH, b"{}", BEARER), relay)
    woken = await answer(raw("POST", WAKE_PATH, authorization=BEARER), relay)
    assert [r.status for r in (slept, default, named_none, woken)] == [202] * 4
    assert json.loads(woken.body)["mode"] == "streaming"
    assert relay.calls == [{"op": "sleep", "level": 2}, {"op": "sleep", "level": 1},
                           {"op": "sleep", "level": 1}, {"op": "wake"}]


async def test_a_call_the_middleware_turns_down_keeps_its_status_and_retry() -> None:
    relay = FakeRelay()
    relay.refusal = CallRefused(409, "2 requests are admitted or queued", 1)
    busy = await answer(raw("POST", SLEEP_PATH, authorization=BEARER), relay)
    assert busy.status == 409 and busy.headers["retry-after"] == "1"
    assert error(busy)["message"] == "2 requests are admitted or queued"
    relay.refusal = CallRefused(409, "started without sleep mode")
    never = await answer(raw("POST", SLEEP_PATH, authorization=BEARER), relay)
    assert never.status == 409 and "retry-after" not in never.headers


# Authorization headers that must not open the admin API (None: no header at all).
REFUSED_AUTH = {
    "missing": None,
    "basic-scheme": f"Basic {TOKEN}",
    "token-scheme": f"Token {TOKEN}",
    "no-scheme": TOKEN,
    "empty-token": "Bearer ",
    "scheme-only": "Bearer",
    "wrong-token": "Bearer nope",
    "token-prefix": f"Bearer {TOKEN[:-1]}",
    "token-with-more": f"Bearer {TOKEN}x",
    "two-tokens": f"Bearer nope {TOKEN}",
    "non-ascii-token": "Bearer t\u00f6ken",
}


@pytest.mark.parametrize("header", list(REFUSED_AUTH.values()), ids=list(REFUSED_AUTH))
@pytest.mark.parametrize(("method", "path", "body"), [
    ("PUT", MODE_PATH, b'{"mode": "batching"}'), ("GET", MODE_PATH, b""),
    ("POST", DRAIN_PATH, b""), ("POST", SLEEP_PATH, b'{"level": 1}'),
    ("POST", WAKE_PATH, b"")])  # fmt: skip
async def test_a_refused_call_is_401_and_relays_nothing(header: str | None, method: str,
                                                        path: str, body: bytes) -> None:
    relay = FakeRelay()
    reply = await answer(raw(method, path, body, header), relay)
    assert reply.status == 401
    assert reply.headers["www-authenticate"] == "Bearer"
    assert error(reply)["type"] == "authentication_error" and error(reply)["code"] == 401
    assert TOKEN.encode() not in reply.body
    assert relay.calls == []


async def test_the_token_is_checked_before_the_body_is_read() -> None:
    """A client without the token gets its 401 while its declared body never arrives."""
    relay = FakeRelay()
    head = raw("PUT", MODE_PATH).replace(b"Content-Length: 0", b"Content-Length: 60000")
    reply = await answer(head, relay, eof=False)
    assert reply.status == 401 and relay.calls == []


async def test_the_token_is_read_again_on_every_call() -> None:
    """The launcher re-reads the mounted file: a token the Secret no longer holds is refused."""
    relay = FakeRelay()
    tokens = iter(["first", "second"])
    server = AdminServer(lambda: next(tokens), relay)
    for expected in (200, 401):
        reader = asyncio.StreamReader()
        reader.feed_data(raw("GET", MODE_PATH, authorization="Bearer first"))
        reader.feed_eof()
        assert (await server._answer(reader)).status == expected


async def test_without_a_configured_token_the_admin_api_is_off() -> None:
    reply = await answer(raw("GET", MODE_PATH, authorization=BEARER), FakeRelay(), token=None)
    assert reply.status == 503
    assert "AUTOGLM_ADMIN_TOKEN_FILE" in error(reply)["message"]


async def test_an_engine_not_serving_yet_is_a_503_to_retry() -> None:
    relay = FakeRelay()
    relay.down = True
    reply = await answer(raw("GET", MODE_PATH, authorization=BEARER), relay)
    assert reply.status == 503 and reply.headers["retry-after"] == "1"


class SlowRelay(FakeRelay):
    """Answers after `seconds`: an engine's API server busy with what it serves."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    async def __call__(self, call: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(self.seconds)
        return await super().__call__(call)


@on_virtual_clock  # the relay answers after the deadline, by the clock, never by chance
async def test_the_client_deadline_covers_its_request_not_the_engines_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(admin, "REQUEST_SECONDS", 0.2)
    # A busy engine answers the relay late: the call goes through, no 408 blames the client.
    late = await answer(raw("PUT", MODE_PATH, b'{"mode": "batching"}', BEARER), SlowRelay(0.5))
    assert late.status == 200 and json.loads(late.body)["mode"] == "batching"
    # A client that never finishes its head is the one the deadline is for.
    slow_client = await answer(b"GET " + MODE_PATH.encode() + b" HTTP/1.1\r\n", FakeRelay(),
                               eof=False)
    assert slow_client.status == 408


async def test_an_engine_that_does_not_answer_the_relay_is_a_503_to_retry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(admin, "RELAY_SECONDS", 0.2)
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # reads the call, never answers

    socket_path = tmp_path / "relay.sock"
    server = await asyncio.start_unix_server(silent, path=str(socket_path))
    try:
        reply = await answer(raw("GET", MODE_PATH, authorization=BEARER),
                             relay_to(socket_path))  # type: ignore[arg-type]
    finally:
        for writer in held:
            writer.close()
        server.close()
    assert reply.status == 503 and reply.headers["retry-after"] == "1"
    assert "did not take the call" in error(reply)["message"]


@pytest.mark.parametrize(("request_bytes", "status", "says"), [
    (raw("DELETE", MODE_PATH, authorization=BEARER), 405, "GET or PUT"),
    (raw("GET", DRAIN_PATH, authorization=BEARER), 405, "POST"),
    (raw("GET", SLEEP_PATH, authorization=BEARER), 405, "POST"),
    (raw("PUT", WAKE_PATH, authorization=BEARER), 405, "POST"),
    (raw("POST", SLEEP_PATH, b'{"level": 3}', BEARER), 400, "Unknown sleep level 3"),
    (raw("POST", SLEEP_PATH, b'{"level": 0}', BEARER), 400, "use 1"),
    (raw("POST", SLEEP_PATH, b'{"level": "1"}', BEARER), 400, 'level "1"'),
    (raw("POST", SLEEP_PATH, b'{"level": true}', BEARER), 400, "level true"),
    (raw("POST", SLEEP_PATH, b'[1]', BEARER), 400, "level null"),
    (raw("POST", SLEEP_PATH, b"{", BEARER), 400, "not JSON"),
    (raw("GET", "/v1/chat/completions", authorization=BEARER), 404, "not an admin path"),
    (raw("GET", "/metrics", authorization=BEARER), 404, "not an admin path"),
    (raw("PUT", MODE_PATH, b'{"mode": "turbo"}', BEARER), 400, '"turbo"'),
    (raw("PUT", MODE_PATH, b'{"mode": ["batching"]}', BEARER), 400, "Unknown mode"),
    (raw("PUT", MODE_PATH, b"{", BEARER), 400, "not JSON"),
    (raw("PUT", MODE_PATH, b"[" * 100_000, BEARER), 413, "larger than"),
    (raw("PUT", MODE_PATH, authorization=BEARER, Transfer_Encoding="chunked"), 411,
     "Content-Length"),
    (raw("GET", MODE_PATH, authorization=BEARER, X_Big="x" * 20_000), 431, "too large"),
    (b"GET " + MODE_PATH.encode() + b" HTTP/1.1\r\nAuthorization: " + BEARER.encode()
     + b"\r\nAuthorization: Bearer nope\r\n\r\n", 400, "twice"),
    (b"GET /autoglm/v1/mode\r\n\r\n", 400, "request line"),
    (b"GET " + MODE_PATH.encode() + b" HTTP/1.1\r\n", 400, "ended"),
])  # fmt: skip
async def test_requests_outside_the_admin_api_are_refused_clearly(
    request_bytes: bytes, status: int, says: str
) -> None:
    relay = FakeRelay()
    reply = await answer(request_bytes, relay)
    assert reply.status == status, reply.body
    assert says in error(reply)["message"]
    assert relay.calls == []


# --- the relay into the middleware --------------------------------------------------------------


def lifespan(middleware: Callable[..., Any], app: Any = None,
             ) -> tuple[asyncio.Queue[dict[str, Any]], list[dict[str, Any]], Any]:
    """Run the app's lifespan through the middleware, as uvicorn does: (to send, sent, task).
    With `app`, its scope carries it, as Starlette's does."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "lifespan"} if app is None else {"type": "lifespan", "app": app}
    task = asyncio.ensure_future(middleware(scope, inbox.get, send))
    return inbox, sent, task


async def test_the_middleware_serves_the_relay_while_the_app_runs(
    make_client: MakeClient, engine: FakeEngine, tmp_path: Path
) -> None:
    socket_path = tmp_path / "relay.sock"
    middleware, client = make_client(admin_socket=socket_path)
    call = relay_to(socket_path)
    inbox, sent, task = lifespan(middleware)
    await inbox.put({"type": "lifespan.startup"})
    await eventually_async(lambda: bool(sent), 2, every=0.01, what="the startup answered")
    assert sent == [{"type": "lifespan.startup.complete"}]

    switched = await call({"op": "mode", "mode": "batching"})
    assert switched["mode"] == "batching" and middleware.mode.value == "batching"
    with pytest.raises(RelayRefused) as refused:  # the fake app holds no engine client
        await call({"op": "sleep", "level": 1})
    assert refused.value.refused.status == 409
    assert "--enable-sleep-mode" in refused.value.refused.message
    drained = await call({"op": "drain"})
    assert drained["draining"] is True
    assert (await client.get("/health")).status_code == 503
    with pytest.raises(RelayError, match="refused"):
        await call({"op": "reboot"})

    await inbox.put({"type": "lifespan.shutdown"})
    await task
    with pytest.raises(RelayError, match="does not answer"):
        await call({"op": "state"})


async def test_a_relayed_sleep_reaches_the_engine_client_of_the_app(
    make_client: MakeClient, tmp_path: Path
) -> None:
    socket_path = tmp_path / "relay.sock"
    middleware, _ = make_client(admin_socket=socket_path)
    engine_client = FakeEngineClient()
    call = relay_to(socket_path)
    inbox, sent, task = lifespan(middleware, Host(middleware, engine_client))
    await inbox.put({"type": "lifespan.startup"})
    await eventually_async(lambda: bool(sent), 2, every=0.01, what="the startup answered")

    state = await call({"op": "sleep", "level": 2})
    assert state["sleeping"] is True
    await eventually_async(lambda: engine_client.asleep, 2, every=0.01, what="asleep")
    assert (await call({"op": "wake"}))["sleeping"] is True  # the wake is under way
    await eventually_async(lambda: not middleware.sleeping, 2, every=0.01, what="awake")
    assert engine_client.calls == [("sleep", 2, "wait"), ("wake_up", ["weights"]),
                                   ("collective_rpc", "reload_weights"),
                                   ("wake_up", ["kv_cache"])]
    await inbox.put({"type": "lifespan.shutdown"})
    await task


async def test_the_api_port_serves_no_admin_path(make_client: MakeClient,
                                                 engine: FakeEngine) -> None:
    _, client = make_client()
    for method, path in (("GET", MODE_PATH), ("PUT", MODE_PATH), ("POST", DRAIN_PATH),
                         ("POST", SLEEP_PATH), ("POST", WAKE_PATH),
                         ("GET", "/autoglm/v2/anything")):
        reply = await client.request(method, path, json={"mode": "batching"},
                                     headers={"Authorization": f"Bearer {TOKEN}"})
        assert reply.status_code == 404, (method, path)
        assert "admin port" in reply.json()["error"]["message"]
    assert engine.paths == []  # nothing reached the engine either


async def test_a_relay_socket_lives_in_a_folder_only_its_user_may_enter() -> None:
    with admin.relay_socket() as path:
        assert path.parent.stat().st_mode & 0o777 == 0o700
        folder = path.parent
    assert not folder.exists()

