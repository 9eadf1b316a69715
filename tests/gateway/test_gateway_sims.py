"""Real Envoy, shaped like a Gateway API Inference Extension gateway, in front of our picker and
`testkit.sim` replicas on loopback, driven by the clients users run."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from gateway_kit import ADMIN_TOKEN, MODEL, StartGateway, StartSim, address, client
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI

from autoglm_api.profiles import DRAIN_PATH
from testkit.admin import set_mode
from testkit.gateway import Gateway
from testkit.probe import NoSample, metric
from testkit.processes import SimProcess
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(120)
# Requests a drain test's load serves after the drain before it stops: about what 2 s of it
# serves on a 2-core machine (over 100 a second).
SERVED_AFTER_DRAIN = 200
SCREENSHOT = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42"
              "mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


def admitted(sim: SimProcess) -> float:
    return metric(sim.base_url, "autoglm_requests_admitted_total")


def inflight(gateway: Gateway) -> float:
    return metric(gateway.picker.ops_url, "autoglm_router_inflight")


def healthy(ops_url: str) -> bool:
    try:
        return httpx.get(ops_url + "/health", timeout=2).status_code == 200
    except httpx.TransportError:  # gone altogether
        return False


def chat_messages(text: str) -> Any:
    return [{"role": "system", "content": "You operate an Android phone."},
            {"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": SCREENSHOT}}]}]


def streamed_text(client: openai.OpenAI, text: str, max_tokens: int = 8, **extra: Any) -> str:
    stream = client.chat.completions.create(model=MODEL, messages=chat_messages(text),
                                            stream=True, max_tokens=max_tokens, **extra)
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


def data_events(lines: Iterator[str], count: int) -> list[str]:
    """The next `count` `data: {...}` events of a stream's lines (fewer if it ends first)."""
    events: list[str] = []
    for line in lines:
        if line.startswith("data: {"):
            events.append(line)
            if len(events) == count:
                break
    return events


@pytest.fixture(scope="module")
def replicas(start_sim: StartSim) -> tuple[SimProcess, SimProcess, SimProcess]:
    """One streaming replica and two batching ones."""
    return start_sim("streaming"), start_sim("batching"), start_sim("batching")


@pytest.fixture(scope="module")
def slow(start_sim: StartSim) -> SimProcess:
    """A streaming replica at real time, for streams long enough to act on mid-way."""
    return start_sim("streaming", "--time-factor", "1")


@pytest.fixture(scope="module", params=["FULL_DUPLEX_STREAMED", "BUFFERED"])
def gateway(request: pytest.FixtureRequest, gateways: StartGateway,
            replicas: tuple[SimProcess, ...]) -> Gateway:
    """Envoy Gateway's shape: ORIGINAL_DST routed by the picker's header."""
    return gateways(list(replicas), shape="original_dst", request_body_mode=request.param)


def test_streamed_chats_reach_streaming_and_the_rest_batching(
    gateway: Gateway, replicas: tuple[SimProcess, SimProcess, SimProcess]
) -> None:
    streaming, *batching = replicas
    before = admitted(streaming), sum(admitted(b) for b in batching)
    c = client(gateway)
    assert MODEL in [m.id for m in c.models.list()]
    for i in range(3):
        assert streamed_text(c, f"task {i}")
    for i in range(3):
        reply = c.chat.completions.create(model=MODEL, messages=chat_messages(f"job {i}"),
                                          max_tokens=8)
        assert reply.choices[0].message.content
    assert c.completions.create(model=MODEL, prompt="Describe the screen", max_tokens=4)
    assert admitted(streaming) - before[0] == 3
    assert sum(admitted(b) for b in batching) - before[1] == 4
    ops = gateway.picker.ops_url
    eventually(lambda: metric(ops, "autoglm_router_requests_total", traffic_class="other",
                              mode="batching", outcome="routed") >= 4, 2, every=0.05,
               what="the picker counting 4 batch requests routed",
               ignoring=(NoSample,))  # no sample until the first is counted
    assert metric(ops, "autoglm_router_requests_total", traffic_class="streamed_chat",
                  mode="streaming", outcome="routed") >= 3


def test_the_langchain_call_of_the_reference_deployment_works_through_the_gateway(
    gateway: Gateway, replicas: tuple[SimProcess, SimProcess, SimProcess]
) -> None:
    streaming = replicas[0]
    before = admitted(streaming)
    llm = ChatOpenAI(model=MODEL, base_url=gateway.base_url + "/v1", api_key="EMPTY",
                     streaming=True, max_retries=0,
                     extra_body={"enable_thinking": True, "return_reasoning": True})
    chunks = list(llm.stream([HumanMessage(content="Open the settings app")]))
    assert len(chunks) > 1 and "".join(str(c.content) for c in chunks)
    assert admitted(streaming) == before + 1


