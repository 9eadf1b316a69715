"""The admin API on a port of its own, apart from the engine.

The mode lives in the mode middleware, inside vLLM's API server; the admin token must not: the
engine's environment reaches every process vLLM starts, and the API port every client. So the
launcher (PID 1 of the serving container; the sim in its own process) serves `AdminServer` on
`AUTOGLM_ADMIN_PORT`, checks the token there, and relays each allowed call to the middleware
over a Unix socket in a private (0700) directory it creates for its child. The middleware
listens on that socket from its lifespan (`serve_relay`); the engine gets the socket's path,
never the token, and the API port serves no admin path at all.

Relay: one JSON line each way per connection. `{"op": "state"}`, `{"op": "mode", "mode": M}`,
`{"op": "drain"}`, `{"op": "sleep", "level": N}` and `{"op": "wake"}` answer the middleware's
state (`ModeMiddleware.state`), or `{"error": "..."}`; a call the middleware turns down on
purpose (a sleep while requests run) adds the HTTP status to answer and may add `retry_after`.

HTTP: one request per connection (`Connection: close`), read within `REQUEST_SECONDS` (408
past it), its head within `MAX_HEAD_BYTES`; the token is checked before a body is read; a relay
that fails or takes longer than `RELAY_SECONDS` a step is a 503 with Retry-After; at most
`MAX_CONNECTIONS` at once (503 past it). The operator and the pod's own preStop hook call it;
the launcher drains through the relay itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

from autoglm_api.profiles import DRAIN_PATH, MODE_PATH, Mode
from autoglm_api.standby import SLEEP_PATH, WAKE_PATH
from autoglm_runtime.requests import error_body

log = logging.getLogger("autoglm_runtime.admin")

RELAY_SOCKET_NAME = "relay.sock"
RELAY_SECONDS = 5.0
MAX_RELAY_LINE = 64 * 1024
REQUEST_SECONDS = 5.0
MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 64 * 1024
MAX_CONNECTIONS = 16

State = dict[str, Any]
Relay = Callable[[State], Awaitable[State]]
RelayHandler = Callable[[State], State]


class RelayError(Exception):
    """The middleware could not be asked (not listening yet, gone, or a broken answer)."""


class CallRefused(Exception):
    """The middleware's answer to a call it will not carry out now: the HTTP status, the
    message, and the seconds to wait before a retry when one can succeed."""

    def __init__(self, status: int, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after

    def relayed(self) -> State:
        return {"error": self.message, "status": self.status, "retry_after": self.retry_after}


class RelayRefused(RelayError):
    """The middleware took the call and refused it (CallRefused, relayed)."""

    def __init__(self, refused: CallRefused) -> None:
        super().__init__(refused.message)
        self.refused = refused


# --- the relay: the middleware's end and the launcher's -----------------------------------


async def serve_relay(path: Path, handle: RelayHandler) -> asyncio.AbstractServer:
    """Listen on `path` (inside a directory only this user may enter) for relayed calls."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), RELAY_SECONDS)
            try:
                request = json.loads(line)
                answer = handle(request) if isinstance(request, dict) else {"error": "not a call"}
            except CallRefused as refused:
                answer = refused.relayed()
            except (ValueError, KeyError) as exc:
                answer = {"error": f"bad call: {exc}"}
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    return await asyncio.start_unix_server(connection, path=str(path), limit=MAX_RELAY_LINE)


def relay_to(path: Path) -> Relay:
    """A call over the relay socket at `path`; RelayError when it cannot be made."""

    async def call(request: State) -> State:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(str(path), limit=MAX_RELAY_LINE), RELAY_SECONDS)
        except (OSError, TimeoutError) as exc:
            raise RelayError(f"the engine's API server does not answer yet ({exc})") from exc
        try:
            writer.write(json.dumps(request).encode() + b"\n")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), RELAY_SECONDS)
            answer = json.loads(line)
        except (OSError, TimeoutError, ValueError, asyncio.LimitOverrunError) as exc:
            raise RelayError(f"the relay to the engine's API server failed ({exc})") from exc
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        if isinstance(answer, dict) and isinstance(answer.get("status"), int):
            retry = answer.get("retry_after")
            raise RelayRefused(CallRefused(answer["status"], str(answer.get("error")),
                                           retry if isinstance(retry, int) else None))
        if not isinstance(answer, dict) or "error" in answer:
            raise RelayError(f"the engine's API server refused the call: {answer}")
        return answer

    return call


