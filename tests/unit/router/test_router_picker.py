"""The endpoint picker driven message by message, as Envoy's ext_proc filter drives it, beside the
HTTP router on the same RouterApp: the same decision, the same refusals, and a load book that
empties when the stream ends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2
from router_fakes import FixedDiscovery

from autoglm_api.profiles import Mode
from autoglm_router import answers
from autoglm_router.discovery import Endpoint
from autoglm_router.epp import address_of, destinations, in_subset
from autoglm_router.features import NEUTRAL, KeyKind, RequestFeatures, TrafficClass
from autoglm_router.picker import EXT_PROC_SERVICE, Health, Picker, host_of
from autoglm_router.proxy import ProxySettings, RouterApp
from autoglm_router.routing import Refusal, ReplicaState, RoutingConfig

Mode_ = processing_mode_pb2.ProcessingMode.BodySendMode
STREAMING, BATCHING, OTHER = "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"
CHAT = "/v1/chat/completions"
STREAMED_CHAT = json.dumps({"model": "m", "stream": True, "messages": [
    {"role": "system", "content": "You operate a phone."},
    {"role": "user", "content": "Open the settings app."}]}).encode()


def three() -> FixedDiscovery:
    return FixedDiscovery(Endpoint(STREAMING, Mode.STREAMING, ready=True),
                          Endpoint(BATCHING, Mode.BATCHING, ready=True),
                          Endpoint(OTHER, Mode.BATCHING, ready=True))


def app_of(pool: FixedDiscovery | None = None, caps: int = 8, keys: list[str] | None = None,
           **settings: Any) -> RouterApp:
    every_mode = {Mode.STREAMING: caps, Mode.BATCHING: caps}
    config = RoutingConfig(caps=every_mode, chat_caps=every_mode)
    return RouterApp(pool or three(), config, ProxySettings(**settings), api_keys=keys)


def headers_message(path: str = CHAT, method: str = "POST", body: bytes | None = STREAMED_CHAT,
                    mode: int = Mode_.FULL_DUPLEX_STREAMED, subset: list[str] | None = None,
                    **extra: str) -> Any:
    headers = {":method": method, ":path": path, ":authority": "gw", "x-request-id": "rid-1",
               **({"content-length": str(len(body))} if body is not None else {}), **extra}
    message = ext_proc.ProcessingRequest(
        request_headers=ext_proc.HttpHeaders(
            headers=base_pb2.HeaderMap(headers=[
                base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]),
            end_of_stream=body is None),
        protocol_config=ext_proc.ProtocolConfiguration(request_body_mode=mode))
    if subset is not None:
        hint = struct_pb2.Struct()
        hint.update({"x-gateway-destination-endpoint-subset": subset})
        message.metadata_context.filter_metadata["envoy.lb.subset_hint"].CopyFrom(hint)
    return message


def body_messages(body: bytes, chunk: int = 1 << 20) -> list[Any]:
    parts = [body[i:i + chunk] for i in range(0, len(body), chunk)] or [b""]
    return [ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(
        body=part, end_of_stream=i == len(parts) - 1)) for i, part in enumerate(parts)]


class Stream:
    """One ext_proc stream: the messages Envoy sends, then (unless `hold`) its close.
    `handled` is set once the picker asks for a message after the last: it has handled all."""

    def __init__(self, picker: Picker, messages: list[Any], hold: asyncio.Event | None = None
                 ) -> None:  # fmt: skip
        self.picker = picker
        self.messages = messages
        self.hold = hold
        self.handled = asyncio.Event()
        self.responses: list[Any] = []

    async def _requests(self) -> AsyncIterator[Any]:
        for message in self.messages:
            yield message
        self.handled.set()
        if self.hold is not None:
            await self.hold.wait()

    async def run(self) -> list[Any]:
        async for response in self.picker.Process(self._requests(), None):
            self.responses.append(response)
        return self.responses


async def exchange(app: RouterApp, *messages: Any, fallbacks: int = 0) -> list[Any]:
    return await asyncio.wait_for(Stream(Picker(app, fallbacks), list(messages)).run(), 5)


def destination(response: Any) -> tuple[str, str]:
    """(header, metadata) of a destination answer."""
    which = response.WhichOneof("response")
    common = getattr(response, which).response
    (header,) = common.header_mutation.set_headers
    assert header.header.key == "x-gateway-destination-endpoint"
    metadata = response.dynamic_metadata.fields["envoy.lb"].struct_value.fields
    return header.header.raw_value.decode(), metadata["x-gateway-destination-endpoint"].string_value


async def http_answer(app: RouterApp, method: str, path: str, headers: dict[str, str],
                      body: bytes) -> tuple[int, dict[str, str], bytes]:
    """The HTTP router's answer to the same request, in process."""
    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
             "query_string": b"", "client": ("127.0.0.1", 5000), "scheme": "http",
             "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
    sent: list[MutableMapping[str, Any]] = []
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await asyncio.Event().wait()
        return {}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), 5)
    head = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    return sent[0]["status"], head, b"".join(m.get("body", b"") for m in sent[1:])


