"""The demand report a router gives the operator (GET /autoglm/v1/demand on its ops port): what
the book counts (a fake clock), and the proxy keeping it as it holds, relays and answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from typing import Any

import pytest
from router_fakes import FixedDiscovery

from autoglm_api.standby import DEMAND_PATH, WAKE_AFTER_SECONDS, RouterReport, decode_report
from autoglm_router.demand import DemandBook
from autoglm_router.hold import HoldQueue
from autoglm_router.proxy import ProxySettings, RouterApp
from autoglm_router.routing import RoutingConfig
from testkit.waiting import eventually_async

pytestmark = pytest.mark.timeout(20)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_fresh_router_reports_nothing() -> None:
    assert DemandBook(Clock()).report([]) == RouterReport()


def test_requests_in_flight_count_until_their_end_and_date_the_idle_window() -> None:
    clock = Clock()
    book = DemandBook(clock)
    book.started()
    book.started()
    clock.now += 30
    assert book.report([]) == RouterReport(inflight=2, idle_for=30.0)
    book.finished(held_seconds=None)
    clock.now += 5
    book.finished(held_seconds=12.5)
    clock.now += 2
    assert book.report([]) == RouterReport(inflight=0, idle_for=2.0, last_wait=12.5)


def test_a_held_request_is_demand_only_once_it_waited_a_second() -> None:
    clock = Clock()
    book = DemandBook(clock)
    arrived = [clock.now, clock.now + 0.5]
    clock.now += 0.9
    assert book.report(arrived).holding == 0  # a client that leaves now wakes nothing
    clock.now += WAKE_AFTER_SECONDS
    report = book.report(arrived)
    assert (report.holding, report.held_for) == (2, pytest.approx(1.9))


# --- the proxy keeping it ----------------------------------------------------------------------


def scope_of(method: str, path: str, client: str = "127.0.0.1") -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
            "query_string": b"", "headers": [], "client": (client, 5000)}


async def ops_call(app: RouterApp, method: str) -> list[MutableMapping[str, Any]]:
    """What the ops port sends for `method` on the demand path."""
    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    await app.ops(scope_of(method, DEMAND_PATH), receive, send)
    return sent


async def report_of(app: RouterApp) -> RouterReport:
    sent = await ops_call(app, "GET")
    assert sent[0]["status"] == 200
    report = decode_report(sent[1]["body"], 10_000)
    assert report is not None
    return report


class Client:
    """One request into the app: its body, and a disconnect when the test says so."""

    def __init__(self, app: RouterApp, method: str, path: str, body: bytes = b"") -> None:
        self.messages: list[MutableMapping[str, Any]] = []
        self.leaves = asyncio.Event()
        self._body = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if self._body:
                return self._body.pop()
            await self.leaves.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            self.messages.append(message)

        self.task = asyncio.ensure_future(app(scope_of(method, path), receive, send))

    @property
    def status(self) -> int | None:
        return next((m["status"] for m in self.messages
                     if m["type"] == "http.response.start"), None)


def holding_app(clock: Clock, **settings: Any) -> RouterApp:
    app = RouterApp(FixedDiscovery(), RoutingConfig(),
                    ProxySettings(hold_queue_size=4, hold_heartbeat=0, **settings))
    app.demand = DemandBook(clock)
    app.hold = HoldQueue(4, 180.0, clock=clock)
    return app


async def test_a_client_that_leaves_within_a_second_is_no_demand() -> None:
    clock = Clock()
    app = holding_app(clock)
    client = Client(app, "POST", "/v1/chat/completions", b'{"messages": []}')
    await eventually_async(lambda: len(app.hold) == 1, 5, every=0.01)
    clock.now += 0.3
    assert (await report_of(app)).holding == 0
    client.leaves.set()
    await asyncio.wait_for(client.task, 2)
    clock.now += 5
    assert await report_of(app) == RouterReport()  # nothing held, nothing relayed, ever
    await app.stop()


async def test_a_request_still_held_after_a_second_is_demand() -> None:
    clock = Clock()
    app = holding_app(clock)
    client = Client(app, "POST", "/v1/chat/completions", b'{"messages": []}')
    await eventually_async(lambda: len(app.hold) == 1, 5, every=0.01)
    clock.now += 2
    report = await report_of(app)
    assert (report.holding, report.held_for, report.idle_for) == (1, 2.0, None)
    client.leaves.set()
    await asyncio.wait_for(client.task, 2)
    assert (await report_of(app)).holding == 0
    await app.stop()


async def test_models_at_zero_are_listed_by_the_router_and_wake_nothing() -> None:
    clock = Clock()
    app = holding_app(clock, served_model_names=("autoglm-phone-9b",))
    client = Client(app, "GET", "/v1/models")
    await asyncio.wait_for(client.task, 2)
    assert client.status == 200
    listed = json.loads(client.messages[1]["body"])
    assert [m["id"] for m in listed["data"]] == ["autoglm-phone-9b"]
    assert len(app.hold) == 0
    assert await report_of(app) == RouterReport()
    await app.stop()


async def test_models_at_zero_without_names_is_a_503_not_a_hold() -> None:
    app = holding_app(Clock())
    client = Client(app, "GET", "/v1/models")
    await asyncio.wait_for(client.task, 2)
    assert client.status == 503 and len(app.hold) == 0
    await app.stop()


async def test_the_report_refuses_other_methods() -> None:
    app = holding_app(Clock())
    sent = await ops_call(app, "POST")
    assert sent[0]["status"] == 405
    await app.stop()