def test_sessions_stick_to_their_replica(
    gateway: Gateway, replicas: tuple[SimProcess, SimProcess, SimProcess]
) -> None:
    _, *batching = replicas
    ops = gateway.picker.ops_url
    before = {p: metric(ops, "autoglm_router_session_placements_total", placement=p)
              for p in ("new", "hit", "moved")}
    per_replica = [admitted(b) for b in batching]
    c = client(gateway)
    for i in range(16):
        history = chat_messages(f"session task {i}")
        for turn in range(3):
            extra = ({"extra_body": {"session_id": f"task-{i}"}} if turn % 2 == 0
                     else {"extra_headers": {"X-Session-ID": f"task-{i}"}})
            reply = c.chat.completions.create(model=MODEL, messages=history, max_tokens=6,
                                              **extra)
            history = [*history, {"role": "assistant",
                                  "content": reply.choices[0].message.content},
                       {"role": "user", "content": f"turn {turn}"}]
    after = {p: metric(ops, "autoglm_router_session_placements_total", placement=p)
             for p in ("new", "hit", "moved")}
    assert after["new"] - before["new"] == 16
    assert after["hit"] - before["hit"] == 32
    assert after["moved"] == before["moved"]
    assert all(admitted(b) > n for b, n in zip(batching, per_replica, strict=True))


def test_a_flip_is_seen_at_the_next_poll_and_routing_follows(
    gateway: Gateway, replicas: tuple[SimProcess, SimProcess, SimProcess]
) -> None:
    streaming, batching, other = replicas
    c = client(gateway)
    try:
        set_mode(streaming.admin_url, ADMIN_TOKEN, "batching")
        set_mode(batching.admin_url, ADMIN_TOKEN, "streaming")
        started = time.monotonic()
        eventually(lambda: _streamed_chat_lands_on(gateway, batching), 2.5, every=0.05,
                   what="a streamed chat landing on the flipped replica")
        took = time.monotonic() - started
        print(f"flip seen through the gateway after {took:.2f} s (poll interval 0.2 s)")
        before = admitted(batching), admitted(streaming) + admitted(other)
        for i in range(3):
            assert streamed_text(c, f"flipped {i}", max_tokens=4)
        assert admitted(batching) - before[0] == 3
        assert admitted(streaming) + admitted(other) == before[1]
    finally:
        set_mode(streaming.admin_url, ADMIN_TOKEN, "streaming")
        set_mode(batching.admin_url, ADMIN_TOKEN, "batching")
        eventually(lambda: _streamed_chat_lands_on(gateway, streaming), 2.5, every=0.05,
                   what="a streamed chat landing on the streaming replica again")


def _chat_lands_on(c: openai.OpenAI, sim: SimProcess) -> bool:
    before = admitted(sim)
    assert c.chat.completions.create(model=MODEL, max_tokens=4, messages=chat_messages("probe"))
    return admitted(sim) == before + 1


def picker_sees(gateway: Gateway) -> dict[str, int]:
    """The replicas the picker takes as taking requests, by mode."""
    return httpx.get(gateway.picker.ops_url + "/health", timeout=5).json()["replicas"]


def _streamed_chat_lands_on(gateway: Gateway, sim: SimProcess) -> bool:
    before = admitted(sim)
    reply = httpx.post(gateway.base_url + "/v1/chat/completions", timeout=10, json={
        "model": MODEL, "messages": [{"role": "user", "content": "probe"}], "stream": True,
        "max_tokens": 1})
    return reply.status_code == 200 and admitted(sim) == before + 1


