"""The router in front of `testkit.sim` replicas on loopback, driven by real clients."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from router_kit import (
    ADMIN_TOKEN,
    MODEL,
    RouterProcess,
    StartRouter,
    StartSim,
    admitted,
    metric,
)

from autoglm_api.profiles import DRAIN_PATH
from testkit.admin import set_mode
from testkit.probe import NoSample
from testkit.processes import SimProcess
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(90)
# Requests a drain test's load serves after the drain before it stops: about what 2 s of it
# serves on a 2-core machine (over 100 a second).
SERVED_AFTER_DRAIN = 200
SCREENSHOT = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42"
              "mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


@pytest.fixture(scope="module")
def replicas(start_sim: StartSim) -> tuple[SimProcess, SimProcess, SimProcess]:
    """One streaming replica and two batching ones."""
    return start_sim("streaming"), start_sim("batching"), start_sim("batching")


@pytest.fixture(scope="module")
def slow(start_sim: StartSim) -> SimProcess:
    """A streaming replica at real time, for streams long enough to act on mid-way."""
    return start_sim("streaming", "--time-factor", "1")


@pytest.fixture(scope="module")
def router(start_router: StartRouter, replicas: tuple[SimProcess, ...]) -> RouterProcess:
    return start_router([sim.base_url for sim in replicas])


def clients_gone(router: RouterProcess) -> float:
    """Requests whose client left before their answer ended. Before the first, the outcome has
    no sample (the router counts outcomes as they happen): none is expected, so absent is 0."""
    try:
        return metric(router.ops_url, "autoglm_router_requests_total", outcome="client_gone")
    except NoSample:
        return 0.0


def client(router: RouterProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.base_url + "/v1", api_key="EMPTY", max_retries=0,
                         timeout=30)


def chat_messages(text: str) -> Any:
    return [{"role": "system", "content": "You operate an Android phone."},
            {"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": SCREENSHOT}}]}]


def modes_seen(router: RouterProcess) -> dict[str, int]:
    return httpx.get(router.ops_url + "/health", timeout=5).json()["replicas"]


def test_openai_streamed_chats_reach_streaming_and_the_rest_batching(
    router: RouterProcess, replicas: tuple[SimProcess, SimProcess, SimProcess]
) -> None:
    streaming, *batching = replicas
    before = admitted(streaming), sum(admitted(b) for b in batching)
    c = client(router)
    assert MODEL in [m.id for m in c.models.list()]
    for i in range(3):
        stream = c.chat.completions.create(model=MODEL, messages=chat_messages(f"task {i}"),
                                           stream=True, max_tokens=8)
        assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    for i in range(3):
        reply = c.chat.completions.create(model=MODEL, messages=chat_messages(f"job {i}"),
                                          max_tokens=8)
        assert reply.choices[0].message.content
    assert c.completions.create(model=MODEL, prompt="Describe the screen", max_tokens=4)
    assert admitted(streaming) - before[0] == 3
    assert sum(admitted(b) for b in batching) - before[1] == 4
    # The router counts a request once its response ends, which the client may not wait for.
    eventually(lambda: metric(router.ops_url, "autoglm_router_requests_total",
                              traffic_class="other", mode="batching", outcome="ok") >= 4, 2,
               every=0.05, what="the router counting 4 batch requests served",
               ignoring=(NoSample,))  # no sample until the first is counted
    assert metric(router.ops_url, "autoglm_router_requests_total",
                  traffic_class="streamed_chat", mode="streaming", outcome="ok") >= 3
    assert clients_gone(router) == 0  # the "ok" outcomes above prove the metric's name
    assert metric(router.ops_url, "autoglm_router_upstream_ttft_seconds_count",
                  traffic_class="streamed_chat") >= 3
    assert metric(router.ops_url, "autoglm_router_added_latency_seconds_count",
                  phase="first_byte") >= 7
    assert metric(router.ops_url, "autoglm_router_replicas", mode="batching") == 2
    # Every request keyed (its conversation or prompt head) and placed on the ring.
    ring = [metric(router.ops_url, "autoglm_router_decisions_total", reason=reason)
            for reason in ("hashed", "bounded")]
    assert sum(ring) >= 7, ring


def test_langchain_client_streamed_and_not(
    router: RouterProcess, replicas: tuple[SimProcess, SimProcess, SimProcess]
) -> None:
    streaming, *batching = replicas
    before = admitted(streaming), sum(admitted(b) for b in batching)
    common: dict[str, Any] = {
        "model": MODEL, "base_url": router.base_url + "/v1", "api_key": "EMPTY",
        "max_retries": 0, "extra_body": {"enable_thinking": True, "return_reasoning": True},
    }
    llm = ChatOpenAI(streaming=True, **common)
    reply = llm.invoke([HumanMessage(content="Open the settings app")])
    assert isinstance(reply.content, str) and reply.content
    chunks = list(llm.stream("Turn on dark mode"))
    assert len(chunks) > 1 and "".join(str(c.content) for c in chunks)
    plain = ChatOpenAI(streaming=False, **common).invoke("Open the camera")
    assert isinstance(plain.content, str) and plain.content
    assert admitted(streaming) - before[0] == 2
    assert sum(admitted(b) for b in batching) - before[1] == 1


def test_sessions_stick_to_their_replica(
    router: RouterProcess, replicas: tuple[SimProcess, SimProcess, SimProcess]
) -> None:
    _, *batching = replicas
    before = {p: metric(router.ops_url, "autoglm_router_session_placements_total",
                        placement=p) for p in ("new", "hit", "moved")}
    per_replica = [admitted(b) for b in batching]
    c = client(router)
    for i in range(16):
        history = chat_messages(f"session task {i}")
        for turn in range(3):
            # The body field and the X-Session-ID header name the same session.
            extra = ({"extra_body": {"session_id": f"task-{i}"}} if turn % 2 == 0
                     else {"extra_headers": {"X-Session-ID": f"task-{i}"}})
            reply = c.chat.completions.create(model=MODEL, messages=history, max_tokens=6,
                                              **extra)
            history = [*history, {"role": "assistant",
                                  "content": reply.choices[0].message.content},
                       {"role": "user", "content": f"turn {turn}"}]
    after = {p: metric(router.ops_url, "autoglm_router_session_placements_total",
                       placement=p) for p in ("new", "hit", "moved")}
    assert after["new"] - before["new"] == 16
    assert after["hit"] - before["hit"] == 32
    assert after["moved"] == before["moved"]
    # Both batching replicas hold sessions: the ring spreads them.
    assert all(admitted(b) > n for b, n in zip(batching, per_replica, strict=True))


def test_a_flip_is_seen_within_two_seconds_and_routing_follows(
    router: RouterProcess, replicas: tuple[SimProcess, SimProcess, SimProcess]
) -> None:
    streaming, batching, other = replicas
    try:
        set_mode(streaming.admin_url, ADMIN_TOKEN, "batching")
        set_mode(batching.admin_url, ADMIN_TOKEN, "streaming")
        started = time.monotonic()
        eventually(lambda: _streaming_is(router, batching), 2.5, every=0.05,
                   what="the router routing streamed chats to the flipped replica")
        took = time.monotonic() - started
        print(f"flip seen by the router and routed on after {took:.2f} s")
        before = admitted(batching), admitted(streaming) + admitted(other)
        c = client(router)
        for i in range(3):
            stream = c.chat.completions.create(model=MODEL, messages=chat_messages(f"f {i}"),
                                               stream=True, max_tokens=4)
            assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
        assert admitted(batching) - before[0] == 3
        assert admitted(streaming) + admitted(other) == before[1]
    finally:
        set_mode(streaming.admin_url, ADMIN_TOKEN, "streaming")
        set_mode(batching.admin_url, ADMIN_TOKEN, "batching")
        eventually(lambda: _streaming_is(router, streaming), 2.5, every=0.05,
                   what="the router routing streamed chats to the streaming replica again")


def _streaming_is(router: RouterProcess, sim: SimProcess) -> bool:
    """The router's view: one streaming replica, and a streamed chat lands on `sim`."""
    if modes_seen(router)["streaming"] != 1:
        return False
    before = admitted(sim)
    reply = httpx.post(router.base_url + "/v1/chat/completions", timeout=10, json={
        "model": MODEL, "messages": [{"role": "user", "content": "probe"}], "stream": True,
        "max_tokens": 1})
    return reply.status_code == 200 and admitted(sim) == before + 1