def immediate(response: Any) -> tuple[int, dict[str, str], bytes]:
    answer = response.immediate_response
    head = {h.header.key: h.header.raw_value.decode() for h in answer.headers.set_headers}
    return answer.status.code, head, answer.body


# --- routing --------------------------------------------------------------------------------


async def test_a_streamed_chat_goes_to_the_streaming_replica_and_its_body_back_unchanged() -> None:
    app = app_of()
    body = STREAMED_CHAT + b" " * 3000
    responses = await exchange(app, headers_message(body=body), *body_messages(body, 1000))
    first, *echoed = responses
    assert destination(first) == ("10.0.0.1:8000", "10.0.0.1:8000")
    # Full duplex: every chunk handed back as it came, the last one ending the stream.
    chunks = [r.request_body.response.body_mutation.streamed_response for r in echoed]
    assert b"".join(c.body for c in chunks) == body
    assert [len(c.body) for c in chunks] == [1000, 1000, 1000, len(body) - 3000]
    assert [c.end_of_stream for c in chunks] == [False, False, False, True]


async def test_a_buffered_body_lets_the_headers_through_then_routes_on_the_body() -> None:
    app = app_of()
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "job"}]}).encode()
    responses = await exchange(app, headers_message(body=body, mode=Mode_.BUFFERED),
                               *body_messages(body))
    assert responses[0].request_headers == ext_proc.HeadersResponse()
    assert destination(responses[1])[0] in ("10.0.0.2:8000", "10.0.0.3:8000")
    assert len(responses) == 2


async def test_a_partly_buffered_body_is_routed_on_its_first_part_once() -> None:
    app = app_of()
    head, rest = STREAMED_CHAT, b" " * 100
    first = ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(body=head))
    responses = await exchange(
        app, headers_message(body=head + rest, mode=Mode_.BUFFERED_PARTIAL), first,
        ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(body=rest,
                                                                  end_of_stream=True)))
    assert destination(responses[1])[0] == "10.0.0.1:8000"
    assert responses[2].request_body == ext_proc.BodyResponse()
    decided = sum(sample.value for family in app.metrics.decisions.collect()
                  for sample in family.samples if sample.name.endswith("_total"))
    assert decided == 1


async def test_a_request_without_a_body_is_routed_on_its_headers() -> None:
    app = app_of()
    (response,) = await exchange(app, headers_message("/v1/models", "GET", body=None))
    assert destination(response)[0].startswith("10.0.0.")


@pytest.mark.parametrize("mode", [Mode_.FULL_DUPLEX_STREAMED, Mode_.BUFFERED])
async def test_the_picker_and_the_http_router_make_the_same_decision(mode: int) -> None:
    """One RouterApp behind both fronts, each request sent to both: the same replica each time,
    sessions kept on theirs."""
    app = app_of()
    bodies = [json.dumps({"model": "m", "stream": i % 2 == 0, "session_id": f"s{i % 3}",
                          "messages": [{"role": "user", "content": f"task {i}"}]}).encode()
              for i in range(12)]
    for body in bodies:
        features = app.features_of("POST", CHAT, body, {})
        expected = app.choose(features)
        assert not isinstance(expected, Refusal)
        responses = await exchange(app, headers_message(body=body, mode=mode),
                                   *body_messages(body))
        routed = next(r for r in responses if r.WhichOneof("response") in (
            "request_headers", "request_body") and destination_or_none(r))
        assert destination(routed)[0] == address_of(expected.replica)
    # A session is kept per class: 6 (class, session) pairs, each placed once, then hit.
    assert app.metrics.placements.labels("new")._value.get() == 6
    assert app.metrics.placements.labels("hit")._value.get() == 6