# --- the HTTP side ------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    head_only: bool = False  # the answer to a HEAD request: no body on the wire


class _Refused(Exception):
    """A request answered with an error, before anything is relayed."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None, *,
                 param: str | None = None, err_type: str | None = None) -> None:
        super().__init__(message)
        self.answer = Answer(status, error_body(message, status, param, err_type), headers or {})


@dataclass(frozen=True)
class Head:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names; a repeated header is refused


def parse_head(raw: bytes) -> Head:
    """The request line and headers of one request; _Refused (400) for anything unclear."""
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _Refused(400, "Malformed request line.")
    method, target, _ = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        name = name.lower()
        if not sep or not name or name != name.strip() or "\r" in value or "\n" in value:
            raise _Refused(400, "Malformed header line.")
        if name in headers:
            raise _Refused(400, f"Header {name} is given twice.")
        headers[name] = value.strip()
    path = target.split("?", 1)[0]
    return Head(method, path, headers)


def bearer(headers: dict[str, str]) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def authorize(head: Head, token: str | None) -> None:
    """_Refused unless the request carries the configured token (re-read on every call)."""
    if token is None:
        raise _Refused(503, "The admin API is disabled: no admin token is configured "
                            "(set AUTOGLM_ADMIN_TOKEN_FILE or AUTOGLM_ADMIN_TOKEN).")
    presented = bearer(head.headers)
    if presented is None or not hmac.compare_digest(presented.encode(), token.encode()):
        raise _Refused(401, "A valid `Authorization: Bearer <token>` header is required.",
                       {"www-authenticate": "Bearer"}, err_type="authentication_error")


# Each admin path and the methods it takes.
ROUTES = {MODE_PATH: ("GET", "PUT"), DRAIN_PATH: ("POST",), SLEEP_PATH: ("POST",),
          WAKE_PATH: ("POST",)}
# Calls that start something the state shows under way (202): a drain, a sleep, a wake.
STARTED = frozenset({DRAIN_PATH, SLEEP_PATH, WAKE_PATH})
SLEEP_LEVELS = (1, 2)


def route(head: Head) -> None:
    """_Refused unless the path and method are the admin API's."""
    allowed = ROUTES.get(head.path)
    if allowed is None:
        paths = ", ".join(f"{path} ({', '.join(methods)})" for path, methods in ROUTES.items())
        raise _Refused(404, f"{head.path} is not an admin path; the admin API is {paths}.")
    if head.method not in allowed:
        raise _Refused(405, f"Use {' or '.join(allowed)}.", {"allow": ", ".join(allowed)})


def relay_request(head: Head, body: bytes) -> State:
    """The relay call for an allowed request; _Refused (400) for a body that names no mode,
    or a sleep level vLLM does not have."""
    if head.path == DRAIN_PATH:
        return {"op": "drain"}
    if head.path == WAKE_PATH:
        return {"op": "wake"}
    if head.path == SLEEP_PATH:
        return {"op": "sleep", "level": _sleep_level(body)}
    if head.method == "GET":
        return {"op": "state"}
    data = _json(body)
    mode = data.get("mode") if isinstance(data, dict) else None
    if not isinstance(mode, str) or mode not in {m.value for m in Mode}:
        valid = ", ".join(f'"{m.value}"' for m in Mode)
        raise _Refused(400, f"Unknown mode {json.dumps(mode)}; use one of {valid}.",
                       param="mode")
    return {"op": "mode", "mode": mode}


def _sleep_level(body: bytes) -> int:
    """The level a sleep asks for: 1 (vLLM's default) when the body is empty or names none."""
    data = _json(body) if body.strip() else {}
    level = data.get("level", 1) if isinstance(data, dict) else None
    if isinstance(level, bool) or level not in SLEEP_LEVELS:
        raise _Refused(400, f"Unknown sleep level {json.dumps(level)}; use 1 (the weights move "
                            "to CPU memory) or 2 (they are dropped and reloaded on waking).",
                       param="level")
    return int(level)


