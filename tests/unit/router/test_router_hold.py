"""The hold queue: a request that finds no replica waits for one, within its bounds.

The queue itself on a fake clock; then the proxy holding requests in front of a replica that is
not up yet, with scripted upstreams (no network)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, MutableMapping
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from router_fakes import FixedDiscovery

from autoglm_api.profiles import Mode
from autoglm_router.answers import HELD_SECONDS, HOLD_RETRY_AFTER_SECONDS
from autoglm_router.discovery import Endpoint
from autoglm_router.features import KeyKind, RequestFeatures, TrafficClass
from autoglm_router.hold import HoldQueue, Outcome, Overflow, Ticket, releasable
from autoglm_router.proxy import DRAIN_ANSWER_SECONDS, ProxySettings, RouterApp
from autoglm_router.routing import ReplicaState, RoutingConfig
from testkit.waiting import eventually_async

pytestmark = pytest.mark.timeout(20)
S = Mode.STREAMING
REPLICA = "http://127.0.0.1:9"
CLIENT = "127.0.0.1"


def features(streamed: bool, cost: float = 1.0) -> RequestFeatures:
    traffic = TrafficClass.STREAMED_CHAT if streamed else TrafficClass.OTHER
    return RequestFeatures(traffic, None, KeyKind.NONE, cost)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def nowhere(f: RequestFeatures) -> None:
    return None


# --- the queue --------------------------------------------------------------------------------


def test_streamed_chats_are_released_first_then_the_rest_in_arrival_order() -> None:
    queue = HoldQueue(10, 180.0, per_client=10, clock=Clock())
    other1, chat1, other2, chat2 = (queue.join(features(s), CLIENT)
                                    for s in (False, True, False, True))
    released = queue.release([ReplicaState("r", S)], RoutingConfig(), nowhere)
    assert released == [chat1, chat2, other1, other2]
    assert all(t is not None and t.outcome is Outcome.RELEASED for t in released)
    assert len(queue) == 0


def test_a_wake_releases_what_the_replicas_admit_and_the_rest_waits_for_room() -> None:
    config = RoutingConfig(chat_caps={S: 2, Mode.BATCHING: 2})
    queue = HoldQueue(10, 180.0, per_client=10, clock=Clock())
    held = [queue.join(features(True), CLIENT) for _ in range(3)]
    one = ReplicaState("r", S)
    # Each released chat is charged to the replica before the next is placed: two fit.
    assert queue.release([one], config, nowhere) == held[:2]
    assert len(queue) == 1
    assert queue.release([replace(one, inflight=2, load=2.0)], config, nowhere) == []
    assert queue.release([replace(one, inflight=1, load=1.0)], config, nowhere) == held[2:]


def test_a_request_that_does_not_fit_lets_one_behind_it_that_does_go() -> None:
    # A non-streamed request may queue past the caps (other_overflow); a chat may not.
    config = RoutingConfig(chat_caps={S: 1, Mode.BATCHING: 1}, caps={S: 1, Mode.BATCHING: 1})
    queue = HoldQueue(10, 180.0, per_client=10, clock=Clock())
    chat, batch = queue.join(features(True), CLIENT), queue.join(features(False), CLIENT)
    full = ReplicaState("r", S, inflight=1, load=1.0)
    assert queue.release([full], config, nowhere) == [batch]
    assert queue.in_order() == [chat]


def test_nothing_is_released_while_no_replica_is_up() -> None:
    queue = HoldQueue(10, 180.0, per_client=10, clock=Clock())
    queue.join(features(True), CLIENT)
    down = [ReplicaState("a", S, ready=False), ReplicaState("b", S, draining=True)]
    assert queue.release(down, RoutingConfig(), nowhere) == []
    assert len(queue) == 1


def test_sleeping_replicas_take_held_requests_all_on_the_one_that_wakes() -> None:
    queue = HoldQueue(10, 180.0, per_client=10, clock=Clock())
    held = [queue.join(features(True), CLIENT) for _ in range(3)]
    pool = [ReplicaState("b", S, asleep=True), ReplicaState("a", S, asleep=True)]
    assert releasable([t for t in held if t], pool, RoutingConfig(), nowhere) == held


def test_the_queue_holds_no_more_than_its_size() -> None:
    queue = HoldQueue(2, 180.0, per_client=2, clock=Clock())
    assert queue.join(features(True), CLIENT) and queue.join(features(False), CLIENT)
    assert queue.join(features(True), CLIENT) is Overflow.FULL
    assert HoldQueue(0, 180.0).join(features(True), CLIENT) is Overflow.FULL  # holding off


def test_one_client_holds_at_most_its_share_and_leaves_room_for_others() -> None:
    queue = HoldQueue(8, 180.0, clock=Clock())
    assert queue.per_client == 2  # a quarter of the queue by default
    flood = [queue.join(features(True), "10.0.0.1") for _ in range(5)]
    assert [isinstance(t, Overflow) for t in flood] == [False, False, True, True, True]
    assert flood[2] is Overflow.CLIENT
    other = queue.join(features(True), "10.0.0.2")
    assert isinstance(other, Ticket) and len(queue) == 3
    first = flood[0]
    assert isinstance(first, Ticket)
    queue.leave(first)  # its share frees with it
    assert isinstance(queue.join(features(True), "10.0.0.1"), Ticket)


def test_a_request_held_again_after_a_429_keeps_its_place_and_waits_before_its_next_try() -> None:
    clock = Clock()
    queue = HoldQueue(4, 180.0, clock=clock)
    ticket = queue.join(features(True), CLIENT)
    assert isinstance(ticket, Ticket)
    pool = [ReplicaState(REPLICA, S, True, False, 0, 0.0)]
    assert queue.release(pool, RoutingConfig(), nowhere) == [ticket]
    queue.rejoin(ticket, wait=1.0)
    assert queue.release(pool, RoutingConfig(), nowhere) == []
    clock.now += 1.0
    assert queue.release(pool, RoutingConfig(), nowhere) == [ticket]
    assert queue.deadline(ticket) == 1000.0 + 180.0  # the first arrival's deadline


def test_a_request_times_out_at_its_deadline_and_a_drain_brings_the_deadline_forward() -> None:
    clock = Clock()
    queue = HoldQueue(10, 180.0, per_client=10, clock=clock)
    first = queue.join(features(True), CLIENT)
    clock.now += 100.0
    second = queue.join(features(False), CLIENT)
    assert queue.arrivals() == [1000.0, 1100.0]
    clock.now += 79.9
    assert queue.expire() == []
    clock.now += 0.1
    assert queue.expire() == [first]
    assert first is not None and first.outcome is Outcome.TIMEOUT
    queue.cut_off(clock.now + 10.0)
    clock.now += 9.9
    assert queue.expire() == []
    clock.now += 0.1
    assert queue.expire() == [second] and len(queue) == 0


def test_a_request_that_leaves_is_out_of_the_queue() -> None:
    queue = HoldQueue(1, 180.0, per_client=1, clock=Clock())
    ticket = queue.join(features(True), CLIENT)
    assert ticket is not None
    queue.leave(ticket)
    queue.leave(ticket)  # twice is once
    assert len(queue) == 0 and queue.join(features(True), CLIENT) is not None


# --- the proxy holding ------------------------------------------------------------------------


class Appearing(FixedDiscovery):
    """One streaming replica, not up until `up` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.up = False

    def endpoints(self) -> list[Endpoint]:
        return [Endpoint(REPLICA, S, ready=self.up)]


