"""The proxy sends a request upstream before it yields the event loop to other work.

Under load the loop holds every other stream's pending work; a request that waits for a turn
of the loop before going upstream waits behind all of it (the router's `request` phase)."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import aiohttp
import pytest
from router_fakes import FixedDiscovery

from autoglm_api.profiles import Mode
from autoglm_router.discovery import Endpoint
from autoglm_router.proxy import RouterApp
from autoglm_router.routing import RoutingConfig

REPLICA = "http://127.0.0.1:9"
STREAMING_REPLICA = Endpoint(REPLICA, Mode.STREAMING, ready=True)


def one_replica() -> FixedDiscovery:
    return FixedDiscovery(STREAMING_REPLICA)


class RecordingClient:
    """Stands in for the upstream session: records when the request goes out, then fails it
    as a replica that closed the connection would."""

    def __init__(self, order: list[str]) -> None:
        self.order = order

    async def request(self, *args: Any, **kwargs: Any) -> None:
        self.order.append("upstream request")
        raise aiohttp.ServerDisconnectedError()


class HangingClient:
    """An upstream that never answers; `asked` is set once a request has gone to it."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()

    async def request(self, *args: Any, **kwargs: Any) -> None:
        self.asked.set()
        await asyncio.Event().wait()


SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "query_string": b"",
         "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 5000)}


def client_messages(leaves: asyncio.Event | None = None) -> Any:
    """receive() for a client that sends one body, then leaves when `leaves` is set."""
    body = [{"type": "http.request", "body": b'{"messages": [], "stream": true}',
             "more_body": False}]

    async def receive() -> dict[str, Any]:
        if body:
            return body.pop()
        await (leaves or asyncio.Event()).wait()
        return {"type": "http.disconnect"}

    return receive


async def test_the_upstream_request_goes_out_before_other_pending_work() -> None:
    order: list[str] = []
    app = RouterApp(one_replica(), RoutingConfig())
    app.client = RecordingClient(order)  # type: ignore[assignment]
    sent: list[dict[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    receive, scope = client_messages(), SCOPE
    asyncio.get_running_loop().call_soon(order.append, "other work")
    await app(scope, receive, send)
    assert order[0] == "upstream request"
    # Nothing else could take it: the client gets a 502 after the one retry found no replica.
    assert sent[0]["status"] == 502


async def test_a_client_that_leaves_ends_its_request_and_is_counted() -> None:
    app = RouterApp(one_replica(), RoutingConfig())
    app.client = upstream = HangingClient()  # type: ignore[assignment]
    leaves = asyncio.Event()
    task = asyncio.ensure_future(app(SCOPE, client_messages(leaves), _ignore))
    await asyncio.wait_for(upstream.asked.wait(), 5)
    assert app.book.count[REPLICA] == 1
    leaves.set()
    await asyncio.wait_for(task, 2)  # ends without an error: the client is gone
    assert app.book.count[REPLICA] == 0
    # Gone before any answer started: no replica served it, so its mode is `none`.
    gone = app.metrics.requests.labels("streamed_chat", "none", "client_gone")
    assert gone._value.get() == 1


async def test_a_cancel_from_outside_still_cancels_the_request() -> None:
    app = RouterApp(one_replica(), RoutingConfig())
    app.client = upstream = HangingClient()  # type: ignore[assignment]
    task = asyncio.ensure_future(app(SCOPE, client_messages(), _ignore))
    await asyncio.wait_for(upstream.asked.wait(), 5)
    assert app.book.count[REPLICA] == 1  # the request is out: the cancel must undo that
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert app.book.count[REPLICA] == 0


async def _ignore(message: MutableMapping[str, Any]) -> None:
    pass


class VanishingReplica(FixedDiscovery):
    """A streaming replica that leaves discovery once a request is on its way to it."""

    def __init__(self) -> None:
        super().__init__(STREAMING_REPLICA)
        self.gone = False

    def endpoints(self) -> list[Endpoint]:
        return [] if self.gone else super().endpoints()


class LeavingClient:
    """The replica leaves discovery while the request is out, then the request times out."""

    def __init__(self, discovery: VanishingReplica) -> None:
        self.discovery = discovery

    async def request(self, *args: Any, **kwargs: Any) -> None:
        self.discovery.gone = True
        raise aiohttp.SocketTimeoutError()


async def test_a_request_is_counted_under_the_mode_it_was_routed_to() -> None:
    discovery = VanishingReplica()
    app = RouterApp(discovery, RoutingConfig())
    app.client = LeavingClient(discovery)  # type: ignore[assignment]
    await asyncio.wait_for(app(SCOPE, client_messages(), _ignore), 2)
    counted = app.metrics.requests.labels("streamed_chat", "streaming", "upstream_error")
    assert counted._value.get() == 1


async def test_a_refused_request_whose_client_leaves_mid_answer_is_counted_once() -> None:
    # The operator reads this counter as demand: one request, one count, whatever its end.
    app = RouterApp(FixedDiscovery(), RoutingConfig())
    leaves = asyncio.Event()

    async def slow_client(message: MutableMapping[str, Any]) -> None:
        leaves.set()  # the client hangs up while the refusal is on its way
        await asyncio.Event().wait()

    await asyncio.wait_for(app(SCOPE, client_messages(leaves), slow_client), 2)
    counts = {
        (s.labels["mode"], s.labels["outcome"]): s.value
        for family in app.metrics.requests.collect()
        for s in family.samples
        if s.name.endswith("_total")
    }
    assert counts == {("none", "refused"): 1.0}
