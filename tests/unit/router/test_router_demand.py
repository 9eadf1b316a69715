"""The demand report: when a router tells the operator of its requests (a fake clock), what it
sends (a fake apiserver), and the proxy reporting as it holds and releases."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest
from aiohttp import web
from router_fakes import FixedDiscovery

from autoglm_api.standby import RouterDemand, annotation_key, decode
from autoglm_operator.resource import spec
from autoglm_router.demand import DemandBook, DemandReporter
from autoglm_router.kube import DEPLOYMENT_API, AnnotationPatch, ApiAccess, ApiError
from autoglm_router.proxy import ProxySettings, RouterApp
from autoglm_router.routing import RoutingConfig
from testkit.waiting import eventually_async

pytestmark = pytest.mark.timeout(20)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def sent(book: DemandBook, ok: bool = True) -> RouterDemand:
    demand = book.begin()
    book.done(ok)
    return demand


def test_nothing_is_reported_before_the_first_request_which_is_reported_at_once() -> None:
    clock = Clock()
    book = DemandBook(10.0, clock)
    assert book.due_in() is None
    book.request()
    assert book.due_in() == 0
    assert sent(book) == RouterDemand(clock.now)
    assert book.due_in() is None  # nothing new


def test_while_requests_arrive_a_report_goes_at_most_once_per_interval() -> None:
    clock = Clock()
    book = DemandBook(10.0, clock)
    book.request()
    sent(book)
    clock.now += 1.0
    book.request()
    assert book.due_in() == pytest.approx(9.0)
    clock.now += 4.0
    book.request()
    assert book.due_in() == pytest.approx(5.0)
    clock.now += 5.0
    assert book.due_in() == 0
    assert sent(book).last_request_at == clock.now - 5.0  # the latest request's time


def test_holding_starts_and_ends_are_reported_at_once_between_intervals() -> None:
    clock = Clock()
    book = DemandBook(10.0, clock)
    book.request()
    sent(book)
    clock.now += 1.0
    book.request()
    book.holding(2, clock.now)
    assert book.due_in() == 0  # the wake signal does not wait out the interval
    wake = sent(book)
    assert (wake.holding, wake.held_since) == (2, clock.now)
    clock.now += 0.5
    book.holding(3, clock.now - 1.5)
    assert book.due_in() == pytest.approx(9.5)  # more held: news, not a signal
    clock.now += 0.5
    book.waited(2.0)
    book.holding(0, None)
    assert book.due_in() == 0  # the all-clear
    clear = sent(book)
    assert (clear.holding, clear.held_since, clear.last_wait_seconds) == (0, None, 2.0)
    # The release counts as activity: the idle window starts after a slow start, not before.
    assert clear.last_request_at == clock.now


def test_a_failed_report_is_sent_again_a_little_later_and_none_goes_while_one_is_out() -> None:
    clock = Clock()
    book = DemandBook(10.0, clock, retry_seconds=1.0)
    book.request()
    book.holding(1, clock.now)
    book.begin()
    clock.now += 0.2
    book.request()
    assert book.due_in() is None  # one on its way
    book.done(ok=False)
    assert book.due_in() == pytest.approx(1.0)
    clock.now += 1.0
    assert book.due_in() == 0
    assert sent(book).holding == 1


class FakePatch:
    """Records each value; fails the first `failures` calls as a 403 would."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.values: list[RouterDemand] = []
        self.closed = False

    async def __call__(self, value: str) -> None:
        if self.failures:
            self.failures -= 1
            raise ApiError(403, "forbidden")
        demand = decode(value)
        assert demand is not None
        self.values.append(demand)

    async def close(self) -> None:
        self.closed = True


async def test_the_reporter_retries_a_failure_and_sends_the_last_state_after_the_interval(
) -> None:
    patch, results = FakePatch(failures=1), []
    reporter = DemandReporter(DemandBook(0.3, retry_seconds=0.05), patch, results.append)
    reporter.book.request()
    reporter.changed()
    await eventually_async(lambda: len(patch.values) == 1, 5, every=0.01)
    assert results == [False, True]
    first = patch.values[0].last_request_at
    reporter.book.request()  # within the interval: it goes once the interval is over
    reporter.changed()
    await eventually_async(lambda: len(patch.values) == 2, 5, every=0.01)
    assert patch.values[1].last_request_at > first
    await reporter.close()
    assert patch.closed