def destination_or_none(response: Any) -> bool:
    which = response.WhichOneof("response")
    return bool(getattr(response, which).response.header_mutation.set_headers)


async def test_fallbacks_follow_the_chosen_replica_in_the_routers_retry_order() -> None:
    app = app_of()
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "job"}]}).encode()
    (first, *_) = await exchange(app, headers_message(body=body), *body_messages(body),
                                 fallbacks=2)
    header, metadata = destination(first)
    addresses = header.split(",")
    assert header == metadata
    assert len(addresses) == len(set(addresses)) == 3
    # Batch work: the batching replicas first, the streaming one last.
    assert addresses[-1] == "10.0.0.1:8000"


def test_fallbacks_stop_where_no_other_replica_can_take_the_request() -> None:
    replicas = [ReplicaState(STREAMING, Mode.STREAMING), ReplicaState(BATCHING, Mode.BATCHING,
                                                                     draining=True)]
    routes = destinations(NEUTRAL, replicas, RoutingConfig(), fallbacks=3)
    assert not isinstance(routes, Refusal)
    assert [r.replica for r in routes] == [STREAMING]


async def test_the_subset_hint_narrows_the_pool_and_an_empty_one_is_503() -> None:
    app = app_of()
    (response, *_) = await exchange(app, headers_message(subset=["10.0.0.3:8000"]),
                                    *body_messages(STREAMED_CHAT))
    assert destination(response)[0] == "10.0.0.3:8000"
    (refused,) = await exchange(app, headers_message(subset=[]), *body_messages(STREAMED_CHAT))
    assert immediate(refused)[0] == 503


def test_the_subset_is_matched_on_ip_and_port() -> None:
    replicas = [ReplicaState(STREAMING, Mode.STREAMING), ReplicaState(BATCHING, Mode.BATCHING)]
    assert in_subset(replicas, None) == replicas
    assert in_subset(replicas, ["10.0.0.2:8000"]) == replicas[1:]
    assert in_subset(replicas, ["10.0.0.2:9000", "10.0.0.2"]) == []
    assert address_of("http://[fd00::7]:8000") == "[fd00::7]:8000"


# --- the same refusals as the HTTP router ----------------------------------------------------

HUGE = 17 * 1024 * 1024


@pytest.mark.parametrize(("case", "method", "path", "headers", "body"), [
    ("a path outside the API", "POST", "/tokenize", {}, STREAMED_CHAT),
    ("a dot-segment", "GET", "/v1/../metrics", {}, b""),
    ("an encoded slash", "POST", "/v1/..%2Fscale_elastic_ep", {}, STREAMED_CHAT),
    ("a stored response", "GET", "/v1/responses/resp_1", {}, b""),
    ("another method", "DELETE", CHAT, {}, b""),
    ("no key", "POST", CHAT, {}, STREAMED_CHAT),
    ("a wrong key", "POST", CHAT, {"authorization": "Bearer nope"}, STREAMED_CHAT),
    ("a body declared too large", "POST", CHAT, {"content-length": str(HUGE)}, b""),
])
async def test_a_request_refused_on_its_headers_gets_the_http_routers_answer(
    case: str, method: str, path: str, headers: dict[str, str], body: bytes
) -> None:
    keyed = case in ("no key", "a wrong key")
    app = app_of(keys=["secret"] if keyed else None)
    declared = {"content-length": str(len(body)), **headers} if method != "GET" else headers
    status, http_head, http_body = await http_answer(app, method, path, declared, body)
    message = headers_message(path, method, body=None if method == "GET" else body, **headers)
    # Answered on the headers alone: no body message is sent to be read.
    (response,) = await exchange(app, message)
    picker_status, picker_head, picker_body = immediate(response)
    assert (picker_status, picker_body) == (status, http_body), case
    for name in ("allow", "retry-after", "content-type"):
        assert picker_head.get(name) == http_head.get(name), (case, name)
    assert app.inflight == 0 and app.buffered_body_bytes == 0