def test_a_full_streaming_replica_spills_streamed_chats_to_batching(
    start_router: StartRouter, slow: SimProcess,
    replicas: tuple[SimProcess, SimProcess, SimProcess]
) -> None:
    batching = replicas[1]
    router = start_router([slow.base_url, batching.base_url], "--streaming-chat-cap", "1")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "long"}], "stream": True,
            "max_tokens": 1500, "ignore_eos": True}
    with httpx.Client(timeout=30) as http, http.stream(
        "POST", router.base_url + "/v1/chat/completions", json=body
    ) as response:
        lines = response.iter_lines()  # kept: dropping the iterator closes the connection
        assert next(lines).startswith("data:")  # the streaming replica is now full
        before = admitted(batching)
        stream = client(router).chat.completions.create(
            model=MODEL, messages=chat_messages("spill"), stream=True, max_tokens=4)
        assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
        assert admitted(batching) == before + 1
    assert metric(router.ops_url, "autoglm_router_decisions_total", reason="spilled") == 1


def test_every_replica_at_its_cap_sheds_with_429(
    start_router: StartRouter, slow: SimProcess
) -> None:
    router = start_router([slow.base_url], "--streaming-chat-cap", "1")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "long"}], "stream": True,
            "max_tokens": 1500, "ignore_eos": True}
    with httpx.Client(timeout=30) as http, http.stream(
        "POST", router.base_url + "/v1/chat/completions", json=body
    ) as response:
        lines = response.iter_lines()  # kept: dropping the iterator closes the connection
        assert next(lines).startswith("data:")  # the only replica is now at its cap
        before = admitted(slow)
        reply = http.post(router.base_url + "/v1/chat/completions", json={**body, "max_tokens": 4})
        assert reply.status_code == 429 and reply.headers["retry-after"] == "1"
        assert before >= 1  # the held stream counts there: the read below is not of nothing
        assert admitted(slow) == before  # refused by the router, never queued on the replica
    assert metric(router.ops_url, "autoglm_router_requests_total", traffic_class="streamed_chat",
                  mode="none", outcome="refused") == 1


