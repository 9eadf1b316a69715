"""Helpers for the ASGI-level middleware tests: a fake engine app, a fake engine client, and
the app around the middleware that holds it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, MutableMapping
from types import SimpleNamespace
from typing import Any


class FakeEngine:
    """Echoes the request body it received; streams `events` SSE events for stream=true."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[list[tuple[bytes, bytes]]] = []  # each request's, as the app saw them
        self.paths: list[str] = []
        self.release = asyncio.Event()
        self.release.set()
        self.events = 6
        self.sends: list[int] = []  # body bytes per send, to see coalescing
        self.answer: tuple[int, dict[str, Any]] | None = None  # (status, JSON) instead of an echo

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        self.paths.append(scope["path"])
        self.headers.append(list(scope.get("headers", ())))
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        message = await receive()
        body = json.loads(message["body"] or b"{}")
        self.bodies.append(body)
        await self.release.wait()
        if self.answer is not None:
            status, payload = self.answer
            raw = json.dumps(payload).encode()
            headers = [(b"content-type", b"application/json"),
                       (b"content-length", str(len(raw)).encode())]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": raw})
            return
        if body.get("stream"):
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            for i in range(self.events):
                chunk = b'data: {"i": %d}\n\n' % i
                self.sends.append(len(chunk))
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n",
                        "more_body": False})
            return
        payload = json.dumps({"echo": body}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})


MakeClient = Callable[..., Any]


async def _lifespan(receive: Any, send: Any) -> None:
    """An app's side of the ASGI lifespan: started, then stopped when asked."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class FakeEngineClient:
    """vLLM's engine client as the middleware calls it to sleep and wake: records the calls;
    a wake waits for `wake_gate` and takes `wake_seconds`, and fails while `wake_fails`."""

    def __init__(self, enable_sleep_mode: bool = True, wake_seconds: float = 0.0) -> None:
        self.model_config = SimpleNamespace(enable_sleep_mode=enable_sleep_mode)
        self.calls: list[tuple[Any, ...]] = []
        self.asleep = False
        self.sleep_gate = asyncio.Event()
        self.sleep_gate.set()
        self.wake_gate = asyncio.Event()
        self.wake_gate.set()
        self.wake_seconds = wake_seconds
        self.wake_fails = 0  # wakes that fail before one succeeds

    async def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))
        await self.sleep_gate.wait()
        self.asleep = True

    async def wake_up(self) -> bool:
        self.calls.append(("wake_up",))
        await self.wake_gate.wait()
        await asyncio.sleep(self.wake_seconds)
        if self.wake_fails:
            self.wake_fails -= 1
            raise RuntimeError("CUDA error: out of memory")
        self.asleep = False
        return True

    async def collective_rpc(self, method: str) -> None:
        self.calls.append(("collective_rpc", method))


class Host:
    """What Starlette does around the middleware: the app in every scope, its state holding
    the engine client (vLLM's `app.state.engine_client`)."""

    def __init__(self, middleware: Any, engine_client: Any) -> None:
        self.middleware = middleware
        self.state = SimpleNamespace(engine_client=engine_client)

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        scope["app"] = self
        await self.middleware(scope, receive, send)