async def test_no_replica_and_every_replica_at_its_cap_get_the_http_routers_answers() -> None:
    full = app_of(caps=1)
    full.book.count.update({STREAMING: 1, BATCHING: 2, OTHER: 2})
    status, head, body = await http_answer(full, "POST", CHAT, {}, STREAMED_CHAT)
    (response,) = await exchange(full, headers_message(), *body_messages(STREAMED_CHAT))
    assert immediate(response)[0] == status == 429
    assert immediate(response)[2] == body
    assert immediate(response)[1]["retry-after"] == head["retry-after"] == "1"
    # The gateway's request id names the refusal, as the router's own names its refusals.
    assert immediate(response)[1]["x-request-id"] == "rid-1"

    empty = app_of(FixedDiscovery())
    status, _, body = await http_answer(empty, "POST", CHAT, {}, STREAMED_CHAT)
    (response,) = await exchange(empty, headers_message(), *body_messages(STREAMED_CHAT))
    assert (immediate(response)[0], immediate(response)[2]) == (status, body) == (503, body)
    refused = full.metrics.requests.labels("streamed_chat", "none", "refused")._value.get()
    assert refused == 2  # once per front, as demand


async def test_a_body_longer_than_declared_or_the_limit_is_413_as_it_arrives() -> None:
    app = app_of(max_body_bytes=4096)
    body = b"x" * 10_000
    message = headers_message(body=body, **{"content-length": "100"})  # less than it sends
    responses = await exchange(app, message, *body_messages(body, 1024))
    assert immediate(responses[-1])[0] == 413
    assert app.buffered_body_bytes == 0 and app.inflight == 0


async def test_a_body_counts_twice_against_the_body_budget_while_the_picker_holds_it() -> None:
    """gRPC's copy and the message's own bytes: 32 MiB per 15.7 MiB body, measured."""
    app = app_of(max_buffered_body_bytes=100_000)
    body = b"x" * 60_000
    assert app.body_refusal(len(body)) is None  # the HTTP router holds it once: it fits
    (refused,) = await exchange(app, headers_message(body=body))
    assert immediate(refused)[:3:2] == (503, answers.BODY_BUDGET_FULL.body)
    small = await exchange(app, headers_message(body=STREAMED_CHAT),
                           *body_messages(STREAMED_CHAT))
    assert destination(small[0])[0] == "10.0.0.1:8000"
    assert app.buffered_body_bytes == 0


async def test_a_body_that_does_not_arrive_in_time_is_408() -> None:
    app = app_of(body_timeout=0.2)
    stream = Stream(Picker(app), [headers_message()], hold=asyncio.Event())
    (response,) = await asyncio.wait_for(stream.run(), 5)
    status, _, body = immediate(response)
    assert status == 408 and b"0.2 s" in body
    assert app.inflight == 0 and app.buffered_body_bytes == 0


async def test_the_request_cap_counts_the_pickers_requests_with_the_http_routers() -> None:
    app = app_of(max_inflight=1)
    done = asyncio.Event()
    held = Stream(Picker(app), [headers_message(), *body_messages(STREAMED_CHAT)], hold=done)
    task = asyncio.ensure_future(held.run())
    await asyncio.wait_for(held.handled.wait(), 5)
    status, _, http_body = await http_answer(app, "POST", CHAT, {}, STREAMED_CHAT)
    (refused,) = await exchange(app, headers_message(), *body_messages(STREAMED_CHAT))
    assert status == immediate(refused)[0] == 503 and immediate(refused)[2] == http_body
    done.set()
    await asyncio.wait_for(task, 5)
    assert app.inflight == 0


async def test_a_gateway_that_sends_the_body_after_the_headers_went_on_is_told_why() -> None:
    app = app_of()
    (response,) = await exchange(app, headers_message(mode=Mode_.STREAMED))
    status, _, body = immediate(response)
    assert status == 500 and b"STREAMED" in body


# --- in-flight accounting: the stream's close -------------------------------------------------


async def test_a_request_holds_its_replica_until_the_gateway_closes_the_stream() -> None:
    app = app_of()
    done = asyncio.Event()
    stream = Stream(Picker(app), [headers_message(), *body_messages(STREAMED_CHAT)], hold=done)
    task = asyncio.ensure_future(stream.run())
    await asyncio.wait_for(stream.handled.wait(), 5)
    assert app.book.count[STREAMING] == 1 and app.inflight == 1
    assert app.buffered_body_bytes == 0  # the body is handed back: not held for the request
    done.set()
    await asyncio.wait_for(task, 5)
    assert app.book.count[STREAMING] == 0 and app.inflight == 0
    routed = app.metrics.requests.labels("streamed_chat", "streaming", "routed")._value.get()
    assert routed == 1


