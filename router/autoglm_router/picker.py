"""The endpoint picker: the router's decision served over Envoy's external-processing protocol.

A Gateway API Inference Extension gateway (Istio, agentgateway, Envoy Gateway, kgateway...) opens
one `envoy.service.ext_proc.v3.ExternalProcessor/Process` stream per HTTP request and sends the
request's headers, then its body. The picker applies the HTTP router's rules in the same order
(path allow-list, API key and request cap on the headers, before the body is asked for; then the
body's size, budget and deadline; the bounded scan; `routing.decide`) and answers with the
replica's `ip:port` in the `x-gateway-destination-endpoint` header and `envoy.lb` metadata, or
with the refusal the HTTP router would give, as an ImmediateResponse. The gateway streams the
response itself.

With no replica up, an inference request (a POST) waits in the HTTP router's own hold queue
(`RouterApp._held`, the same bounds, order and release) inside the ext_proc exchange: the
picker first asks Envoy for more time for its pending message (`override_message_timeout`, as
long as the hold plus HOLD_MARGIN_SECONDS, honoured up to the filter's `max_message_timeout`),
then answers once a replica takes the request, or with the HTTP router's 503 past the hold's
bounds. Nothing reaches the client while it waits (no SSE heartbeat: the response has not
begun). A gateway that closes the stream takes the request out of the queue. `GET /v1/models`
at zero is answered from `--served-model-name`, waking nothing.

In-flight accounting rides on the stream: Envoy closes it when the HTTP request ends (answered,
failed or abandoned by its client) as long as it may still have something to send on it (in
BUFFERED mode always; in FULL_DUPLEX_STREAMED with response_trailer_mode SEND, which sends no
message for an HTTP/1.1 answer). The load book holds each request from the choice to that close,
with no message on the response path.

It shares the RouterApp (discovery, load book, sessions, metrics, limits) with the HTTP router
in one process and event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import duration_pb2, struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from autoglm_router import answers
from autoglm_router.answers import HELD_SECONDS, REQUEST_ID, Answer
from autoglm_router.epp import (
    DESTINATION_HEADER,
    DESTINATION_NAMESPACE,
    SERVED_KEY,
    SUBSET_KEY,
    SUBSET_NAMESPACE,
    address_of,
    destinations,
    in_subset,
)
from autoglm_router.features import RequestFeatures
from autoglm_router.proxy import HOP_BY_HOP, RouterApp, _Call, connection_tokens, outcome_of
from autoglm_router.routing import NO_REPLICA, Refusal, Route, charged_cost
from autoglm_router.sessions import session_of

log = logging.getLogger(__name__)

BodyMode = processing_mode_pb2.ProcessingMode.BodySendMode
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
# Picker-routed requests whose answer the gateway relays unseen (no response headers sent).
ROUTED = "routed"
# A body costs the picker about twice its size while it decides: gRPC's copy of a BUFFERED
# message and the message's bytes, or the full-duplex parts and their join for the scan.
# The router's body budget counts it so.
BODY_COPIES = 2
# Envoy waits this much longer than the hold for a held request's answer, so that the hold's
# own 503 goes out before the gateway's timeout: max_message_timeout must allow the sum.
HOLD_MARGIN_SECONDS = 5.0
# Where Envoy's ext_proc filter puts the `request_attributes` it is configured to send.
ATTRIBUTES_NAMESPACE = "envoy.filters.http.ext_proc"
SOURCE_ADDRESS = "source.address"
# The hold queue's client for a gateway that names no source address: its requests share one
# client's bound (docs/router/gateway.md), since a header the client sent names nobody.
GATEWAY_CLIENT = "gateway"


class Exchange:
    """One HTTP request's ext_proc stream: each message in, the answers to send back (no I/O).

    `close()` ends the request's accounting; the servicer calls it when the stream ends."""

    def __init__(self, app: RouterApp, fallbacks: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.fallbacks = fallbacks
        self.ended = False  # an ImmediateResponse went out: nothing more to answer
        self._clock = clock
        self.body_deadline: float | None = None  # `clock` time by which the body must be in
        self._arrival = 0.0
        self._mode = BodyMode.FULL_DUPLEX_STREAMED
        self._response_mode = BodyMode.NONE
        self._method = ""
        self._raw_path = ""
        self._headers: dict[str, str] = {}
        self._subset: list[str] | None = None
        # The body's messages as they came: scanned together, handed back one by one.
        self._parts: list[bytes] = []
        self._size = 0
        self._declared = 0  # the body's declared length (the most allowed without one)
        self._held = 0  # body bytes reserved in the app's budget
        self._admitted = False
        self._features: RequestFeatures | None = None
        self._routes: list[Route] = []
        self._mode_label = "none"
        self._status = 0
        self._accounting = contextlib.ExitStack()
        self._inference = False  # routed, and counted in the demand book until close
        self._client = GATEWAY_CLIENT  # its share of the hold queue is bounded
        self._assigned_id = ""  # the request id its answers carry, once one is needed
        self._with_body = False
        self.holding = False  # no replica: `hold()` is to be awaited for the answers
        self._waiting = False  # in the hold queue now
        self.held_seconds: float | None = None  # how long it waited for a replica, if it did

    def on(self, message: Any) -> list[Any]:
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            return self._on_request_headers(message)
        if kind == "request_body":
            return self._on_request_body(message.request_body)
        if kind == "response_headers":
            return self._on_response_headers(message)
        if kind == "response_body":
            return [self._response_body(message.response_body)]
        if kind == "request_trailers":
            return [ext_proc.ProcessingResponse(request_trailers=ext_proc.TrailersResponse())]
        if kind == "response_trailers":
            return [ext_proc.ProcessingResponse(response_trailers=ext_proc.TrailersResponse())]
        return []

    def timed_out(self) -> list[Any]:
        """The body did not arrive within the body deadline."""
        return self._answer(answers.body_too_slow(self.app.settings.body_timeout))

    def close(self) -> None:
        """The stream ended: the HTTP request is over, however it ended."""
        if self._routes and self._features is not None:
            outcome = outcome_of(self._status) if self._status else ROUTED
            self.app.metrics.requests.labels(self._features.traffic_class.value,
                                             self._mode_label, outcome).inc()
        elif self._waiting and self._features is not None:
            # Its client left while it was held (the gateway closed the stream).
            self.app.metrics.requests.labels(self._features.traffic_class.value, "none",
                                             "client_gone").inc()
            self._waiting = False
        self._accounting.close()
        if self._inference:
            self.app.demand.finished(self.held_seconds)
            self._inference = False
        self._release_body()
        if self._admitted:
            self.app.inflight -= 1
            self._admitted = False

    # --- the request ---------------------------------------------------------------------------

    def _on_request_headers(self, message: Any) -> list[Any]:
        self._arrival = time.perf_counter()
        if message.HasField("protocol_config"):
            self._mode = message.protocol_config.request_body_mode
            self._response_mode = message.protocol_config.response_body_mode
        self._headers = {h.key.lower(): _value(h) for h in message.request_headers.headers.headers}
        self._subset = _subset_hint(message.metadata_context)
        self._client = _client_of(message) or GATEWAY_CLIENT
        path = self._headers.get(":path", "")
        self._method = self._headers.get(":method", "")
        self._raw_path = path.split("?", 1)[0]
        refusal = self.app.admission(self._method, self._raw_path,
                                     self._headers.get("authorization"))
        if refusal is not None:
            return self._answer(refusal)
        self.app.inflight += 1
        self._admitted = True
        if message.request_headers.end_of_stream:
            return self._route(with_body=False)
        if self._mode not in (BodyMode.BUFFERED, BodyMode.BUFFERED_PARTIAL,
                              BodyMode.FULL_DUPLEX_STREAMED):
            # STREAMED or NONE: the headers go upstream before the body is seen.
            name = BodyMode.Name(self._mode)
            log.error("The gateway sends request bodies in %s mode; the picker routes on the "
                      "body: set request_body_mode FULL_DUPLEX_STREAMED (or BUFFERED)", name)
            return self._answer(Answer(500, answers.error_body(
                f"The gateway's ext_proc request_body_mode {name} cannot be routed on.", 500)))
        size = self.app.body_size(self._headers.get("content-length"))
        refusal = self.app.body_refusal(size, held=size * BODY_COPIES)
        if refusal is not None:
            return self._answer(refusal)
        self._declared = size
        self._held = size * BODY_COPIES
        self.app.buffered_body_bytes += self._held
        self.body_deadline = self._clock() + self.app.settings.body_timeout
        if self._mode == BodyMode.FULL_DUPLEX_STREAMED:
            return []  # the headers' answer waits for the body: it carries the destination
        return [ext_proc.ProcessingResponse(request_headers=ext_proc.HeadersResponse())]

    def _on_request_body(self, body: Any) -> list[Any]:
        if self._features is not None:
            # BUFFERED_PARTIAL's rest, if the gateway sends it: routed on the first part already.
            return [ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse())]
        self._parts.append(body.body)
        self._size += len(body.body)
        limit = self.app.settings.max_body_bytes
        if self._size > min(limit, self._declared):
            return self._answer(answers.body_too_large(limit))
        # BUFFERED_PARTIAL sends one message, the whole body or as much as the gateway buffers.
        if body.end_of_stream or self._mode == BodyMode.BUFFERED_PARTIAL:
            return self._route(with_body=True)
        return []

    def _route(self, with_body: bool) -> list[Any]:
        self.body_deadline = None
        app = self.app
        # One message (BUFFERED, or a small body) is scanned where it lies, never copied.
        body = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        features = app.features_of(self._method, self._raw_path, body, self._headers)
        self._features = features
        self._with_body = with_body
        chosen = self._destinations()
        if isinstance(chosen, Refusal) and chosen.reason == NO_REPLICA:
            inference = self._method == "POST"
            if not inference and app.settings.served_model_names:
                # GET /v1/models at zero: answered from what the router knows, waking nothing.
                app.metrics.requests.labels(features.traffic_class.value, "none", "ok").inc()
                return self._answer(answers.models_at_zero(app.settings.served_model_names,
                                                           app.started_at),
                                    details="autoglm_picker_models_at_zero")
            # The protocol asks for 503 at once when none of the gateway's subset is eligible.
            if inference and app.hold.size and self._subset is None:
                self.holding = True
                return [self._more_time()]
        return self._routed(chosen)

    def _destinations(self) -> list[Route] | Refusal:
        assert self._features is not None
        pool = in_subset(self.app.pool(), self._subset)
        return destinations(self._features, pool, self.app.config,
                            self.app.sessions.last(self._features), self.fallbacks)

    def _more_time(self) -> Any:
        """Envoy's wait for the pending message, stretched to cover the hold (once a message:
        Envoy ignores a second ask, and one past its max_message_timeout)."""
        wait = duration_pb2.Duration()
        wait.FromTimedelta(datetime.timedelta(
            seconds=self.app.hold.seconds + HOLD_MARGIN_SECONDS))
        return ext_proc.ProcessingResponse(override_message_timeout=wait)

    async def hold(self) -> list[Any]:
        """Wait in the hold queue until a replica takes the request; its answers then, or
        the HTTP router's answer past the hold's bounds. Cancelled (the gateway closed the
        stream), it leaves the queue."""
        self.holding = False
        features = self._features
        assert features is not None
        call = _Call(self._method, self._raw_path, [], bytearray(), features,
                     self._request_id(), self._arrival, client=self._client)
        self._waiting = True
        try:
            route = await self.app._held(call, None)
        finally:
            self.held_seconds = call.held_seconds
            if call.ticket is not None and call.held_seconds is not None:
                self.app.metrics.hold_seconds.observe(call.held_seconds)
        self._waiting = False
        if isinstance(route, Answer):
            self.app.metrics.requests.labels(features.traffic_class.value, "none",
                                             "refused").inc()
            return self._answer(route)
        # The pool took it just now, with no await since: the same choice, with fallbacks.
        return self._routed(self._destinations())

    def _routed(self, chosen: list[Route] | Refusal) -> list[Any]:
        app = self.app
        features = self._features
        assert features is not None
        if isinstance(chosen, Refusal):
            app.metrics.requests.labels(features.traffic_class.value, "none", "refused").inc()
            return self._answer(answers.refused(chosen, self._request_id()))
        self._routes = chosen
        if self._method == "POST":  # an inference request: in flight until the stream closes
            app.demand.started()
            self._inference = True
        first = chosen[0]
        self._mode_label = app.mode_label(first.replica)
        self._accounting.enter_context(app.book.open(first.replica,
                                                     charged_cost(features, first),
                                                     features.fanout))
        app.metrics.decisions.labels(first.reason.value).inc()
        session = session_of(features)
        if session is not None:
            app.metrics.placements.labels(app.sessions.place(session, first.replica)).inc()
        app.metrics.added_latency.labels("request").observe(time.perf_counter() - self._arrival)
        destination = ",".join(address_of(r.replica) for r in chosen)
        return self._destination_answers(destination, self._with_body)

    def _destination_answers(self, destination: str, with_body: bool) -> list[Any]:
        # Hop-by-hop headers stop here, as at the HTTP router (the gateway keeps TE and
        # Proxy-Authorization).
        hop_by_hop = HOP_BY_HOP | connection_tokens(list(self._headers.items()))
        common = ext_proc.CommonResponse(clear_route_cache=True, header_mutation=(
            ext_proc.HeaderMutation(set_headers=[base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=DESTINATION_HEADER,
                                            raw_value=destination.encode()),
                append_action=OVERWRITE)],
                remove_headers=sorted(name for name in self._headers if name in hop_by_hop))))
        metadata = struct_pb2.Struct()
        metadata.update({DESTINATION_NAMESPACE: {DESTINATION_HEADER: destination}})
        if not with_body or self._mode == BodyMode.FULL_DUPLEX_STREAMED:
            out = [ext_proc.ProcessingResponse(
                request_headers=ext_proc.HeadersResponse(response=common),
                dynamic_metadata=metadata)]
            if with_body:
                out += self._echo_body()
        else:
            # BUFFERED: the headers were let through unchanged and wait for the body's answer.
            out = [ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse(
                response=common), dynamic_metadata=metadata)]
        self._release_body()
        return out

    def _echo_body(self) -> list[Any]:
        """Full duplex: the body goes upstream only as the picker hands it back."""
        last = len(self._parts) - 1
        return [ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse(
            response=ext_proc.CommonResponse(body_mutation=ext_proc.BodyMutation(
                streamed_response=ext_proc.StreamedBodyResponse(
                    body=part, end_of_stream=i == last)))))
            for i, part in enumerate(self._parts)]

    def _answer(self, answer: Answer, details: str = "autoglm_picker_refused") -> list[Any]:
        """The request answered here, as an ImmediateResponse: nothing more to do."""
        self.ended = True
        self._release_body()
        held = ((HELD_SECONDS, f"{self.held_seconds:.3f}"),) if self.held_seconds is not None \
            else ()
        return [ext_proc.ProcessingResponse(immediate_response=ext_proc.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=answer.status),
            headers=_set_headers((("content-type", "application/json"), *answer.headers, *held)),
            body=answer.body, details=details))]

    def _release_body(self) -> None:
        self.app.buffered_body_bytes -= self._held
        self._held = 0
        self._parts = []
        self._size = 0

    def _request_id(self) -> str:
        """The gateway's request id, else one of its own, the same for the whole request."""
        if not self._assigned_id:
            self._assigned_id = self._headers.get(REQUEST_ID) or uuid.uuid4().hex
        return self._assigned_id

    # --- the response: seen only when the gateway sends it ---------------------------------------

    def _on_response_headers(self, message: Any) -> list[Any]:
        headers = {h.key: _value(h) for h in message.response_headers.headers.headers}
        status = headers.get(":status", "")
        self._status = int(status) if status.isdigit() else 0
        self._follow_served(message.metadata_context)
        if self.held_seconds is None:
            return [ext_proc.ProcessingResponse(response_headers=ext_proc.HeadersResponse())]
        # A gateway that shows the picker the response gets the HTTP router's held header.
        return [ext_proc.ProcessingResponse(response_headers=ext_proc.HeadersResponse(
            response=ext_proc.CommonResponse(header_mutation=_set_headers(
                ((HELD_SECONDS, f"{self.held_seconds:.3f}"),)))))]

    def _follow_served(self, metadata: Any) -> None:
        """The gateway says which of the destinations served the request (one of the fallbacks
        after a failed connection): its load moves there."""
        served = _metadata_value(metadata, DESTINATION_NAMESPACE, SERVED_KEY)
        if not self._routes or not isinstance(served, str) or self._features is None:
            return
        for route in self._routes[1:]:
            if address_of(route.replica) == served:
                self._accounting.close()
                self._accounting.enter_context(self.app.book.open(
                    route.replica, charged_cost(self._features, route), self._features.fanout))
                self._mode_label = self.app.mode_label(route.replica)
                return

    def _response_body(self, body: Any) -> Any:
        if self._response_mode == BodyMode.FULL_DUPLEX_STREAMED:
            return ext_proc.ProcessingResponse(response_body=ext_proc.BodyResponse(
                response=ext_proc.CommonResponse(body_mutation=ext_proc.BodyMutation(
                    streamed_response=ext_proc.StreamedBodyResponse(
                        body=body.body, end_of_stream=body.end_of_stream)))))
        return ext_proc.ProcessingResponse(response_body=ext_proc.BodyResponse())


