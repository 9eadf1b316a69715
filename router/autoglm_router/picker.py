"""The endpoint picker: the router's decision served over Envoy's external-processing protocol.

A Gateway API Inference Extension gateway (Istio, agentgateway, Envoy Gateway, kgateway...) opens
one `envoy.service.ext_proc.v3.ExternalProcessor/Process` stream per HTTP request and sends the
request's headers, then its body. The picker applies the HTTP router's rules in the same order
(path allow-list, API key and request cap on the headers, before the body is asked for; then the
body's size, budget and deadline; the bounded scan; `routing.decide`) and answers with the
replica's `ip:port` in the `x-gateway-destination-endpoint` header and `envoy.lb` metadata, or
with the refusal the HTTP router would give, as an ImmediateResponse. The gateway streams the
response itself.

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
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from autoglm_router import answers
from autoglm_router.answers import REQUEST_ID, Answer
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
from autoglm_router.proxy import HOP_BY_HOP, RouterApp, connection_tokens, outcome_of
from autoglm_router.routing import Refusal, Route, charged_cost
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
        return self._refuse(answers.body_too_slow(self.app.settings.body_timeout))

    def close(self) -> None:
        """The stream ended: the HTTP request is over, however it ended."""
        if self._routes and self._features is not None:
            outcome = outcome_of(self._status) if self._status else ROUTED
            self.app.metrics.requests.labels(self._features.traffic_class.value,
                                             self._mode_label, outcome).inc()
        self._accounting.close()
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
        path = self._headers.get(":path", "")
        self._method = self._headers.get(":method", "")
        self._raw_path = path.split("?", 1)[0]
        refusal = self.app.admission(self._method, self._raw_path,
                                     self._headers.get("authorization"))
        if refusal is not None:
            return self._refuse(refusal)
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
            return self._refuse(Answer(500, answers.error_body(
                f"The gateway's ext_proc request_body_mode {name} cannot be routed on.", 500)))
        size = self.app.body_size(self._headers.get("content-length"))
        refusal = self.app.body_refusal(size, held=size * BODY_COPIES)
        if refusal is not None:
            return self._refuse(refusal)
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
            return self._refuse(answers.body_too_large(limit))
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
        app.note_request()
        pool = in_subset(app.pool(), self._subset)
        chosen = destinations(features, pool, app.config, app.sessions.last(features),
                              self.fallbacks)
        if isinstance(chosen, Refusal):
            app.metrics.requests.labels(features.traffic_class.value, "none", "refused").inc()
            return self._refuse(answers.refused(chosen, self._request_id()))
        self._routes = chosen
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
        return self._destination_answers(destination, with_body)

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

    def _refuse(self, answer: Answer) -> list[Any]:
        self.ended = True
        self._release_body()
        return [ext_proc.ProcessingResponse(immediate_response=ext_proc.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=answer.status),
            headers=ext_proc.HeaderMutation(set_headers=[
                base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(
                    key=key, raw_value=value.encode()), append_action=OVERWRITE)
                for key, value in (("content-type", "application/json"), *answer.headers)]),
            body=answer.body, details="autoglm_picker_refused"))]

    def _release_body(self) -> None:
        self.app.buffered_body_bytes -= self._held
        self._held = 0
        self._parts = []
        self._size = 0

    def _request_id(self) -> str:
        return self._headers.get(REQUEST_ID) or uuid.uuid4().hex

    # --- the response: seen only when the gateway sends it ---------------------------------------

    def _on_response_headers(self, message: Any) -> list[Any]:
        headers = {h.key: _value(h) for h in message.response_headers.headers.headers}
        status = headers.get(":status", "")
        self._status = int(status) if status.isdigit() else 0
        self._follow_served(message.metadata_context)
        return [ext_proc.ProcessingResponse(response_headers=ext_proc.HeadersResponse())]

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
        finally:
            exchange.close()


class Health(health_pb2_grpc.HealthServicer):
    """gRPC health as GIE pickers serve it: `liveness` while the process answers; readiness
    (``, `readiness`, the ext_proc service) while it has a replica and does not drain."""

    def __init__(self, app: RouterApp) -> None:
        self.app = app

    async def Check(self, request: Any, context: Any) -> Any:
        service = request.service
        if service == "liveness":
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
        if service not in ("", "readiness", EXT_PROC_SERVICE):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {service!r}")
        ready = not self.app.draining and self.app.ready()
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