async def test_concurrent_mixed_traffic_all_succeeds_and_leaves_nothing_in_flight(
    gateway: Gateway, replicas: tuple[SimProcess, SimProcess, SimProcess]
) -> None:
    c = openai.AsyncOpenAI(base_url=gateway.base_url + "/v1", api_key="EMPTY", max_retries=0,
                           timeout=60)

    async def one(i: int) -> str:
        extra = {"session_id": f"mixed-{i % 10}"} if i % 3 else {}
        if i % 2:
            stream = await c.chat.completions.create(
                model=MODEL, messages=chat_messages(f"m{i}"), stream=True, max_tokens=16,
                extra_body=extra)
            return "".join([ch.choices[0].delta.content or "" async for ch in stream
                            if ch.choices])
        reply = await c.chat.completions.create(model=MODEL, messages=chat_messages(f"m{i}"),
                                                max_tokens=16, extra_body=extra)
        return reply.choices[0].message.content or ""

    texts = await asyncio.gather(*(one(i) for i in range(60)))
    assert all(texts)
    await c.close()
    eventually(lambda: inflight(gateway) == 0, 3, every=0.05,
               what="nothing in flight at the picker")
    # A sim frees its slot a few loop turns after its last byte, which ends the picker's count.
    eventually(lambda: all(metric(sim.base_url, "autoglm_requests_inflight") == 0
                           for sim in replicas), 3, every=0.05,
               what="nothing in flight at the sims")


def test_a_full_streaming_replica_spills_streamed_chats_to_batching(
    gateways: StartGateway, slow: SimProcess,
    replicas: tuple[SimProcess, SimProcess, SimProcess]
) -> None:
    batching = replicas[1]
    gateway = gateways([slow, batching], "--streaming-chat-cap", "1")
    # Long enough (1500 tokens, about 27 s; the sim would end this prompt at 151 without
    # ignore_eos) that the first stream holds the cap however slow the machine.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "long"}], "stream": True,
            "max_tokens": 1500, "ignore_eos": True}
    with httpx.Client(timeout=30) as http, http.stream(
        "POST", gateway.base_url + "/v1/chat/completions", json=body
    ) as response:
        lines = response.iter_lines()  # kept: dropping the iterator closes the connection
        assert next(lines).startswith("data:")  # the streaming replica is now full
        assert inflight(gateway) == 1
        before = admitted(batching)
        assert streamed_text(client(gateway), "spill", max_tokens=4)
        assert admitted(batching) == before + 1
    assert metric(gateway.picker.ops_url, "autoglm_router_decisions_total",
                  reason="spilled") == 1


def test_every_replica_at_its_cap_sheds_with_the_routers_429(
    gateways: StartGateway, slow: SimProcess
) -> None:
    gateway = gateways([slow], "--streaming-chat-cap", "1")
    # Long enough (1500 tokens, about 27 s; the sim would end this prompt at 151 without
    # ignore_eos) that the first stream holds the cap however slow the machine.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "long"}], "stream": True,
            "max_tokens": 1500, "ignore_eos": True}
    with httpx.Client(timeout=30) as http, http.stream(
        "POST", gateway.base_url + "/v1/chat/completions", json=body
    ) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data:")
        before = admitted(slow)
        with pytest.raises(openai.RateLimitError) as refused:
            streamed_text(client(gateway), "one too many", max_tokens=4)
        assert refused.value.response.headers["retry-after"] == "1"
        assert refused.value.body == {"message": "Every replica is at its concurrency cap; "
                                      "retry later.", "type": "invalid_request_error",
                                      "param": None, "code": 429}
        assert before >= 1  # the held stream counts there: the read below is not of nothing
        assert admitted(slow) == before  # never queued on the replica


@pytest.mark.parametrize("mode", ["FULL_DUPLEX_STREAMED", "BUFFERED"])
def test_a_stream_is_in_flight_until_it_ends(
    gateways: StartGateway, slow: SimProcess, mode: str
) -> None:
    gateway = gateways([slow], request_body_mode=mode)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "long"}], "stream": True,
            "max_tokens": 300}  # about a second at the sim's real-time pace
    with httpx.Client(timeout=30) as http, http.stream(
        "POST", gateway.base_url + "/v1/chat/completions", json=body
    ) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data:")
        assert inflight(gateway) == 1
        # Still counted well into the stream (50 events on), not only at its headers.
        middle = data_events(lines, 50)
        assert inflight(gateway) == 1
        rest = [line for line in lines if line]
    assert len(middle) == 50 and rest[-1] == "data: [DONE]"
    eventually(lambda: inflight(gateway) == 0, 3, every=0.05,
               what="nothing in flight at the picker")


@pytest.mark.parametrize("mode", ["FULL_DUPLEX_STREAMED", "BUFFERED"])
def test_in_flight_returns_to_zero_after_a_client_leaves_mid_stream(
    gateways: StartGateway, slow: SimProcess, mode: str
) -> None:
    gateway = gateways([slow], request_body_mode=mode)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "long"}], "stream": True,
            "max_tokens": 1500, "ignore_eos": True}
    with httpx.Client(timeout=30) as http, http.stream(
        "POST", gateway.base_url + "/v1/chat/completions", json=body
    ) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data:")
        assert inflight(gateway) == 1
        assert metric(slow.base_url, "autoglm_requests_inflight") == 1
    # The client hung up: Envoy resets the upstream stream and closes the picker's.
    eventually(lambda: inflight(gateway) == 0, 3, every=0.05,
               what="nothing in flight at the picker")
    eventually(lambda: metric(slow.base_url, "autoglm_requests_inflight") == 0, 3, every=0.05,
               what="nothing in flight at the slow sim")


