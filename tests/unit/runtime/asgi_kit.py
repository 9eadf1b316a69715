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
    """vLLM's engine client as the middleware calls it to sleep and wake: records the calls
    with their arguments; a sleep puts both of vLLM's memory tags to sleep, a wake brings back
    the tags it names (all without) and says whether none is left asleep, as vLLM 0.32's
    `wake_up(tags)` does. A wake waits for `wake_gate` and takes `wake_seconds`; it fails while
    `wake_fails`, and leaves the KV cache asleep while `partial_wakes`."""

    TAGS = frozenset({"weights", "kv_cache"})  # vllm/v1/executor/abstract.py SLEEP_TAGS

    def __init__(self, enable_sleep_mode: bool = True, wake_seconds: float = 0.0) -> None:
        self.model_config = SimpleNamespace(enable_sleep_mode=enable_sleep_mode)
        self.calls: list[tuple[Any, ...]] = []
        self.sleeping_tags: set[str] = set()
        self.sleep_gate = asyncio.Event()
        self.sleep_gate.set()
        self.wake_gate = asyncio.Event()
        self.wake_gate.set()
        self.wake_seconds = wake_seconds
        self.wake_fails = 0  # wakes that fail before one succeeds
        self.partial_wakes = 0  # wakes that leave the KV cache asleep (vLLM answers False)

    @property
    def asleep(self) -> bool:
        return bool(self.sleeping_tags)

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.calls.append(("sleep", level, mode))
        await self.sleep_gate.wait()
        self.sleeping_tags = set(self.TAGS)

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(("wake_up", tags))
        await self.wake_gate.wait()
        await asyncio.sleep(self.wake_seconds)
        if self.wake_fails:
            self.wake_fails -= 1
            raise RuntimeError("CUDA error: out of memory")
        self.sleeping_tags -= self.TAGS if tags is None else set(tags)
        if self.partial_wakes:
            self.partial_wakes -= 1
            self.sleeping_tags.add("kv_cache")
        return not self.sleeping_tags

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