async def test_a_cancelled_stream_releases_its_request() -> None:
    app = app_of()
    stream = Stream(Picker(app), [headers_message(), *body_messages(STREAMED_CHAT)],
                    hold=asyncio.Event())
    task = asyncio.ensure_future(stream.run())
    await asyncio.wait_for(stream.handled.wait(), 5)
    assert app.book.count[STREAMING] == 1  # routed: the cancel must undo that
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert app.book.count[STREAMING] == 0 and app.inflight == 0


async def test_response_headers_give_the_outcome_and_the_served_fallback_takes_the_load() -> None:
    app = app_of()
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "job"}]}).encode()
    served = struct_pb2.Struct()
    done = asyncio.Event()
    picker = Picker(app, fallbacks=1)
    first = Stream(picker, [headers_message(body=body), *body_messages(body)])
    primary, fallback = destination((await first.run())[0])[0].split(",")
    served.update({"x-gateway-destination-endpoint-served": fallback})
    response_headers = ext_proc.ProcessingRequest(response_headers=ext_proc.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=":status",
                                                                 raw_value=b"200")])))
    response_headers.metadata_context.filter_metadata["envoy.lb"].CopyFrom(served)
    second = Stream(picker, [headers_message(body=body), *body_messages(body), response_headers],
                    hold=done)
    task = asyncio.ensure_future(second.run())
    await asyncio.wait_for(second.handled.wait(), 5)
    by_address = {address_of(name): count for name, count in app.book.count.items()}
    assert by_address[fallback] == 1 and by_address[primary] == 0
    done.set()
    await asyncio.wait_for(task, 5)
    assert second.responses[-1].response_headers == ext_proc.HeadersResponse()
    assert app.metrics.requests.labels("other", "batching", "ok")._value.get() == 1


async def test_a_full_duplex_response_body_is_handed_back_as_it_came() -> None:
    app = app_of()
    message = headers_message(body=None)
    message.protocol_config.response_body_mode = Mode_.FULL_DUPLEX_STREAMED
    event = ext_proc.ProcessingRequest(response_body=ext_proc.HttpBody(
        body=b"data: {}\n\n", end_of_stream=True))
    *_, echoed = await exchange(app, message, event)
    assert echoed.response_body.response.body_mutation.streamed_response.body == b"data: {}\n\n"
    assert echoed.response_body.response.body_mutation.streamed_response.end_of_stream


# --- at zero: the HTTP router's hold queue, within the exchange --------------------------------


def held_app(**settings: Any) -> tuple[RouterApp, FixedDiscovery]:
    """No replica, holding."""
    pool = FixedDiscovery()
    return app_of(pool, hold_queue_size=settings.pop("hold_queue_size", 4), **settings), pool


def from_client(message: Any, address: str) -> Any:
    """`message` with the `source.address` attribute Envoy sends when asked to."""
    attributes = struct_pb2.Struct()
    attributes.update({"source.address": address})
    message.attributes["envoy.filters.http.ext_proc"].CopyFrom(attributes)
    return message


async def held_stream(app: RouterApp, message: Any | None = None
                      ) -> tuple[Stream, asyncio.Task[Any]]:  # fmt: skip
    """A streamed chat's exchange, held: the picker has asked Envoy for more time."""
    before = len(app.hold)
    stream = Stream(Picker(app), [message or headers_message(), *body_messages(STREAMED_CHAT)],
                    hold=asyncio.Event())
    task = asyncio.ensure_future(stream.run())
    async with asyncio.timeout(5):
        while len(app.hold) == before and not task.done():
            await asyncio.sleep(0.01)
    assert not task.done(), stream.responses
    return stream, task


def counted(app: RouterApp, outcome: str) -> float:
    return float(app.metrics.requests.labels("streamed_chat", "none", outcome)._value.get())