def test_a_replica_dying_mid_stream_is_not_retried_and_its_request_ends(
    start_sim: StartSim, gateways: StartGateway
) -> None:
    """Envoy retries before a response starts only: a stream the client has begun reading is
    cut, never sent again to another replica, and the picker's count of it ends."""
    # A streamed chat goes to the one streaming replica; the batching one is its fallback.
    dying, other = start_sim("streaming", "--time-factor", "1"), start_sim("batching")
    gateway = gateways([dying, other], "--ext-proc-fallbacks", "1",
                            shape="override_host")
    before = admitted(dying), admitted(other)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "long"}], "stream": True,
            "max_tokens": 1500, "ignore_eos": True}
    with httpx.Client(timeout=30) as http, http.stream(
        "POST", gateway.base_url + "/v1/chat/completions", json=body
    ) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data:")
        assert (admitted(dying), admitted(other)) == (before[0] + 1, before[1])
        assert dying.process is not None
        dying.process.send_signal(signal.SIGKILL)
        with pytest.raises(httpx.HTTPError):
            for _ in lines:
                pass
    eventually(lambda: inflight(gateway) == 0, 3, every=0.05,
               what="nothing in flight at the picker")
    assert admitted(other) == before[1]
    assert gateway.envoy.stats().get("cluster.pool.upstream_rq_retry", 0) == 0


