"""Test doubles for the adaptive pass: a runtime admin API on loopback, and an in-memory IO."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from autoglm_api.profiles import MODE_PATH, Mode
from autoglm_operator.adaptive.signals import Availability, Reading
from autoglm_operator.io.runtime_client import RuntimeMode as RuntimeModeState
from autoglm_operator.io.runtime_client import (
    RuntimeRejected,
    RuntimeUnreachable,
    SetModeResult,
)

TOKEN = "s3cret-admin-token"


@dataclass
class FakeRuntime:
    """The runtime's admin endpoint (GET and PUT of its mode, behind its token), with knobs for
    failures."""

    mode: Mode = Mode.STREAMING
    token: str = TOKEN
    switches: int = 0
    fail_next: list[int] = field(default_factory=list)  # status codes for the next requests
    ignore_puts: bool = False  # answers 200 but keeps its mode (a broken runtime)
    hangs: bool = False  # answers only once `serving` ends: later than any client waits
    garbage: bool = False
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    released: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.text()
        self.requests.append((request.method, body or None))
        if self.hangs:
            await self.released.wait()
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response({"error": "unauthorized"}, status=401)
        if self.fail_next:
            return web.json_response({"error": "injected"}, status=self.fail_next.pop(0))
        if self.garbage:
            return web.Response(text="<html>oops</html>", content_type="text/html")
        if request.method == "PUT":
            try:
                wanted = Mode(json.loads(body)["mode"])
            except (ValueError, KeyError):
                return web.json_response({"error": "unknown mode"}, status=400)
            if not self.ignore_puts and wanted is not self.mode:
                self.mode = wanted
                self.switches += 1
        return web.json_response(
            {"mode": self.mode.value, "since": "2026-01-01T00:00:00Z", "switches": self.switches}
        )


@asynccontextmanager
async def serving(runtime: FakeRuntime) -> AsyncIterator[int]:
    """Serve the fake on 127.0.0.1; yields its port."""
    app = web.Application()
    app.router.add_route("*", MODE_PATH, runtime.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = int(runner.addresses[0][1])
    try:
        yield port
    finally:
        runtime.released.set()  # cleanup waits for the handlers still running
        await runner.cleanup()


@dataclass
class FakePod:
    name: str
    ip: str
    label: Mode | None
    runtime: Mode
    ready: bool = True
    runtime_down: bool = False  # admin API unreachable
    refuses: bool = False  # admin API answers 400 to PUT
    sticky: bool = False  # PUT accepted, mode unchanged (verification fails)
    label_patch_fails: bool = False


@dataclass
class FakeIO:
    """adaptive_handlers.ReadIO over in-memory pods; records every call in order."""

    pods: dict[str, FakePod]
    reading: Reading | None = None
    calls: list[tuple[str, ...]] = field(default_factory=list)
    announced: list[dict[str, Any]] = field(default_factory=list)
    label_fail_after: dict[str, int] = field(default_factory=dict)  # pod -> patches that work

    def _by_ip(self, ip: str) -> FakePod:
        return next(p for p in self.pods.values() if p.ip == ip)

    async def read_metrics(self, pods: Sequence[str]) -> Reading:
        self.calls.append(("read_metrics", *pods))
        if self.reading is None:
            return Reading(None, Availability.UNREACHABLE, "connection refused")
        return self.reading

    async def set_label(self, pod: str, mode: Mode) -> None:
        self.calls.append(("set_label", pod, mode.value))
        fake = self.pods[pod]
        budget = self.label_fail_after.get(pod)
        if fake.label_patch_fails or budget == 0:
            raise RuntimeError(f"pods {pod} patch: 500 Internal Server Error")
        if budget is not None:
            self.label_fail_after[pod] = budget - 1
        fake.label = mode

    async def runtime_state(self, ip: str) -> RuntimeModeState:
        pod = self._by_ip(ip)
        self.calls.append(("runtime_mode", pod.name))
        if pod.runtime_down:
            raise RuntimeUnreachable(f"GET http://{ip}:8000: connection refused")
        return RuntimeModeState(pod.runtime, raw={"mode": pod.runtime.value, "inflight": 0})

    async def set_runtime_mode(self, ip: str, mode: Mode) -> SetModeResult:
        pod = self._by_ip(ip)
        self.calls.append(("set_runtime_mode", pod.name, mode.value))
        if pod.runtime_down:
            raise RuntimeUnreachable(f"PUT http://{ip}:8000: connection refused")
        if pod.refuses:
            raise RuntimeRejected(f"PUT http://{ip}:8000: HTTP 400")
        if pod.sticky:
            raise RuntimeUnreachable(f"http://{ip}:8000 reports {pod.runtime.value}")
        pod.runtime = mode
        return SetModeResult(RuntimeModeState(mode), attempts=1, seconds=0.001)

    async def announce(self, status_patch: dict[str, Any]) -> None:
        self.calls.append(("announce",))
        self.announced.append(status_patch)