@pytest.mark.parametrize("mode", [Mode_.FULL_DUPLEX_STREAMED, Mode_.BUFFERED])
async def test_a_request_at_zero_is_held_then_sent_to_the_replica_that_comes_up(
    mode: int
) -> None:
    app, pool = held_app(hold_seconds=30)
    stream, task = await held_stream(app, headers_message(mode=mode))
    asked, *_ = [r for r in stream.responses if r.HasField("override_message_timeout")]
    # Envoy is asked to wait out the hold and its margin for the pending message.
    assert asked.override_message_timeout.ToTimedelta().total_seconds() == 35
    assert asked.WhichOneof("response") is None
    assert len(app.hold) == 1 and app.metrics.held._value.get() == 1
    assert app.demand.inflight == 0  # not in flight while held
    assert app.buffered_body_bytes == 2 * len(STREAMED_CHAT)  # its body is kept meanwhile
    await asyncio.sleep(0.2)
    pool.listed.append(Endpoint(STREAMING, Mode.STREAMING, ready=True))
    while not any(destination_or_none(r) for r in stream.responses if r.WhichOneof("response")):
        assert not task.done()
        await asyncio.sleep(0.01)
    routed = next(r for r in stream.responses
                  if r.WhichOneof("response") and destination_or_none(r))
    assert destination(routed)[0] == "10.0.0.1:8000"
    if mode == Mode_.FULL_DUPLEX_STREAMED:
        echoed = stream.responses[-1].request_body.response.body_mutation.streamed_response
        assert echoed.body == STREAMED_CHAT and echoed.end_of_stream
    assert len(app.hold) == 0 and app.metrics.held._value.get() == 0
    assert app.demand.inflight == 1 and app.book.count[STREAMING] == 1
    assert app.buffered_body_bytes == 0
    assert stream.hold is not None
    stream.hold.set()
    await asyncio.wait_for(task, 5)
    assert app.demand.inflight == 0 and app.inflight == 0
    assert app.metrics.hold_seconds._sum.get() >= 0.2
    assert app.demand.report([]).last_wait is not None  # the wait is reported


async def test_a_hold_past_its_bound_gets_the_http_routers_503() -> None:
    app, _ = held_app(hold_seconds=0.2)
    status, head, body = await http_answer(app, "POST", CHAT, {}, STREAMED_CHAT)
    *_, answered = await exchange(app, headers_message(), *body_messages(STREAMED_CHAT))
    picker_status, picker_head, picker_body = immediate(answered)
    assert picker_status == status == 503
    assert picker_head["retry-after"] == head["retry-after"] == "10"
    message, http_message = (json.loads(b)["error"]["message"] for b in (picker_body, body))
    assert message.startswith("No replica could take the request within 0.2")
    assert message.split(" within")[0] == http_message.split(" within")[0]
    assert float(picker_head["x-autoglm-held-seconds"]) >= 0.2
    assert app.metrics.hold_overflows.labels("timeout")._value.get() == 2
    assert counted(app, "refused") == 2  # once per front
    assert len(app.hold) == 0 and app.inflight == 0 and app.buffered_body_bytes == 0


async def test_a_full_queue_and_a_clients_full_share_get_the_http_routers_503s() -> None:
    app, _ = held_app(hold_queue_size=2, hold_per_client=1)
    _, first_task = await held_stream(app, from_client(headers_message(), "10.1.0.1:4000"))
    # The same client again, from another port: its share is taken.
    (refused,) = [r for r in await exchange(
        app, from_client(headers_message(), "10.1.0.1:4001"), *body_messages(STREAMED_CHAT))
        if r.WhichOneof("response")]
    assert immediate(refused)[:3:2] == (503, answers.hold_client_full("rid-1").body)
    # Another client is held beside it; then the queue is full for anyone.
    _, other_task = await held_stream(app, from_client(headers_message(), "[fd00::2]:80"))
    assert len(app.hold) == 2
    (full,) = [r for r in await exchange(
        app, from_client(headers_message(), "10.1.0.3:4000"), *body_messages(STREAMED_CHAT))
        if r.WhichOneof("response")]
    status, head, body = immediate(full)
    assert (status, body) == (503, answers.hold_full("rid-1").body)
    assert head["retry-after"] == "10" and head["x-autoglm-held-seconds"] == "0.000"
    for task in (first_task, other_task):
        task.cancel()
    await asyncio.gather(first_task, other_task, return_exceptions=True)
    assert len(app.hold) == 0