class Content:
    async def iter_any(self) -> AsyncIterator[bytes]:
        yield b'data: {"ok": true}\n\n'
        yield b"data: [DONE]\n\n"


class Answered:
    """An upstream's 200 stream."""

    status = 200
    raw_headers = [(b"content-type", b"text/event-stream")]
    content_length = None

    def __init__(self) -> None:
        self.content = Content()

    def close(self) -> None:
        pass


class Upstream:
    """Records the body of each request it gets, in order, and answers a stream."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def request(self, *args: Any, data: bytes | None = None, **kwargs: Any) -> Answered:
        self.bodies.append(bytes(data or b""))
        return Answered()


def scope() -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/v1/chat/completions",
            "query_string": b"", "headers": [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 5000)}


class Client:
    """One client: sends `body`, records what comes back, leaves when `leaves` is set."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = [{"type": "http.request", "body": json.dumps(body).encode(),
                      "more_body": False}]
        self.leaves = asyncio.Event()
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if self.body:
            return self.body.pop()
        await self.leaves.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        self.sent.append(dict(message))

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.sent[0]["headers"]}


def holding_app(size: int = 8, seconds: float = 60.0, **settings: Any
                ) -> tuple[RouterApp, Appearing, Upstream]:  # fmt: skip
    discovery, upstream = Appearing(), Upstream()
    app = RouterApp(discovery, RoutingConfig(),
                    ProxySettings(hold_queue_size=size, hold_seconds=seconds,
                                  hold_per_client=size, **settings))
    app.client = upstream  # type: ignore[assignment]
    return app, discovery, upstream