class SlowPatch(FakePatch):
    async def __call__(self, value: str) -> None:
        await asyncio.sleep(0.1)
        await super().__call__(value)


async def test_a_stopping_reporter_lets_the_report_on_its_way_and_the_all_clear_arrive() -> None:
    patch = SlowPatch()
    reporter = DemandReporter(DemandBook(600.0), patch)
    reporter.book.request()
    reporter.book.holding(1, 1.0)
    reporter.changed()  # the wake signal goes out
    reporter.book.holding(0, None)  # the drain answered it meanwhile
    reporter.changed()
    await reporter.close()
    assert [d.holding for d in patch.values] == [1, 0] and patch.closed


# --- the proxy reporting -----------------------------------------------------------------------


async def test_the_proxy_reports_the_wake_signal_and_the_all_clear_at_once() -> None:
    patch = FakePatch()
    app = RouterApp(FixedDiscovery(), RoutingConfig(),
                    ProxySettings(hold_queue_size=4, demand_interval=600.0), demand=patch)
    leaves = asyncio.Event()
    bodies = [{"type": "http.request", "body": b'{"messages": []}', "more_body": False}]

    async def receive() -> dict[str, Any]:
        if bodies:
            return bodies.pop()
        await leaves.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        pass

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "query_string": b"", "headers": [], "client": ("127.0.0.1", 5000)}
    task = asyncio.ensure_future(app(scope, receive, send))
    # With a 600 s interval only the immediate reports can arrive within the test.
    await eventually_async(lambda: any(d.holding == 1 for d in patch.values), 5, every=0.01)
    wake = next(d for d in patch.values if d.holding == 1)
    assert wake.held_since is not None and wake.held_since >= wake.last_request_at - 1e-3
    leaves.set()
    await asyncio.wait_for(task, 2)
    await eventually_async(lambda: patch.values[-1].holding == 0, 5, every=0.01)
    assert app.metrics.registry.get_sample_value(
        "autoglm_router_demand_patches_total", {"result": "ok"}) == len(patch.values)
    await app.stop()
    assert patch.closed


# --- the patch on the wire ---------------------------------------------------------------------


def test_the_routers_idea_of_the_resource_is_the_operators() -> None:
    assert DEPLOYMENT_API == (spec.GROUP, spec.VERSION, spec.PLURAL)


@pytest.fixture
async def apiserver() -> AsyncIterator[tuple[list[web.Request], list[bytes], str]]:
    seen: list[web.Request] = []
    bodies: list[bytes] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(request)
        bodies.append(await request.read())
        if request.match_info["name"] == "missing":
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        return web.json_response({"kind": "AutoGLMDeployment"})

    app = web.Application()
    app.router.add_patch(
        "/apis/autoglm.io/v1alpha1/namespaces/{namespace}/autoglmdeployments/{name}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield seen, bodies, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_the_patch_merges_this_pods_annotation_only(
        apiserver: tuple[list[web.Request], list[bytes], str]) -> None:
    seen, bodies, server = apiserver
    key = annotation_key("autoglm-router-7d9c-abcde")
    patch = AnnotationPatch(ApiAccess(server, token="t0k"), "serving", "autoglm", key)
    value = RouterDemand(1_700_000_000.5, holding=2, held_since=1_700_000_000.0).encode()
    await patch(value)
    request = seen[0]
    assert request.path.endswith("/namespaces/serving/autoglmdeployments/autoglm")
    assert request.headers["Content-Type"] == "application/merge-patch+json"
    assert request.headers["Authorization"] == "Bearer t0k"
    assert json.loads(bodies[0]) == {"metadata": {"annotations": {key: value}}}
    missing = AnnotationPatch(ApiAccess(server), "serving", "missing", key)
    with pytest.raises(ApiError, match="404"):
        await missing(value)
    await patch.close()
    await missing.close()