async def test_a_gateway_that_names_no_client_holds_as_one_client() -> None:
    app, _ = held_app(hold_queue_size=8, hold_per_client=1)
    _, task = await held_stream(app)
    (refused,) = [r for r in await exchange(app, headers_message(),
                                            *body_messages(STREAMED_CHAT))
                  if r.WhichOneof("response")]
    assert immediate(refused)[2] == answers.hold_client_full("rid-1").body
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_client_that_leaves_while_held_leaves_the_queue() -> None:
    app, _ = held_app(hold_seconds=30)
    _, task = await held_stream(app)
    task.cancel()  # the gateway closed the stream
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(app.hold) == 0 and app.metrics.held._value.get() == 0
    assert app.inflight == 0 and app.buffered_body_bytes == 0 and app.demand.inflight == 0
    assert counted(app, "client_gone") == 1
    assert app.demand.report(app.hold.arrivals()).holding == 0


async def test_the_model_list_at_zero_is_the_routers_own_and_holds_nothing() -> None:
    app, _ = held_app(served_model_names=("autoglm-phone-9b",))
    status, _, body = await http_answer(app, "GET", "/v1/models", {}, b"")
    (response,) = await exchange(app, headers_message("/v1/models", "GET", body=None))
    assert immediate(response)[0] == status == 200
    assert immediate(response)[2] == body
    assert [m["id"] for m in json.loads(body)["data"]] == ["autoglm-phone-9b"]
    assert response.immediate_response.details == "autoglm_picker_models_at_zero"
    assert len(app.hold) == 0 and app.metrics.hold_seconds._sum.get() == 0
    # Without the names, as the HTTP router: 503 at once, never held (not inference).
    unnamed, _ = held_app()
    (refused,) = await exchange(unnamed, headers_message("/v1/models", "GET", body=None))
    assert immediate(refused)[0] == 503


async def test_a_subset_hint_with_none_eligible_is_503_at_once_as_the_protocol_says() -> None:
    app, _ = held_app()
    (refused,) = await exchange(app, headers_message(subset=[]), *body_messages(STREAMED_CHAT))
    assert immediate(refused)[0] == 503 and len(app.hold) == 0


async def test_without_a_hold_queue_no_replica_is_503_at_once() -> None:
    app = app_of(FixedDiscovery())
    responses = await exchange(app, headers_message(), *body_messages(STREAMED_CHAT))
    assert [r.WhichOneof("response") for r in responses] == ["immediate_response"]


@pytest.mark.parametrize(("address", "host"), [
    ("10.0.0.7:51234", "10.0.0.7"), ("[fd00::7]:443", "fd00::7"), ("10.0.0.7", "10.0.0.7"),
    ("fd00::7", "fd00::7"),
])
def test_the_client_is_the_gateways_source_address_without_its_port(address: str,
                                                                     host: str) -> None:
    assert host_of(address) == host


# --- health -----------------------------------------------------------------------------------


class Context:
    async def abort(self, code: Any, details: str) -> None:
        raise LookupError(code, details)


async def test_health_is_ready_with_a_replica_and_not_while_draining() -> None:
    app = app_of()
    health = Health(app)

    async def status(service: str) -> int:
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service), Context())
        return int(reply.status)

    serving, not_serving = (health_pb2.HealthCheckResponse.SERVING,
                            health_pb2.HealthCheckResponse.NOT_SERVING)
    assert await status(EXT_PROC_SERVICE) == serving
    assert await status("readiness") == serving and await status("") == serving
    app.draining = True
    assert await status(EXT_PROC_SERVICE) == not_serving
    assert await status("liveness") == serving
    app.draining = False
    assert await status(EXT_PROC_SERVICE) == serving
    assert await status("") == serving
    none = Health(app_of(FixedDiscovery()))
    reply = await none.Check(health_pb2.HealthCheckRequest(service="readiness"), Context())
    assert reply.status == not_serving
    # Holding, a picker with no replica takes requests: it holds them until one is up.
    holding = Health(app_of(FixedDiscovery(), hold_queue_size=4))
    reply = await holding.Check(health_pb2.HealthCheckRequest(service=EXT_PROC_SERVICE),
                                Context())
    assert reply.status == serving
    with pytest.raises(LookupError):
        await health.Check(health_pb2.HealthCheckRequest(service="other"), Context())


def test_features_are_read_from_the_body_for_the_picker_as_for_the_http_router() -> None:
    app = app_of()
    features = app.features_of("POST", CHAT, STREAMED_CHAT, {})
    assert features.traffic_class is TrafficClass.STREAMED_CHAT
    assert features.key_kind is KeyKind.CONVERSATION
    assert isinstance(features, RequestFeatures)
    assert app.features_of("GET", "/v1/models", b"", {}) is NEUTRAL