def _value(header: Any) -> str:
    return header.raw_value.decode("latin-1") if header.raw_value else header.value


def _set_headers(headers: Iterable[tuple[str, str]]) -> Any:
    return ext_proc.HeaderMutation(set_headers=[
        base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
                                   append_action=OVERWRITE)
        for key, value in headers])


def _client_of(message: Any) -> str | None:
    """The downstream address the gateway itself names (Envoy's `source.address` attribute,
    sent when the filter's `request_attributes` lists it), without its port: a client's own
    headers (X-Forwarded-For) would let it pass for anyone."""
    if ATTRIBUTES_NAMESPACE not in message.attributes:
        return None
    fields = message.attributes[ATTRIBUTES_NAMESPACE].fields
    if SOURCE_ADDRESS not in fields or fields[SOURCE_ADDRESS].WhichOneof("kind") != "string_value":
        return None
    return host_of(fields[SOURCE_ADDRESS].string_value) or None


def host_of(address: str) -> str:
    """`ip` of `ip:port`, `[v6]:port` or a bare address."""
    if address.startswith("["):
        return address[1:].partition("]")[0]
    host, colon, port = address.rpartition(":")
    return host if colon and port.isdigit() and ":" not in host else address


def _metadata_value(metadata: Any, namespace: str, key: str) -> Any:
    if namespace not in metadata.filter_metadata:
        return None
    fields = metadata.filter_metadata[namespace].fields
    if key not in fields:
        return None
    value = fields[key]
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "list_value":
        return [v.string_value for v in value.list_value.values]
    return None


