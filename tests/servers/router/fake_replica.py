"""A scripted replica on loopback (uvicorn in a thread), for what sims cannot show.

It answers /health and /metrics like the runtime, records every request it gets, and answers
chat requests with whatever `behavior` is set: echo, queue_full, cut (a stream cut after its
first event), silent (3 s before answering), slow_stream (30 events 0.1 s apart), flood (a large
fast stream).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from testkit.loopback import ServedOnLoopback
from testkit.processes import free_port

Message = MutableMapping[str, Any]
FLOOD_CHUNK = b"x" * 65536


@dataclass
class Seen:
    headers: dict[str, str]
    raw_headers: list[tuple[str, str]]
    body: bytes


@dataclass
class FakeReplica(ServedOnLoopback):
    mode: str = "batching"
    behavior: str = "echo"
    flood_chunks: int = 800  # 50 MiB
    seen: list[Seen] = field(default_factory=list)
    flood_sent: int = 0
    held: int = 0  # requests it says it holds (autoglm_requests_inflight), e.g. another router's
    asleep: bool = False  # its engine sleeps (autoglm_sleeping 1), as in scale to zero
    metrics_reads: int = 0  # GET /metrics requests it answered
    port: int = field(default_factory=free_port)

    async def app(self, scope: Message, receive: Callable[[], Awaitable[Message]],
                  send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/health":
            await _answer(send, 200, b"{}")
            return
        if scope["path"] == "/metrics":
            self.metrics_reads += 1
            other = "streaming" if self.mode == "batching" else "batching"
            text = (f'autoglm_mode{{mode="{self.mode}"}} 1.0\n'
                    f'autoglm_mode{{mode="{other}"}} 0.0\nautoglm_draining 0.0\n'
                    f"autoglm_requests_inflight {self.held}.0\nautoglm_requests_queued 0.0\n"
                    f"autoglm_sleeping {float(self.asleep)}\n")
            await _answer(send, 200, text.encode(), "text/plain")
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        raw = [(k.decode(), v.decode()) for k, v in scope["headers"]]
        self.seen.append(Seen(dict(raw), raw, body))
        await getattr(self, "_" + self.behavior)(body, send)

    async def _echo(self, body: bytes, send: Callable[[Message], Awaitable[None]]) -> None:
        await _answer(send, 200, json.dumps({"echo": body.decode()}).encode())

    async def _queue_full(self, body: bytes, send: Callable[[Message], Awaitable[None]]) -> None:
        await _answer(send, 429, b'{"error": {"message": "queue full", "code": 429}}',
                      headers=[(b"retry-after", b"7")])

    async def _cut(self, body: bytes, send: Callable[[Message], Awaitable[None]]) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        await asyncio.sleep(0.1)
        raise RuntimeError("the replica died mid-stream")

    async def _silent(self, body: bytes, send: Callable[[Message], Awaitable[None]]) -> None:
        await asyncio.sleep(3)
        await self._echo(body, send)

    async def _slow_stream(self, body: bytes,
                           send: Callable[[Message], Awaitable[None]]) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for _ in range(30):
            await send({"type": "http.response.body", "body": b"data: {}\n\n",
                        "more_body": True})
            await asyncio.sleep(0.1)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _flood(self, body: bytes, send: Callable[[Message], Awaitable[None]]) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for _ in range(self.flood_chunks):
            await send({"type": "http.response.body", "body": FLOOD_CHUNK, "more_body": True})
            self.flood_sent += len(FLOOD_CHUNK)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _answer(send: Callable[[Message], Awaitable[None]], status: int, body: bytes,
                  content_type: str = "application/json",
                  headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()),
        *(headers or [])]})
    await send({"type": "http.response.body", "body": body, "more_body": False})
