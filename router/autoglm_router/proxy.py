"""The data path: an ASGI app that routes each request and streams the replica's bytes back.

Nothing is read before it is allowed: the method and raw path are checked against the API's
allow-list, then the API key, then the router's request cap, and only then the body, within a
size limit, a router-wide budget of buffered bytes and a deadline. The body is scanned (bounded,
no JSON tree) for routing, and forwarded unchanged. Response
bytes are relayed as they arrive: the next upstream read waits until the client's transport
took the last chunk, so a slow client slows its upstream instead of growing a buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from yarl import URL

from autoglm_api.api_key import key_digests, presents_a_key
from autoglm_api.asgi_body import BodyTooLarge, ClientDisconnected, read_body
from autoglm_api.keepalive import UPSTREAM_POOL_IDLE_SECONDS
from autoglm_api.standby import DEMAND_PATH
from autoglm_router import answers
from autoglm_router.answers import HELD_SECONDS, REQUEST_ID, SSE_DONE, Answer, error_body
from autoglm_router.connections import ABORT_SCOPE_KEY
from autoglm_router.demand import DemandBook
from autoglm_router.discovery import Discovery, StaticDiscovery
from autoglm_router.features import (
    DEFAULT_IMAGE_MAX_PIXELS,
    NEUTRAL,
    RequestFeatures,
    request_features,
)
from autoglm_router.hold import (
    CHECK_SECONDS,
    RETRY_AFTER_FULL_SECONDS,
    HoldQueue,
    Outcome,
    Overflow,
    Ticket,
)
from autoglm_router.metrics import RouterMetrics, router_metrics
from autoglm_router.others import OtherRouters
from autoglm_router.paths import check_path
from autoglm_router.routing import (
    NO_REPLICA,
    Failure,
    Refusal,
    ReplicaState,
    Route,
    RoutingConfig,
    charged_cost,
    decide,
    retry_route,
)
from autoglm_router.scan import scan_request
from autoglm_router.sessions import (
    RECENT_LOAD_SECONDS,
    SESSION_MEMORY,
    SessionMemory,
    session_of,
    settled,
)

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# RFC 9110 7.6.1; `host` and `content-length` are set again for the upstream request.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "transfer-encoding", "upgrade",
})
# Set by the router alone: a client's value would be passed off as the router's word.
FORWARDED = frozenset({"x-forwarded-for", "x-forwarded-host", "x-forwarded-proto",
                       "x-forwarded-port", "x-real-ip", "forwarded"})
HELD_BODY_LIMIT = 64 * 1024  # a 429/503 body is read whole to decide on a retry
# A drain answers its held requests this long before it ends, so each gets its 503 before
# the connections left are closed.
DRAIN_ANSWER_SECONDS = 1.0


@dataclass(frozen=True)
class ProxySettings:
    prefix_chars: int = 1024
    image_max_pixels: int = DEFAULT_IMAGE_MAX_PIXELS  # the engine's, to price screenshots
    max_body_bytes: int = 16 * 1024 * 1024
    connect_timeout: float = 5.0
    idle_timeout: float = 600.0  # between two upstream reads; a batch request may queue long
    stream_timeout: float = 3600.0  # a whole response
    max_connections: int = 1024  # to the replicas
    session_memory: int = SESSION_MEMORY
    max_inflight: int = 512  # client requests at once; past it 503 with Retry-After
    # Bodies held in memory at once, all requests together (they are kept for retries): the
    # memory limit's share for bodies (docs/operations/security.md has the arithmetic).
    max_buffered_body_bytes: int = 128 * 1024 * 1024
    body_timeout: float = 30.0  # to receive a whole request body
    send_timeout: float = 30.0  # a client that takes no response bytes this long is cut
    load_poll_interval: float = 1.0  # how often the replicas' own load is read
    recent_load_seconds: float = RECENT_LOAD_SECONDS
    hold_queue_size: int = 0  # requests held at once when no replica takes them; 0: none
    hold_seconds: float = 180.0  # the longest one is held
    hold_per_client: int | None = None  # held at once from one client; None: a quarter
    # A held streamed request gets its headers and an SSE comment this often (0: never).
    hold_heartbeat: float = 15.0
    # The names GET /v1/models lists while no replica is up (the replicas' --served-model-name).
    served_model_names: tuple[str, ...] = ()


class LoadBook:
    """The router's own in-flight requests and their cost, per replica, the cost averaged over
    the last `average_seconds` (rule 2), and when it sent the recent requests (rule 1d)."""

    def __init__(self, metrics: RouterMetrics, clock: Callable[[], float] = time.monotonic,
                 average_seconds: float = ProxySettings.recent_load_seconds,
                 label: Callable[[str], str] = str) -> None:
        self.count: dict[str, int] = {}
        self.cost: dict[str, float] = {}
        self._sent: dict[str, deque[float]] = {}
        self._average: dict[str, tuple[float, float]] = {}  # replica: (average, as of when)
        self._average_seconds = average_seconds
        self._clock = clock
        self._gauge = metrics.inflight
        self._label = label

    def recent_cost(self, replica: str) -> float:
        """The in-flight cost, exponentially averaged over about `average_seconds`."""
        self._settle(replica)
        return self._average[replica][0]

    def _settle(self, replica: str) -> None:
        # The cost has stood at its current value since the last change: move the average
        # toward it by the time that passed.
        now, cost = self._clock(), self.cost.get(replica, 0.0)
        average, since = self._average.get(replica, (0.0, now))
        self._average[replica] = (settled(average, cost, now - since, self._average_seconds), now)

    def fresh(self, replica: str, seconds: float) -> int:
        """Requests sent to `replica` within the last `seconds`."""
        sent = self._sent.get(replica)
        if not sent:
            return 0
        horizon = self._clock() - seconds
        while sent and sent[0] <= horizon:
            sent.popleft()
        return len(sent)

    @contextlib.contextmanager
    def open(self, replica: str, cost: float, sequences: int = 1) -> Iterator[None]:
        """One request of `sequences` sequences (its `n`): each takes a slot upstream."""
        self._sent.setdefault(replica, deque()).append(self._clock())
        self._settle(replica)
        self.count[replica] = self.count.get(replica, 0) + sequences
        self.cost[replica] = self.cost.get(replica, 0.0) + cost
        gauge = self._gauge.labels(self._label(replica))
        gauge.set(self.count[replica])
        try:
            yield
        finally:
            self._settle(replica)
            self.count[replica] -= sequences
            self.cost[replica] = max(0.0, self.cost[replica] - cost)
            gauge.set(self.count[replica])


class _ClientStalled(Exception):
    """The client took no response bytes within the send timeout."""


@dataclass(frozen=True)
class _Held:
    """A replica's refusal, read whole, kept to hand back if no retry takes the request."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