def _json(body: bytes) -> object:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise _Refused(400, "The body is not JSON.") from None


class AdminServer:
    """The admin API over HTTP/1.1: checks the token, then relays the call."""

    def __init__(self, token: Callable[[], str | None], relay: Relay) -> None:
        self.token = token
        self.relay = relay
        self.active = 0

    async def start(self, host: str | None, port: int) -> asyncio.AbstractServer:
        """Listen on `host` (None: every interface) and `port`."""
        server = await asyncio.start_server(self._connection, host, port, limit=MAX_HEAD_BYTES)
        log.info("Serving the admin API on port %d", port)
        return server

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        self.active += 1
        try:
            if self.active > MAX_CONNECTIONS:
                answer = Answer(503, error_body("Too many admin connections.", 503),
                                {"retry-after": "1"})
            else:
                answer = await self._answer(reader)
            await _write(writer, answer)
        except OSError:
            pass
        finally:
            self.active -= 1
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader) -> Answer:
        try:
            # The deadline is the client's: its head and body. The relay has bounds of its
            # own, and an engine slow to answer is a 503 to retry, not the client's fault.
            async with asyncio.timeout(REQUEST_SECONDS):
                head, call = await self._read_call(reader)
        except TimeoutError:
            return Answer(408, error_body("The request took too long.", 408))
        except _Refused as refused:
            return refused.answer
        try:
            state = await self.relay(call)
        except RelayRefused as exc:
            said = exc.refused
            retry = {} if said.retry_after is None else {"retry-after": str(said.retry_after)}
            return Answer(said.status, error_body(said.message, said.status), retry)
        except RelayError as exc:
            log.warning("Admin call %s %s not relayed: %s", head.method, head.path, exc)
            return Answer(503, error_body(f"The engine's API server did not take the call: "
                                          f"{exc}", 503), {"retry-after": "1"})
        return Answer(202 if head.path in STARTED else 200, json.dumps(state).encode())

    async def _read_call(self, reader: asyncio.StreamReader) -> tuple[Head, State]:
        """The request's head and the relay call it asks for; _Refused for anything else."""
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise _Refused(431, "The request head is too large.") from None
        except asyncio.IncompleteReadError:
            raise _Refused(400, "The request ended before its head did.") from None
        head = parse_head(raw[:-4])
        if head.method == "HEAD":
            refused = _Refused(405, "Use GET, PUT or POST.")
            refused.answer.head_only = True
            raise refused
        route(head)
        authorize(head, self.token())
        body = await _read_body(reader, head)
        return head, relay_request(head, body)


async def _read_body(reader: asyncio.StreamReader, head: Head) -> bytes:
    if "transfer-encoding" in head.headers:
        raise _Refused(411, "Send the body with a Content-Length.")
    declared = head.headers.get("content-length", "0")
    if not declared.isdigit():
        raise _Refused(400, "Content-Length is not a number.")
    if int(declared) > MAX_BODY_BYTES:
        raise _Refused(413, f"The body is larger than {MAX_BODY_BYTES} bytes.")
    try:
        return await reader.readexactly(int(declared))
    except asyncio.IncompleteReadError:
        raise _Refused(400, "The body is shorter than its Content-Length.") from None


async def _write(writer: asyncio.StreamWriter, answer: Answer) -> None:
    reason = HTTPStatus(answer.status).phrase
    headers = {"content-type": "application/json", "content-length": str(len(answer.body)),
               "connection": "close", **answer.headers}
    head = f"HTTP/1.1 {answer.status} {reason}\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(head.encode("latin-1") + b"\r\n" + (b"" if answer.head_only else answer.body))
    await writer.drain()


@contextlib.contextmanager
def relay_socket() -> Iterator[Path]:
    """A path for the relay's socket in a new directory only this user may enter (mkdtemp
    makes it 0700, under TMPDIR), removed with what is in it afterwards."""
    with tempfile.TemporaryDirectory(prefix="autoglm-admin-") as folder:
        yield Path(folder) / RELAY_SOCKET_NAME
