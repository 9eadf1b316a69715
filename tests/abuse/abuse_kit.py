"""Tools for the abuse suite: raw HTTP/1.1 on a socket, a replica that records what reached it,
the router's peak memory.

Clients like httpx normalise a request-target and refuse malformed framing, so the attacks are
written as bytes.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from testkit.gateway import Gateway
from testkit.loopback import ServedOnLoopback
from testkit.processes import RouterProcess, SimProcess, free_port

Message = MutableMapping[str, Any]
API_KEY = "abuse-suite-key"
ADMIN_TOKEN = "abuse-admin-token"
FLOOD_CHUNK = b"x" * 65536


StartRouter = Callable[..., RouterProcess]
StartSim = Callable[..., SimProcess]
StartGateway = Callable[..., Gateway]

CHAT = "/v1/chat/completions"
CHAT_BODY = json.dumps({"model": "autoglm-phone-9b",
                        "messages": [{"role": "user", "content": "hi"}]}).encode()
MIB = 1024 * 1024
# The chart's router memory limit (charts/autoglm/values.yaml router.resources.limits.memory).
ROUTER_MEMORY_LIMIT = 320 * MIB
ALLOWED = {("POST", CHAT), ("POST", "/v1/completions"), ("POST", "/v1/responses"),
           ("GET", "/v1/models")}


def empty_objects_body(size: int) -> bytes:
    """`{"x":[{},{},...]}` of about `size` bytes: millions of objects for a JSON parser."""
    count = (size - 10) // 3
    return b'{"x":[' + b"{}," * count + b"{}]}"


REFUSED_TARGETS = [
    # (method, raw request-target, status at the router)
    ("GET", "/v1/../metrics", 400),
    ("PUT", "/v1/../autoglm/v1/mode", 400),
    ("POST", "/v1/../tokenize", 400),
    ("POST", "/v1/..%2Fscale_elastic_ep", 400),
    ("POST", "/v1/%2e%2e/scale_elastic_ep", 400),
    ("GET", "/v1/models%3Fx=1%23frag", 400),
    ("POST", "/v1/x/../chat/completions", 400),
    ("POST", "/v1/./chat/completions", 400),
    ("POST", "/v1/chat%2Fcompletions", 400),
    ("POST", "/v1\\..\\tokenize", 400),
    ("POST", "/tokenize", 404),
    ("POST", "/v1/chat/completions/render", 404),
    ("POST", "/v1/messages/count_tokens", 404),
    ("POST", "/v1/embeddings", 404),
    ("GET", "/v1/files", 404),
    ("GET", "/autoglm/v1/mode", 404),
    ("PUT", "/autoglm/v1/mode", 404),
    ("POST", "/autoglm/v1/drain", 404),
    ("POST", "/scale_elastic_ep", 404),
    ("GET", "/v1/responses/resp_123", 404),
    ("POST", "/v1/responses/resp_123/cancel", 404),
    ("DELETE", CHAT, 405),
    ("GET", CHAT, 405),
]


SMUGGLING = [
    ("Transfer-Encoding and Content-Length",
     b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /v1/../metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("two Content-Lengths",
     b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
     b"Content-Length: 40\r\n\r\n{}"),
    ("a bare CR in a header",
     b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\rX-A: 1\r\nContent-Length: 2\r\n\r\n{}"),
]


@dataclass
class Reply:
    status: int  # 0: the server closed the connection without an answer
    headers: dict[str, str]
    body: bytes


def exchange(port: int, request: bytes, timeout: float = 5.0, source: str | None = None) -> Reply:
    """Send raw bytes, read one response (or the close), within `timeout` seconds; from the
    loopback address `source` (127.0.0.1 by default: one client) when given."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                  source_address=(source, 0) if source else None) as sock:
        sock.sendall(request)
        return read_reply(sock, timeout)


def read_reply(sock: socket.socket, timeout: float) -> Reply:
    deadline = time.monotonic() + timeout
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = _recv(sock, deadline)
        if not chunk:
            return Reply(0, {}, data)
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "-1"))
    while length >= 0 and len(body) < length:
        chunk = _recv(sock, deadline)
        if not chunk:
            break
        body += chunk
    return Reply(status, headers, body)


def _recv(sock: socket.socket, deadline: float) -> bytes:
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        return sock.recv(65536)
    except (TimeoutError, ConnectionResetError):
        return b""


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """True if the server closed the connection (answered or not) within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True
    return False


def request(method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None,
            host: str = "127.0.0.1") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident set (VmHWM): catches a spike between two samples."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


def accepted_connections(port: int) -> int:
    """Open connections to local `port` that its server has accepted: ESTABLISHED sockets on
    that port in /proc/net/tcp{,6} with an inode. One still in the listener's accept queue has
    none (no process holds it yet), so this counts what the server itself holds."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as rows:
                next(rows)  # the header
                for row in rows:
                    fields = row.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    count += (int(local.rsplit(":", 1)[1], 16) == port and state == "01"
                              and inode != "0")
        except FileNotFoundError:  # no IPv6
            continue
    return count


@dataclass
class Seen:
    method: str
    raw_path: str
    query: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name]


@dataclass
class RecordingReplica(ServedOnLoopback):
    """A replica that answers like the runtime's /health and /metrics and records every other
    request exactly as it arrived (raw path, headers, body). Chat bodies holding "flood" get a
    50 MiB stream; "slow" ones an answer after 2 s."""

    seen: list[Seen] = field(default_factory=list)
    port: int = field(default_factory=free_port)

    def forwarded(self) -> list[Seen]:
        """Requests a router forwarded (its own polls carry no X-Forwarded-For)."""
        return [s for s in self.seen if s.header("x-forwarded-for")]

    async def app(self, scope: Message, receive: Callable[[], Awaitable[Message]],
                  send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/health":
            await _answer(send, 200, b"{}")
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        raw_path = scope.get("raw_path") or scope["path"].encode()
        self.seen.append(Seen(
            scope["method"], raw_path.decode("latin-1"),
            scope.get("query_string", b"").decode("latin-1"),
            [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]], body))
        if scope["path"] == "/metrics":
            # The router's own poll reads this too: mode and load like a runtime's.
            await _answer(send, 200, b'autoglm_mode{mode="batching"} 1.0\n', "text/plain")
        elif b"flood" in body:
            await self._flood(send)
        elif b"slow" in body:
            await asyncio.sleep(2)
            await _answer(send, 200, b'{"ok": true}')
        else:
            await _answer(send, 200, json.dumps({"object": "list", "data": []}).encode())

    async def _flood(self, send: Callable[[Message], Awaitable[None]]) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for _ in range(800):
            await send({"type": "http.response.body", "body": FLOOD_CHUNK, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _answer(send: Callable[[Message], Awaitable[None]], status: int, body: bytes,
                  content_type: str = "application/json") -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})