@dataclass
class _Call:
    """One client request as the proxy carries it."""

    method: str
    target: str  # path and query
    headers: list[tuple[str, str]]
    body: bytearray
    features: RequestFeatures
    request_id: str
    arrival: float
    route: Route | None = None  # the replica relaying the response, once it started
    # Each chosen replica's mode when it was chosen: one that leaves discovery mid-stream is
    # still counted under the mode that served the request.
    modes: dict[str, str] = field(default_factory=dict)
    status: int = 0  # the status relayed
    held_seconds: float | None = None  # how long it waited for a replica, if it did
    ticket: Ticket | None = None  # its place in the hold queue, once it was held
    client: str = ""  # its source address: its share of the hold queue is bounded
    abort: Callable[[], None] | None = None  # drops the client's connection (connections.py)
    delivered: bool = False  # the client has every byte that matters (see _relay)
    counted: bool = False  # in autoglm_router_requests_total, which counts each request once


class HeldStream:
    """The response of a streamed request that may be held. Until its first heartbeat it
    passes through. A heartbeat sends the response's head (200, an event stream) and an SSE
    comment, so a proxy's idle timeout does not cut a request held through a cold start; from
    then on the answer that follows goes out as events: a 200 stream as it comes, any other
    answer as an error event (what vLLM sends when a stream fails; the OpenAI clients raise
    it)."""

    def __init__(self, send: Send, request_id: str) -> None:
        self._send = send
        self._request_id = request_id
        self.committed = False
        self._status = 200
        self._error = bytearray()

    async def heartbeat(self, held_seconds: float) -> None:
        if not self.committed:
            self.committed = True
            headers = [(k.encode(), v.encode()) for k, v in answers.HELD_STREAM_HEADERS]
            headers.append((REQUEST_ID.encode(), self._request_id.encode()))
            await self._send({"type": "http.response.start", "status": 200,
                              "headers": headers})
        await self._send({"type": "http.response.body", "body": answers.heartbeat(held_seconds),
                          "more_body": True})

    async def __call__(self, message: Message) -> None:
        if not self.committed:
            await self._send(message)
        elif message["type"] == "http.response.start":
            self._status = message["status"]
        elif self._status == 200:
            await self._send(message)
        else:
            if len(self._error) < HELD_BODY_LIMIT:
                self._error += message.get("body", b"")[:HELD_BODY_LIMIT - len(self._error)]
            if not message.get("more_body"):
                await self._send({"type": "http.response.body", "more_body": False,
                                  "body": answers.sse_error(self._status, bytes(self._error))})