def call(app: RouterApp, client: Client) -> asyncio.Future[None]:
    return asyncio.ensure_future(app(scope(), client.receive, client.send))


def counted(app: RouterApp, outcome: str) -> float:
    return sum(s.value for family in app.metrics.requests.collect() for s in family.samples
               if s.name.endswith("_total") and s.labels["outcome"] == outcome)


def sample(app: RouterApp, name: str, **labels: str) -> float:
    """A sample the router exports; a name or label it does not export is a failure, not 0."""
    value = app.metrics.registry.get_sample_value(name, labels)
    assert value is not None, f"no sample {name}{labels}"
    return value


async def test_a_held_request_is_served_once_a_replica_comes_up() -> None:
    app, discovery, upstream = holding_app()
    client = Client({"messages": [], "stream": True})
    task = call(app, client)
    await eventually_async(lambda: len(app.hold) == 1, 5, every=0.01, what="held")
    assert sample(app, "autoglm_router_held_requests") == 1
    assert upstream.bodies == []
    discovery.up = True
    await asyncio.wait_for(task, 5)
    assert client.status == 200 and float(client.headers[HELD_SECONDS]) > 0
    assert len(upstream.bodies) == 1
    assert sample(app, "autoglm_router_held_requests") == 0
    assert sample(app, "autoglm_router_hold_seconds_count") == 1
    assert counted(app, "ok") == 1


async def test_released_requests_go_upstream_streamed_chats_first_then_by_arrival() -> None:
    app, discovery, upstream = holding_app()
    bodies = [{"messages": [], "stream": stream, "n": i + 1}
              for i, stream in enumerate((False, True, False, True))]
    tasks = []
    for i, body in enumerate(bodies):
        tasks.append(call(app, Client(body)))
        await eventually_async(lambda i=i: len(app.hold) == i + 1, 5, every=0.01)
    discovery.up = True
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert [json.loads(b)["n"] for b in upstream.bodies] == [2, 4, 1, 3]


async def test_a_full_queue_answers_503_with_retry_after_at_once() -> None:
    app, _, upstream = holding_app(size=1)
    first, second = Client({"messages": [], "stream": True}), Client({"messages": []})
    held = call(app, first)
    await eventually_async(lambda: len(app.hold) == 1, 5, every=0.01)
    await asyncio.wait_for(call(app, second), 2)
    assert second.status == 503
    assert second.headers["retry-after"] == str(HOLD_RETRY_AFTER_SECONDS)
    error = json.loads(second.sent[1]["body"])["error"]
    assert error["code"] == 503 and error["type"] == "service_unavailable"
    assert sample(app, "autoglm_router_hold_overflows_total", reason="full") == 1
    assert counted(app, "refused") == 1 and not held.done() and upstream.bodies == []
    first.leaves.set()
    await asyncio.wait_for(held, 2)


async def test_a_request_held_past_hold_seconds_gets_503_with_retry_after() -> None:
    app, _, upstream = holding_app(seconds=0.3)
    client = Client({"messages": [], "stream": True})
    started = time.monotonic()
    await asyncio.wait_for(call(app, client), 5)
    assert time.monotonic() - started >= 0.3
    assert client.status == 503 and client.headers["retry-after"]
    assert float(client.headers[HELD_SECONDS]) >= 0.3
    assert "within" in json.loads(client.sent[1]["body"])["error"]["message"]
    assert sample(app, "autoglm_router_hold_overflows_total", reason="timeout") == 1
    assert sample(app, "autoglm_router_hold_seconds_count") == 1
    assert len(app.hold) == 0 and upstream.bodies == []


async def test_a_client_that_leaves_while_held_leaves_the_queue_and_is_counted_gone() -> None:
    app, discovery, upstream = holding_app()
    client = Client({"messages": [], "stream": True})
    task = call(app, client)
    await eventually_async(lambda: len(app.hold) == 1, 5, every=0.01)
    client.leaves.set()
    await asyncio.wait_for(task, 2)
    assert len(app.hold) == 0 and sample(app, "autoglm_router_held_requests") == 0
    assert counted(app, "client_gone") == 1 and client.sent == []
    assert app.inflight == 0
    discovery.up = True  # nothing is left to release: the gone request never goes upstream
    second = Client({"messages": []})
    await asyncio.wait_for(call(app, second), 2)
    assert len(upstream.bodies) == 1 and HELD_SECONDS not in second.headers


async def test_without_holding_no_replica_is_503_at_once() -> None:
    app, _, _ = holding_app(size=0)
    client = Client({"messages": [], "stream": True})
    await asyncio.wait_for(call(app, client), 2)
    assert client.status == 503 and HELD_SECONDS not in client.headers
    assert json.loads(client.sent[1]["body"])["error"]["message"].startswith("No ready replica")