def _subset_hint(metadata: Any) -> list[str] | None:
    subset = _metadata_value(metadata, SUBSET_NAMESPACE, SUBSET_KEY)
    if subset is None:
        return None
    return subset if isinstance(subset, list) else [subset]


class Picker(ext_proc_grpc.ExternalProcessorServicer):
    def __init__(self, app: RouterApp, fallbacks: int = 0) -> None:
        self.app = app
        self.fallbacks = fallbacks

    async def Process(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        exchange = Exchange(self.app, self.fallbacks, asyncio.get_running_loop().time)
        try:
            while not exchange.ended:
                try:
                    async with asyncio.timeout_at(exchange.body_deadline):
                        message = await anext(requests)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    for response in exchange.timed_out():
                        yield response
                    return
                for response in exchange.on(message):
                    yield response
                if exchange.holding:
                    for response in await exchange.hold():
                        yield response
        finally:
            exchange.close()


class Health(health_pb2_grpc.HealthServicer):
    """gRPC health as GIE pickers serve it: `liveness` while the process answers; readiness
    (``, `readiness`, the ext_proc service) while it has a replica, or holds requests until one
    is up, and does not drain."""

    def __init__(self, app: RouterApp) -> None:
        self.app = app

    async def Check(self, request: Any, context: Any) -> Any:
        service = request.service
        if service == "liveness":
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
        if service not in ("", "readiness", EXT_PROC_SERVICE):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {service!r}")
        # Holding, a picker with no replica still serves: it holds requests until one is up.
        ready = not self.app.draining and (self.app.ready() or self.app.hold.size > 0)
        status = (health_pb2.HealthCheckResponse.SERVING if ready
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        return health_pb2.HealthCheckResponse(status=status)


class PickerServer:
    """The gRPC server of the picker and its health, on the router's event loop."""

    def __init__(self, app: RouterApp, host: str, port: int, fallbacks: int = 0) -> None:
        self.app = app
        self.address = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        self.fallbacks = fallbacks
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        # A BUFFERED gateway sends the whole body in one message; never two routers on a port.
        limit = self.app.settings.max_body_bytes + (1 << 20)
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                          ("grpc.max_send_message_length", limit),
                                          ("grpc.so_reuseport", 0)])
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(
            Picker(self.app, self.fallbacks), server)
        health_pb2_grpc.add_HealthServicer_to_server(Health(self.app), server)
        if server.add_insecure_port(self.address) == 0:
            raise OSError(f"the endpoint picker cannot listen on {self.address}")
        await server.start()
        self._server = server
        log.info("The endpoint picker listens on %s", self.address)

    async def stop(self, grace: float) -> None:
        """New streams are refused at once; those open (requests in flight) get `grace`."""
        if self._server is not None:
            await self._server.stop(grace)