def test_client_disconnect_cancels_the_upstream_request(
    start_router: StartRouter, slow: SimProcess
) -> None:
    router = start_router([slow.base_url])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "long"}], "stream": True,
            "max_tokens": 1500, "ignore_eos": True}
    with httpx.Client(timeout=30) as http, http.stream(
        "POST", router.base_url + "/v1/chat/completions", json=body
    ) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data:")
        assert metric(slow.base_url, "autoglm_requests_inflight") == 1
    # The client closed its connection: the router closes the upstream one, the sim stops.
    eventually(lambda: metric(slow.base_url, "autoglm_requests_inflight") == 0, 3, every=0.05,
               what="nothing in flight at the slow sim")
    eventually(lambda: metric(router.ops_url, "autoglm_router_inflight") == 0, 3, every=0.05,
               what="nothing in flight at the router")
    assert metric(router.ops_url, "autoglm_router_requests_total", outcome="client_gone") == 1


def test_sigterm_stops_new_connections_fails_readiness_and_lets_streams_finish(
    start_router: StartRouter, slow: SimProcess
) -> None:
    """The ops port outlives the API port through the drain; its /health (the readiness probe)
    must not pass there, or a pod that takes the address next looks ready before it listens."""
    router = start_router([slow.base_url])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "long"}], "stream": True,
            "max_tokens": 300}
    with httpx.Client(timeout=30) as http, http.stream(
        "POST", router.base_url + "/v1/chat/completions", json=body
    ) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data:")
        router.terminate()
        eventually(lambda: _refuses_connections(router), 3, every=0.05,
                   what="the router refusing connections")
        health = httpx.get(router.health_url, timeout=3)
        rest = [line for line in lines if line]
    assert (health.status_code, health.json()["status"]) == (503, "draining")
    assert rest[-1] == "data: [DONE]"
    assert sum(1 for line in rest if line.startswith("data: {")) > 50
    # uvicorn re-raises the SIGTERM it caught once it has shut down, as a container expects.
    assert router.process is not None and router.process.wait(10) in (0, -signal.SIGTERM)