async def test_a_drain_answers_held_requests_before_it_ends() -> None:
    app, _, _ = holding_app(seconds=60.0)
    client = Client({"messages": [], "stream": True})
    task = call(app, client)
    await eventually_async(lambda: len(app.hold) == 1, 5, every=0.01)
    app.drain(until=time.monotonic() + DRAIN_ANSWER_SECONDS + 0.2)
    await asyncio.wait_for(task, 5)
    assert client.status == 503 and client.headers["retry-after"]


async def health(app: RouterApp) -> tuple[int, dict[str, Any]]:
    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request"}

    await app.ops({"type": "http", "path": "/health"}, receive, send)
    return int(sent[0]["status"]), json.loads(sent[1]["body"])


async def test_health_says_holding_with_no_replica_so_the_router_stays_in_its_service() -> None:
    app, discovery, _ = holding_app()
    assert await health(app) == (200, {"status": "holding", "replicas": {
        "streaming": 0, "batching": 0, "unknown": 0}, "held": 0})
    discovery.up = True
    assert (await health(app))[1]["status"] == "ok"
    discovery.up = False
    app.draining = True
    assert (await health(app))[0] == 503
    off, _, _ = holding_app(size=0)
    assert await health(off) == (503, {"status": "no_replica", "replicas": {
        "streaming": 0, "batching": 0, "unknown": 0}})


class ReadyTooEarly(Appearing):
    """A replica whose pod says ready before its engine listens (kwok, or a probe too loose):
    out after a connect error until it answers, as the pod watch's discovery does."""

    def __init__(self) -> None:
        super().__init__()
        self.up = True
        self.unreachable = 0

    def report_unreachable(self, name: str) -> None:
        self.unreachable += 1
        self.up = False


class RefusesFirst(Upstream):
    """Refuses the first connection, as a port nothing listens on yet."""

    async def request(self, *args: Any, data: bytes | None = None, **kwargs: Any) -> Answered:
        if not self.bodies:
            self.bodies.append(b"refused")
            key = SimpleNamespace(host="127.0.0.1", port=9, ssl=None)
            raise aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "refused"))  # type: ignore[arg-type]
        return await super().request(*args, data=data, **kwargs)


async def test_a_request_sent_to_a_replica_not_listening_yet_is_held_again_not_failed() -> None:
    discovery, upstream = ReadyTooEarly(), RefusesFirst()
    app = RouterApp(discovery, RoutingConfig(), ProxySettings(hold_queue_size=8, hold_seconds=60))
    app.client = upstream  # type: ignore[assignment]
    client = Client({"messages": [], "stream": True})
    task = call(app, client)
    await eventually_async(lambda: len(app.hold) == 1, 5, every=0.01, what="held again")
    assert discovery.unreachable == 1
    discovery.up = True  # it answers now
    await asyncio.wait_for(task, 5)
    assert client.status == 200
    assert float(client.headers[HELD_SECONDS]) > 0
    assert upstream.bodies[0] == b"refused" and len(upstream.bodies) == 2
    assert counted(app, "ok") == 1
    assert sample(app, "autoglm_router_hold_seconds_count") == 1  # one request, one wait


def scope_from(client: str) -> dict[str, Any]:
    return {**scope(), "client": (client, 5000)}


async def test_a_flood_from_one_client_leaves_room_for_another() -> None:
    discovery, upstream = Appearing(), Upstream()
    app = RouterApp(discovery, RoutingConfig(), ProxySettings(hold_queue_size=8))
    app.client = upstream  # type: ignore[assignment]
    flood = [Client({"messages": [], "stream": True}) for _ in range(6)]
    tasks = [asyncio.ensure_future(app(scope_from("10.0.0.1"), c.receive, c.send))
             for c in flood]
    await eventually_async(lambda: sum(t.done() for t in tasks) == 4, 5, every=0.01,
                           what="all but its share refused")
    assert [c.status for c, t in zip(flood, tasks, strict=True) if t.done()] == [503] * 4
    assert sample(app, "autoglm_router_hold_overflows_total", reason="client_full") == 4
    other = Client({"messages": [], "stream": True})
    held = asyncio.ensure_future(app(scope_from("10.0.0.2"), other.receive, other.send))
    await eventually_async(lambda: len(app.hold) == 3, 5, every=0.01, what="the other held")
    discovery.up = True
    await asyncio.wait_for(asyncio.gather(held, *tasks), 5)
    assert other.status == 200 and len(upstream.bodies) == 3