def test_a_draining_replica_fails_no_client_request(
    start_sim: StartSim, gateways: StartGateway
) -> None:
    """A slow poll leaves the picker naming the draining replica first for seconds: the
    gateway's retry takes the fallback the picker named after it."""
    first, second = start_sim("batching"), start_sim("batching")
    gateway = gateways([first, second], "--poll-interval", "5", "--ext-proc-fallbacks", "1",
                            shape="override_host")
    c = client(gateway)
    failures: list[BaseException] = []
    served = [0]
    stop = threading.Event()

    def load(worker: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                c.chat.completions.create(model=MODEL, max_tokens=4,
                                          messages=chat_messages("drain"),
                                          extra_body={"session_id": f"w{worker}-{i % 8}"})
                served[0] += 1
            except Exception as exc:  # counted, not raised: the test asserts there are none
                failures.append(exc)

    before = admitted(first), admitted(second)
    workers = [threading.Thread(target=load, args=(w,)) for w in range(3)]
    for worker in workers:
        worker.start()
    try:
        # The drained replica was taking its share of the load.
        eventually(lambda: admitted(first) > before[0] and admitted(second) > before[1], 10,
                   every=0.05, what="the load reaching both replicas")
        drained = httpx.post(first.admin_url + DRAIN_PATH, timeout=5,
                             headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert drained.status_code == 202
        at_drain, served_at_drain = admitted(first), served[0]
        # Load goes on through the drain, before the next poll finds it, until the gateway has
        # retried a request the draining replica refused and many more have been served.
        eventually(lambda: gateway.envoy.stats().get("cluster.pool.upstream_rq_retry", 0) >= 1
                   and served[0] >= served_at_drain + SERVED_AFTER_DRAIN, 30, every=0.05,
                   what=f"a retry and {SERVED_AFTER_DRAIN} requests served after the drain")
    finally:
        stop.set()
        for worker in workers:
            worker.join(30)
    assert failures == []
    assert served[0] > 20
    assert admitted(first) <= at_drain + 3  # only requests already on their way
    assert gateway.envoy.stats()["cluster.pool.upstream_rq_retry"] >= 1


def test_a_draining_replica_is_avoided_from_the_next_poll(
    start_sim: StartSim, gateways: StartGateway
) -> None:
    """With one address per request (ORIGINAL_DST) there is no fallback: the poll finds the
    drain, and requests go elsewhere from then on."""
    first, second = start_sim("batching"), start_sim("batching")
    gateway = gateways([first, second], shape="original_dst")
    c = client(gateway)
    # Both replicas take requests until the drain: the one drained gets some.
    eventually(lambda: _chat_lands_on(c, first), 5, every=0.05,
               what="a chat through the gateway landing on the replica to drain")
    drained = httpx.post(first.admin_url + DRAIN_PATH, timeout=5,
                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert drained.status_code == 202
    eventually(lambda: picker_sees(gateway) == {"streaming": 0, "batching": 1, "unknown": 0},
               3, every=0.05, what="the picker's poll finding the drain")
    at_drain = admitted(first)
    for i in range(10):
        assert c.chat.completions.create(model=MODEL, max_tokens=4,
                                         messages=chat_messages(f"after drain {i}"))
    assert admitted(first) == at_drain


@pytest.mark.parametrize("shape", ["original_dst", "override_host"])
def test_the_picker_down_fails_closed_with_503(
    gateways: StartGateway, replicas: tuple[SimProcess, ...], shape: str
) -> None:
    gateway = gateways(list(replicas), shape=shape, fail_open=False)
    gateway.picker.stop()
    before = sum(admitted(r) for r in replicas)
    with pytest.raises(openai.InternalServerError) as failed:
        streamed_text(client(gateway), "picker down")
    assert failed.value.status_code == 503
    assert sum(admitted(r) for r in replicas) == before


def test_the_picker_down_fails_open_to_a_pool_replica(
    gateways: StartGateway, replicas: tuple[SimProcess, ...]
) -> None:
    """FailOpen needs a cluster that knows the pool (Istio's override_host): the request goes to
    one of its endpoints round robin, past every check of the picker. In BUFFERED mode Envoy
    still holds the body when the picker's stream fails (in full duplex it has handed it over,
    and such requests fail: docs/router/gateway.md has the count)."""
    gateway = gateways(list(replicas), shape="override_host", fail_open=True)
    gateway.picker.stop()
    before = sum(admitted(r) for r in replicas)
    assert streamed_text(client(gateway), "picker down")
    assert sum(admitted(r) for r in replicas) == before + 1


def test_fail_open_with_original_dst_has_nowhere_to_send(
    gateways: StartGateway, replicas: tuple[SimProcess, ...]
) -> None:
    """ORIGINAL_DST routes by the picker's header alone: skipped, it has no address, and a
    client's own header is removed before the picker would run."""
    gateway = gateways(list(replicas), shape="original_dst", fail_open=True)
    gateway.picker.stop()
    reply = httpx.post(gateway.base_url + "/v1/chat/completions", timeout=10, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers={"x-gateway-destination-endpoint": address(replicas[0])})
    assert reply.status_code == 503


def test_one_address_is_all_original_dst_reads(
    gateways: StartGateway, replicas: tuple[SimProcess, ...]
) -> None:
    """Why --ext-proc-fallbacks defaults to 0: a list in the header does not parse there."""
    gateway = gateways(list(replicas), "--ext-proc-fallbacks", "1", shape="original_dst")
    reply = httpx.post(gateway.base_url + "/v1/chat/completions", timeout=10, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert reply.status_code == 503 and reply.text == "no healthy upstream"


def test_sigterm_lets_streams_through_the_gateway_finish_and_counts_them_out(
    gateways: StartGateway, slow: SimProcess
) -> None:
    gateway = gateways([slow], "--drain-seconds", "20")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "long"}], "stream": True,
            "max_tokens": 200}
    with httpx.Client(timeout=30) as http, http.stream(
        "POST", gateway.base_url + "/v1/chat/completions", json=body
    ) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data:")
        gateway.picker.terminate()
        # Once the picker has taken the signal (its /health fails while it drains), new
        # requests find it gone: FailClose.
        eventually(lambda: not healthy(gateway.picker.ops_url), 5, every=0.05,
                   what="the picker's /health failing")
        late = httpx.post(gateway.base_url + "/v1/chat/completions", timeout=10, json={
            "model": MODEL, "messages": [{"role": "user", "content": "late"}], "max_tokens": 2})
        rest = [line for line in lines if line]
    assert late.status_code == 503
    assert rest[-1] == "data: [DONE]"
    process = gateway.picker.process
    assert process is not None and process.wait(10) in (0, -signal.SIGTERM)


def test_envoy_health_checks_the_picker(gateway: Gateway) -> None:
    stats = gateway.envoy.stats()
    assert stats["cluster.picker.health_check.success"] >= 1
    assert stats.get("cluster.picker.health_check.failure", 0) == 0


def test_the_gateway_process_is_the_pinned_envoy(gateway: Gateway) -> None:
    version = httpx.get(f"http://127.0.0.1:{gateway.envoy.admin_port}/server_info",
                        timeout=5).json()["version"]
    assert "/1.40.0/" in version