class RouterApp:
    def __init__(self, discovery: Discovery, config: RoutingConfig,
                 settings: ProxySettings | None = None,
                 api_keys: list[str] | None = None) -> None:
        self.discovery = discovery
        self.config = config
        self.settings = settings or ProxySettings()
        self.api_key_digests = key_digests(api_keys or [])
        self.metrics = router_metrics()
        self.book = LoadBook(self.metrics, average_seconds=self.settings.recent_load_seconds,
                             label=self._label)
        self.inflight = 0
        self.buffered_body_bytes = 0
        self.draining = False  # set on SIGTERM (drain.py): the API port has stopped listening
        self.others = OtherRouters(
            lambda: [e.name for e in self.discovery.endpoints()],
            lambda name: self.book.count.get(name, 0), self.settings.load_poll_interval)
        # A static list's poll scrapes each replica's /metrics already (for the mode): the load
        # comes from the same scrape. A pod watch scrapes nothing, so the load has its own poll.
        self._poll_load = True
        if isinstance(discovery, StaticDiscovery):
            discovery.metrics_readers.append(self.others.read)
            self._poll_load = False
        self.sessions = SessionMemory(self.settings.session_memory)
        self.client: aiohttp.ClientSession | None = None
        self.hold = HoldQueue(self.settings.hold_queue_size, self.settings.hold_seconds,
                              self.settings.hold_per_client)
        self._releasing: asyncio.Task[None] | None = None
        self.demand = DemandBook()  # what the operator reads (GET DEMAND_PATH, ops port)
        self.started_at = int(time.time())

    # --- ASGI -------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "websocket":
            # Closing before accepting is uvicorn's 403: the API has no WebSocket route.
            await send({"type": "websocket.close", "code": 1008})
        elif scope["type"] == "http":
            await self._serve(scope, receive, send)

    async def ops(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ops port: /health, /metrics and the demand report, apart from the API clients
        reach; each is read-only."""
        if scope["type"] != "http":
            return
        if scope["path"] == "/health":
            await self._health(send)
        elif scope["path"] == DEMAND_PATH:
            if scope["method"] not in ("GET", "HEAD"):
                # Closed, as the API port's refusals: the body is never read.
                await _respond(send, 405, error_body("Use GET.", 405), {"allow": "GET"},
                               close=True)
                return
            report = self.demand.report(self.hold.arrivals())
            await _respond(send, 200, report.encode())
        elif scope["path"] == "/metrics":
            self._count_replicas()
            await _respond(send, 200, generate_latest(self.metrics.registry),
                           content_type=CONTENT_TYPE_LATEST)
        else:
            await _respond(send, 404, error_body(f"No route {scope['path']}.", 404))

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw_path = bytes(scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        refusal = self.admission(scope["method"], raw_path, _header(scope, b"authorization"))
        if refusal is not None:
            await _answer(send, refusal)
            return
        self.inflight += 1
        try:
            await self._proxy(scope, receive, send, raw_path)
        finally:
            self.inflight -= 1

    # --- what both fronts (HTTP here, the endpoint picker) apply to every request ---------------

    def admission(self, method: str, raw_path: str, authorization: str | None) -> Answer | None:
        """The refusal of a request by its method, raw path and key, or None: in this order,
        before a byte of its body is read."""
        verdict = check_path(method, raw_path)
        if not verdict.served:
            return answers.path_refused(verdict, method)
        if self.api_key_digests and not presents_a_key(authorization, self.api_key_digests):
            return answers.UNAUTHORIZED
        if self.inflight >= self.settings.max_inflight:
            return answers.AT_REQUEST_LIMIT
        return None

    def body_size(self, content_length: str | None) -> int:
        """The body bytes to hold for a request: its declared length, else the most allowed."""
        if content_length is not None and content_length.isdigit():
            return int(content_length)
        return self.settings.max_body_bytes

    def body_refusal(self, size: int, held: int | None = None) -> Answer | None:
        """The refusal of a body of `size` bytes before it is read: too large, or past what the
        router may hold of all bodies together (`held` bytes for it, by default its size)."""
        if size > self.settings.max_body_bytes:
            return answers.body_too_large(self.settings.max_body_bytes)
        if self.buffered_body_bytes + (size if held is None else held) \
                > self.settings.max_buffered_body_bytes:
            return answers.BODY_BUDGET_FULL
        return None

    def features_of(self, method: str, raw_path: str, body: bytes | bytearray,
                    headers: dict[str, str]) -> RequestFeatures:
        if method != "POST" or not body:
            return NEUTRAL
        # A bounded scan, not a parse: the replica answers a malformed body's 400.
        return request_features(raw_path, scan_request(body), headers,
                                self.settings.prefix_chars, self.settings.image_max_pixels)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def start(self) -> None:
        s = self.settings
        self.client = aiohttp.ClientSession(
            # Idle connections are dropped before the replica's keep-alive can close one just as
            # a request goes out on it (keepalive.py).
            connector=aiohttp.TCPConnector(limit=s.max_connections,
                                           keepalive_timeout=UPSTREAM_POOL_IDLE_SECONDS),
            # connect covers waiting for a pooled connection too; sock_read is the idle limit.
            timeout=aiohttp.ClientTimeout(total=None, connect=s.connect_timeout,
                                          sock_connect=s.connect_timeout,
                                          sock_read=s.idle_timeout),
            auto_decompress=False,  # bytes pass through as the replica encoded them
            # Only what the client sent goes upstream: no added User-Agent, Accept-Encoding...
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
        )
        await self.discovery.start()
        if self._poll_load:
            await self.others.start()

    async def stop(self) -> None:
        if self._releasing is not None:
            self._releasing.cancel()
        await self.others.stop()
        await self.discovery.stop()
        if self.client is not None:
            await self.client.close()

    def drain(self, until: float) -> None:
        """SIGTERM: /health fails from now on, and held requests wait no later than `until`
        (time.monotonic), less the time to answer them."""
        self.draining = True
        self.hold.cut_off(until - DRAIN_ANSWER_SECONDS)

    def choose(self, features: RequestFeatures) -> Route | Refusal:
        """The routing decision for a request, where its session's last turn went counted."""
        return decide(features, self.pool(), self.config, placed=self.sessions.last(features))

    def pool(self) -> list[ReplicaState]:
        """Each replica's state; its load is this router's requests plus the other routers'."""
        own_open = sum(self.book.count.values())
        # Other routers' requests are counted, not costed: weigh them as this router's own.
        unit_cost = sum(self.book.cost.values()) / own_open if own_open else 1.0
        states = []
        for endpoint in self.discovery.endpoints():
            others = self.others.of(endpoint.name)
            states.append(ReplicaState(
                endpoint.name, endpoint.mode, endpoint.ready, endpoint.draining,
                self.book.count.get(endpoint.name, 0) + round(others),
                self.book.cost.get(endpoint.name, 0.0) + others * unit_cost,
                self.book.fresh(endpoint.name, self.config.fresh_seconds),
                self.book.recent_cost(endpoint.name) + others * unit_cost,
                self.others.asleep(endpoint.name),
            ))
        return states

    def _count_replicas(self) -> dict[str, int]:
        """Replicas taking requests, by mode; also sets the gauge."""
        by_mode: dict[str, int] = {"streaming": 0, "batching": 0, "unknown": 0}
        for replica in self.pool():
            if replica.ready and not replica.draining:
                by_mode[replica.mode.value if replica.mode else "unknown"] += 1
        for mode, count in by_mode.items():
            self.metrics.replicas.labels(mode).set(count)
        return by_mode

    def ready(self) -> bool:
        """Some replica takes requests."""
        return sum(self._count_replicas().values()) > 0

    async def _health(self, send: Send) -> None:
        by_mode = self._count_replicas()
        taking = sum(by_mode.values()) > 0
        # Holding, a router with no replica still serves: it holds requests until one is up,
        # so it stays in its Service at zero replicas.
        holding = not taking and self.hold.size > 0
        status = ("draining" if self.draining else "ok" if taking
                  else "holding" if holding else "no_replica")
        health: dict[str, Any] = {"status": status, "replicas": by_mode}
        if self.hold.size:
            health["held"] = len(self.hold)
        serving = (taking or holding) and not self.draining
        await _respond(send, 200 if serving else 503, json.dumps(health).encode())

    # --- proxying ---------------------------------------------------------------------------

    async def _proxy(self, scope: Scope, receive: Receive, send: Send, raw_path: str) -> None:
        arrival = time.perf_counter()
        s = self.settings
        size = self.body_size(_header(scope, b"content-length"))
        refusal = self.body_refusal(size)
        if refusal is not None:
            await _answer(send, refusal)
            return
        self.buffered_body_bytes += size
        try:
            try:
                async with asyncio.timeout(s.body_timeout):
                    # Past its declared length, too: only the declared size was budgeted.
                    body = await read_body(receive, min(s.max_body_bytes, size))
            except BodyTooLarge:
                await _answer(send, answers.body_too_large(s.max_body_bytes))
                return
            except TimeoutError:
                await _answer(send, answers.body_too_slow(s.body_timeout))
                return
            except ClientDisconnected:
                return  # nobody to answer; nothing forwarded
            await self._forward_call(self._call_of(scope, raw_path, body, arrival), receive,
                                     send)
        finally:
            self.buffered_body_bytes -= size

    async def _forward_call(self, call: _Call, receive: Receive, send: Send) -> None:
        # The request is forwarded in this task, not a new one: a new task would wait a whole
        # turn of the event loop (every other stream's pending work) before its upstream
        # request goes out. A watcher cancels this task when the client leaves.
        this = asyncio.current_task()
        assert this is not None
        watcher = asyncio.ensure_future(_cancel_when_gone(receive, this))
        try:
            await self._forward(call, send)
        except _ClientStalled:
            # Left unfinished; a close would wait for the client to take what is buffered.
            if call.abort is not None:
                call.abort()
            return
        except asyncio.CancelledError:
            # The client left (or we are cancelled): the upstream connection closed with it.
            delivered = outcome_of(call.status) if call.delivered else "client_gone"
            self._count(call, call.route, delivered)
            if not watcher.done() or watcher.cancelled():
                raise  # cancelled from outside: let it go on
            this.uncancel()
        finally:
            watcher.cancel()

    def _call_of(self, scope: Scope, raw_path: str, body: bytearray, arrival: float) -> _Call:
        headers = [(k.decode("latin-1").lower(), v.decode("latin-1"))
                   for k, v in scope["headers"]]
        header_map = dict(headers)
        request_id = uuid.uuid4().hex
        features = self.features_of(scope["method"], raw_path, body, header_map)
        query = scope.get("query_string", b"")
        target = raw_path + ("?" + query.decode("latin-1") if query else "")
        forwarded = _upstream_headers(headers, request_id, scope)
        client = scope.get("client")
        return _Call(scope["method"], target, forwarded, body, features, request_id, arrival,
                     client=client[0] if client else "", abort=scope.get(ABORT_SCOPE_KEY))

    async def _forward(self, call: _Call, send: Send) -> None:
        inference = call.method == "POST"  # the generating routes: demand for GPUs
        try:
            if self.hold.size:
                send = _with_header(send, HELD_SECONDS, lambda: call.held_seconds)
                if call.features.streamed and self.settings.hold_heartbeat:
                    send = HeldStream(send, call.request_id)
            route = await self._first_route(call, send, inference)
            if route is not None:
                await self._relay_from(call, route, send, inference)
        finally:
            if call.ticket is not None and call.held_seconds is not None:
                # Once per request, however often a replica not serving yet sent it back.
                self.metrics.hold_seconds.observe(call.held_seconds)

    async def _first_route(self, call: _Call, send: Send, inference: bool) -> Route | None:
        """The replica to try first, holding the request while none can take it; None when
        it was answered here instead."""
        route: Route | Refusal | Answer = self.choose(call.features)
        if isinstance(route, Refusal) and route.reason == NO_REPLICA:
            if not inference and self.settings.served_model_names:
                # GET /v1/models at zero: answered from what the router knows, waking nothing.
                self._count(call, None, "ok")
                await _answer(send, answers.models_at_zero(self.settings.served_model_names,
                                                           self.started_at))
                return None
            if inference and self.hold.size:
                route = await self._held(call, send)
        if isinstance(route, Answer):
            self._count(call, None, "refused")
            await _answer(send, route)
            return None
        if isinstance(route, Refusal):
            self._count(call, None, "refused")
            await _answer(send, answers.refused(route, call.request_id))
            return None
        return route

    async def _relay_from(self, call: _Call, route: Route, send: Send, inference: bool) -> None:
        """Try `route`, then the retries the decision allows; a request no replica took
        before its first byte (a pod not listening yet, one leaving, one full at its release)
        is held again within its first hold's deadline."""
        tried: list[str] = []
        while True:
            tried.append(route.replica)
            call.modes[route.replica] = self.mode_label(route.replica)
            self.metrics.decisions.labels(route.reason.value).inc()
            outcome = await self._attempted(call, route, send, inference)
            if not isinstance(outcome, tuple):
                return
            failure, held = outcome
            next_route = retry_route(failure, call.features, self.pool(), self.config, tried)
            full = failure is Failure.QUEUE_FULL
            # A 429 is the shed policy's answer to a request that was never held; one that
            # waited out a cold start goes back to its place instead.
            if next_route is None and self.hold.size and (not full or call.ticket is not None):
                rehold = await self._held(call, send, RETRY_AFTER_FULL_SECONDS if full else 0.0)
                if isinstance(rehold, Answer):
                    self._count(call, None, "refused")
                    await _answer(send, rehold)
                    return
                tried, route = [], rehold
                continue
            if next_route is None:
                await self._give_up(call, route, held, send)
                return
            self.metrics.retries.labels(failure.value).inc()
            log.info("Retried %s on %s after %s from %s", call.request_id, next_route.replica,
                     failure.value, route.replica)
            route = next_route

    async def _attempted(
        self, call: _Call, route: Route, send: Send, inference: bool
    ) -> tuple[Failure, _Held | None] | None:
        """`_attempt`, with an inference request in flight (the demand report) while it is on
        a replica: one held again between two attempts counts as held only."""
        if not inference:
            return await self._attempt(call, route, send)
        self.demand.started()
        try:
            return await self._attempt(call, route, send)
        finally:
            self.demand.finished(call.held_seconds)

    async def _held(self, call: _Call, send: Send | None, wait: float = 0.0) -> Route | Answer:
        """Hold a request that found no replica until the pool takes it (not before `wait`
        seconds); or the answer past the queue's bounds. A client that leaves cancels the
        wait, and leaves the queue. With no `send` (the endpoint picker) nothing is sent to
        the client while it waits."""
        ticket = call.ticket
        if ticket is not None:
            self.hold.rejoin(ticket, wait)  # its place and deadline from its first wait
        else:
            joined = self.hold.join(call.features, call.client)
            if isinstance(joined, Overflow):
                call.held_seconds = 0.0
                self.metrics.hold_overflows.labels(joined.value).inc()
                return (answers.hold_full(call.request_id) if joined is Overflow.FULL
                        else answers.hold_client_full(call.request_id))
            ticket = call.ticket = joined
        self._held_changed()
        try:
            while True:
                outcome = await (ticket.wait() if send is None
                                 else self._wait(call, ticket, send))
                call.held_seconds = self.hold.waited(ticket)
                if outcome is Outcome.TIMEOUT:
                    self.metrics.hold_overflows.labels("timeout").inc()
                    return answers.held_too_long(call.held_seconds, call.request_id)
                route = self.choose(call.features)
                if isinstance(route, Route):
                    return route
                # Released, it found the pool taken in the meantime: back to its place.
                self.hold.rejoin(ticket)
                self._held_changed()
        finally:
            self.hold.leave(ticket)
            self._held_changed()

    async def _wait(self, call: _Call, ticket: Ticket, send: Send) -> Outcome:
        """The ticket's outcome; a held stream hears a heartbeat meanwhile (HeldStream)."""
        if not isinstance(send, HeldStream):
            return await ticket.wait()
        while True:
            try:
                async with asyncio.timeout(self.settings.hold_heartbeat):
                    return await ticket.wait()
            except TimeoutError:
                pass
            # The head goes out with the first heartbeat: its header says the wait so far.
            call.held_seconds = self.hold.waited(ticket)
            try:
                async with asyncio.timeout(self.settings.send_timeout):
                    await send.heartbeat(call.held_seconds)
            except TimeoutError:
                raise _ClientStalled from None

    def _held_changed(self) -> None:
        """The hold queue changed: its gauge, the release loop."""
        self.metrics.held.set(len(self.hold))
        if self.hold and (self._releasing is None or self._releasing.done()):
            self._releasing = asyncio.ensure_future(self._release_held())

    async def _release_held(self) -> None:
        """While anything is held: answer what waited its time out, release what the pool
        takes (a replica discovery shows is used within CHECK_SECONDS)."""
        while self.hold:
            await asyncio.sleep(CHECK_SECONDS)
            try:
                changed = self.hold.expire() + self.hold.release(
                    self.pool(), self.config, self.sessions.last)
            except Exception:  # a held request must never be left hanging by a bad check
                log.exception("Releasing held requests failed")
                continue
            if changed:
                self._held_changed()

    async def _attempt(
        self, call: _Call, route: Route, send: Send
    ) -> tuple[Failure, _Held | None] | None:
        """Relay one replica's answer, or say why it refused before its first byte."""
        assert self.client is not None
        replica = route.replica
        with self.book.open(replica, charged_cost(call.features, route), call.features.fanout):
            sent = time.perf_counter()
            self.metrics.added_latency.labels("request").observe(sent - call.arrival)
            try:
                # encoded=True: the path goes out as it was matched, never re-normalised.
                upstream = await self.client.request(
                    call.method, URL(replica + call.target, encoded=True), headers=call.headers,
                    data=call.body or None, allow_redirects=False,
                )
            except aiohttp.ClientConnectionError as exc:
                if isinstance(exc, aiohttp.SocketTimeoutError):
                    self._count(call, route, "upstream_error")
                    await _respond(send, 504, error_body("The replica did not answer in time.",
                                                     504), {REQUEST_ID: call.request_id})
                    return None
                # Nothing came back; a kept-alive connection the replica closed looks the same,
                # but only a failed connect says the replica itself is gone.
                log.warning("Request %s to %s failed before a response: %r",
                            call.request_id, replica, exc)
                if isinstance(exc, aiohttp.ClientConnectorError):
                    self.discovery.report_unreachable(replica)
                return Failure.CONNECT_ERROR, None
            try:
                if upstream.status not in (429, 503):
                    await self._relay(call, route, upstream, sent, send)
                    return None
                held = await _hold(upstream, call.request_id)
            finally:
                # Closing drops the connection when the body was not read to its end (client
                # gone, cut stream), so the replica sees the disconnect and stops.
                upstream.close()
        if upstream.status == 429:
            return Failure.QUEUE_FULL, held
        if b"draining" in held.body.lower():
            self.discovery.report_draining(replica)
            return Failure.DRAINING, held
        await self._give_up(call, route, held, send)  # a 503 of another kind: not retried
        return None

    async def _relay(self, call: _Call, route: Route, upstream: aiohttp.ClientResponse,
                     sent: float,
                     send: Send) -> None:
        session = session_of(call.features)
        if session is not None:
            self.metrics.placements.labels(self.sessions.place(session, route.replica)).inc()
        await send({"type": "http.response.start", "status": upstream.status,
                    "headers": _downstream_headers(upstream, call.request_id)})
        call.route, call.status = route, upstream.status
        outcome = outcome_of(upstream.status)
        expected, relayed = upstream.content_length, 0
        first = True
        try:
            async with asyncio.timeout(self.settings.stream_timeout):
                async for chunk in upstream.content.iter_any():
                    got = time.perf_counter()
                    relayed += len(chunk)
                    # OpenAI clients hang up right after `data: [DONE]` (or the last byte of
                    # a sized body) without waiting for the end of the response: that is a
                    # finished request, not a client gone.
                    call.delivered = relayed == expected or chunk.endswith(SSE_DONE)
                    try:
                        async with asyncio.timeout(self.settings.send_timeout):
                            await send({"type": "http.response.body", "body": chunk,
                                        "more_body": True})
                    except TimeoutError:
                        raise _ClientStalled from None
                    if first:
                        first = False
                        self.metrics.ttft.labels(call.features.traffic_class.value).observe(
                            got - sent)
                        self.metrics.added_latency.labels("first_byte").observe(
                            time.perf_counter() - got)
        except _ClientStalled:
            log.warning("Request %s cut: its client took no bytes for %g s",
                        call.request_id, self.settings.send_timeout)
            self._count(call, route, "client_gone")
            raise  # the app ends without finishing the response, and drops the connection
        except (aiohttp.ClientError, TimeoutError) as exc:
            # After the first byte nothing is retried: end the response short, the client sees
            # a cut stream instead of a well-formed but wrong one.
            log.warning("Request %s to %s cut after its first byte: %r",
                        call.request_id, route.replica, exc)
            self._count(call, route, "aborted")
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        self._count(call, route, outcome)

    async def _give_up(self, call: _Call, route: Route, held: _Held | None,
                       send: Send) -> None:
        if held is None:
            self._count(call, route, "unreachable")
            await _respond(send, 502, error_body("No replica could be reached.", 502),
                           {REQUEST_ID: call.request_id})
            return
        # The replica's own answer, with its Retry-After.
        self._count(call, route, outcome_of(held.status))
        await send({"type": "http.response.start", "status": held.status,
                    "headers": held.headers})
        await send({"type": "http.response.body", "body": held.body, "more_body": False})

    def _label(self, replica: str) -> str:
        for endpoint in self.discovery.endpoints():
            if endpoint.name == replica:
                return endpoint.label or replica
        return replica

    def mode_label(self, replica: str) -> str:
        for endpoint in self.discovery.endpoints():
            if endpoint.name == replica:
                return endpoint.mode.value if endpoint.mode else "unknown"
        return "none"

    def _count(self, call: _Call, route: Route | None, outcome: str) -> None:
        # Once: a client that leaves while its answer (a refusal, a held 429) is being written
        # must not count a second time as client_gone (the operator reads this as demand).
        if call.counted:
            return
        call.counted = True
        mode = call.modes.get(route.replica, "none") if route is not None else "none"
        self.metrics.requests.labels(call.features.traffic_class.value, mode, outcome).inc()


def outcome_of(status: int) -> str:
    if status < 400:
        return "ok"
    return "client_error" if status < 500 else "upstream_error"


def connection_tokens(headers: list[tuple[str, str]]) -> set[str]:
    tokens: set[str] = set()
    for key, value in headers:
        if key == "connection":
            tokens |= {t.strip().lower() for t in value.split(",") if t.strip()}
    return tokens


def _upstream_headers(headers: list[tuple[str, str]], request_id: str,
                      scope: Scope) -> list[tuple[str, str]]:
    # The body is already read, so an Expect: 100-continue has been answered here.
    drop = HOP_BY_HOP | FORWARDED | connection_tokens(headers) | {
        "host", "content-length", "expect", REQUEST_ID}
    kept = [(k, v) for k, v in headers if k not in drop]
    kept.append((REQUEST_ID, request_id))
    client = scope.get("client")
    if client:
        kept.append(("x-forwarded-for", client[0]))
    host = next((v for k, v in headers if k == "host"), None)
    if host:
        kept.append(("x-forwarded-host", host))
    kept.append(("x-forwarded-proto", scope.get("scheme", "http")))
    return kept


def _downstream_headers(upstream: aiohttp.ClientResponse,
                        request_id: str) -> list[tuple[bytes, bytes]]:
    raw = [(k.lower(), v) for k, v in upstream.raw_headers]
    tokens = connection_tokens([(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw])
    drop = {h.encode() for h in HOP_BY_HOP | tokens | {REQUEST_ID}}
    kept = [(k, v) for k, v in raw if k not in drop]
    kept.append((REQUEST_ID.encode(), request_id.encode()))
    return kept


async def _hold(upstream: aiohttp.ClientResponse, request_id: str) -> _Held:
    body = b""
    async for chunk in upstream.content.iter_any():
        body += chunk
        if len(body) >= HELD_BODY_LIMIT:
            body = body[:HELD_BODY_LIMIT]
            break
    headers = [(k, v) for k, v in _downstream_headers(upstream, request_id)
               if k != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    return _Held(upstream.status, headers, body)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def _cancel_when_gone(receive: Receive, task: asyncio.Task[Any]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    task.cancel()


def _with_header(send: Send, name: str, seconds: Callable[[], float | None]) -> Send:
    """`send`, adding a header of `seconds()` to the response's start, when it has a value."""
    async def sending(message: Message) -> None:
        value = seconds()
        if message["type"] == "http.response.start" and value is not None:
            headers = [*message.get("headers", []), (name.encode(), f"{value:.3f}".encode())]
            message = {**message, "headers": headers}
        await send(message)
    return sending


async def _answer(send: Send, answer: Answer) -> None:
    await _respond(send, answer.status, answer.body, dict(answer.headers), close=answer.close)


async def _respond(send: Send, status: int, body: bytes, headers: dict[str, str] | None = None,
                   content_type: str = "application/json", close: bool = False) -> None:
    raw = [(b"content-type", content_type.encode()),
           (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    if close:
        raw.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})