class Full:
    """A replica's 429, read whole."""

    status = 429
    raw_headers = [(b"content-type", b"application/json"), (b"retry-after", b"1")]
    content_length = None

    class content:  # aiohttp's attribute name
        @staticmethod
        async def iter_any() -> AsyncIterator[bytes]:
            yield b'{"error": {"message": "full", "code": 429}}'

    def close(self) -> None:
        pass


class FullFirst(Upstream):
    """Answers 429 to the first request (a replica full when the held request reaches it)."""

    async def request(self, *args: Any, data: bytes | None = None, **kwargs: Any) -> Any:
        if not self.bodies:
            self.bodies.append(b"429")
            return Full()
        return await super().request(*args, data=data, **kwargs)


async def test_a_held_request_that_meets_a_full_replica_at_release_is_held_again() -> None:
    discovery, upstream = Appearing(), FullFirst()
    app = RouterApp(discovery, RoutingConfig(),
                    ProxySettings(hold_queue_size=8, hold_seconds=60, hold_heartbeat=0))
    app.client = upstream  # type: ignore[assignment]
    client = Client({"messages": [], "stream": True})
    task = call(app, client)
    await eventually_async(lambda: len(app.hold) == 1, 5, every=0.01, what="held")
    discovery.up = True
    await asyncio.wait_for(task, 5)
    assert client.status == 200  # not the 429 it met on its way
    assert upstream.bodies[0] == b"429" and len(upstream.bodies) == 2
    assert sample(app, "autoglm_router_hold_seconds_count") == 1


async def test_a_429_for_a_request_never_held_is_the_clients_answer() -> None:
    discovery, upstream = Appearing(), FullFirst()
    discovery.up = True
    app = RouterApp(discovery, RoutingConfig(), ProxySettings(hold_queue_size=8))
    app.client = upstream  # type: ignore[assignment]
    client = Client({"messages": [], "stream": True})
    await asyncio.wait_for(call(app, client), 5)
    assert client.status == 429 and len(app.hold) == 0


def body_of(client: Client) -> bytes:
    return b"".join(m.get("body", b"") for m in client.sent[1:])


async def test_a_held_stream_hears_heartbeats_then_its_replicas_events() -> None:
    discovery, upstream = ReadyTooEarly(), RefusesFirst()
    app = RouterApp(discovery, RoutingConfig(), ProxySettings(
        hold_queue_size=8, hold_seconds=60, hold_per_client=8, hold_heartbeat=0.05))
    app.client = upstream  # type: ignore[assignment]
    discovery.up = False
    client = Client({"messages": [], "stream": True})
    task = call(app, client)
    await eventually_async(lambda: len(app.hold) == 1, 5, every=0.01, what="held")
    discovery.up = True  # released: its first try finds no engine listening, held again
    await eventually_async(lambda: body_of(client).count(b": held") >= 2, 5, every=0.01,
                           what="two heartbeats")
    assert client.status == 200
    assert client.headers["content-type"] == "text/event-stream"
    assert float(client.headers[HELD_SECONDS]) >= 0.05  # the wait until the head went out
    assert [k for k, _ in client.sent[0]["headers"]].count(HELD_SECONDS.encode()) == 1
    discovery.up = True
    await asyncio.wait_for(task, 5)
    events = body_of(client)
    assert events.endswith(b'data: {"ok": true}\n\ndata: [DONE]\n\n')
    assert [m["type"] for m in client.sent].count("http.response.start") == 1


async def test_a_held_stream_that_waits_out_its_hold_ends_with_an_error_event() -> None:
    app, _, _ = holding_app(seconds=0.3, hold_heartbeat=0.05)
    client = Client({"messages": [], "stream": True})
    await asyncio.wait_for(call(app, client), 5)
    assert client.status == 200  # committed by the first heartbeat
    events = body_of(client).split(b"\n\n")
    error = json.loads(events[-3].removeprefix(b"data: "))["error"]
    assert error["code"] == 503 and "within" in error["message"]
    assert events[-2] == b"data: [DONE]"


async def test_a_held_request_that_is_not_streamed_hears_nothing_until_its_answer() -> None:
    app, discovery, _ = holding_app(hold_heartbeat=0.05)
    client = Client({"messages": []})
    task = call(app, client)
    await eventually_async(lambda: len(app.hold) == 1, 5, every=0.01)
    await asyncio.sleep(0.2)  # four heartbeat intervals: none may come
    assert client.sent == []
    discovery.up = True
    await asyncio.wait_for(task, 5)
    assert client.status == 200