def test_sigterm_answers_the_next_request_on_a_kept_alive_connection_and_closes_it(
    start_router: StartRouter, replicas: tuple[SimProcess, ...]
) -> None:
    """Closing an idle kept-alive connection on SIGTERM races the request a client may be
    sending on it, which then fails unretried; the router answers it and closes after."""
    router = start_router([r.base_url for r in replicas])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with httpx.Client(timeout=10) as http:
        assert http.post(router.base_url + "/v1/chat/completions", json=body).status_code == 200
        router.terminate()
        eventually(lambda: _refuses_connections(router), 3, every=0.05,
                   what="the router refusing connections")
        # The behaviour is that nothing happens: the drain has begun (no new connection gets
        # in) and the connection answered above is live; a close of it would reach this client
        # within this while, and the request below would meet it.
        time.sleep(0.3)
        late = http.post(router.base_url + "/v1/chat/completions", json=body)
    assert late.status_code == 200
    assert late.headers["connection"] == "close"
    # With no connection left, the drain is over at once.
    assert router.process is not None and router.process.wait(5) in (0, -signal.SIGTERM)


def _refuses_connections(router: RouterProcess) -> bool:
    """No new connection gets an answer: refused, or (one the kernel queued just before the
    listening socket closed) reset before any response byte."""
    try:
        httpx.get(router.base_url + "/v1/models", timeout=1)
    except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
        return True
    return False


def test_a_draining_replica_fails_no_client_request(
    start_sim: StartSim, start_router: StartRouter
) -> None:
    """A slow poll interval makes the data path find the drain: its 503 is retried elsewhere."""
    first, second = start_sim("batching"), start_sim("batching")
    router = start_router([first.base_url, second.base_url], "--poll-interval", "5")
    c = client(router)
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
        # Load goes on through the drain, before the next poll finds it, until the router has
        # retried a request the draining replica refused and many more have been served.
        eventually(lambda: metric(router.ops_url, "autoglm_router_retries_total",
                                  reason="draining") >= 1
                   and served[0] >= served_at_drain + SERVED_AFTER_DRAIN, 30, every=0.05,
                   what=f"a retry and {SERVED_AFTER_DRAIN} requests served after the drain")
    finally:
        stop.set()
        for worker in workers:
            worker.join(30)
    assert failures == []
    assert served[0] > 20
    assert admitted(first) <= at_drain + 3  # only requests already on their way
    assert metric(router.ops_url, "autoglm_router_retries_total", reason="draining") >= 1


async def test_concurrent_mixed_traffic_all_succeeds_and_leaves_nothing_open(
    router: RouterProcess, replicas: tuple[SimProcess, SimProcess, SimProcess]
) -> None:
    c = openai.AsyncOpenAI(base_url=router.base_url + "/v1", api_key="EMPTY", max_retries=0,
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

    gone_before = clients_gone(router)
    texts = await asyncio.gather(*(one(i) for i in range(60)))
    assert all(texts)
    await c.close()
    eventually(lambda: metric(router.ops_url, "autoglm_router_inflight") == 0, 2, every=0.05,
               what="nothing in flight at the router")
    # A sim frees its slot a few loop turns after its last byte, which ends the router's count.
    eventually(lambda: all(metric(sim.base_url, "autoglm_requests_inflight") == 0
                           for sim in replicas), 2, every=0.05,
               what="nothing in flight at the sims")
    # Clients that hang up after `data: [DONE]` finished their request: none counts as gone.
    assert clients_gone(router) == gone_before
    # The same metric counted the 60 served, so its name is right and 0 above means none.
    assert metric(router.ops_url, "autoglm_router_requests_total", outcome="ok") >= 60
