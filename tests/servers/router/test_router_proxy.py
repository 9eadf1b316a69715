"""The data path against scripted replicas: headers, body, limits, retries, backpressure."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fake_replica import FLOOD_CHUNK, FakeReplica
from router_kit import RouterProcess, StartRouter, metric

from autoglm_api.profiles import Mode
from autoglm_router.discovery import Endpoint, StaticDiscovery
from autoglm_router.proxy import ProxySettings, RouterApp
from autoglm_router.routing import RoutingConfig
from testkit.waiting import eventually, eventually_async

pytestmark = pytest.mark.timeout(60)
CHAT = "/v1/chat/completions"


@pytest.fixture
def fakes() -> Iterator[list[FakeReplica]]:
    replicas = [FakeReplica().start(), FakeReplica().start()]
    yield replicas
    for replica in replicas:
        replica.stop()


def post(router: RouterProcess, body: bytes | dict[str, object] | None = None,
         **kwargs: object) -> httpx.Response:
    if isinstance(body, dict) or body is None:
        body_kw: dict[str, object] = {"json": body or {"messages": [], "session_id": "s"}}
    else:
        body_kw = {"content": body}
    return httpx.post(router.base_url + CHAT, timeout=10, **body_kw, **kwargs)  # type: ignore[arg-type]


def test_the_routers_own_request_id_travels_both_ways_and_hop_by_hop_headers_stop(
    start_router: StartRouter, fakes: list[FakeReplica]
) -> None:
    router = start_router([fakes[0].base_url])
    reply = post(router, headers={"X-Request-Id": "req-1", "Connection": "keep-alive, x-drop",
                                  "X-Drop": "1", "Keep-Alive": "timeout=5", "X-Keep": "1",
                                  "TE": "trailers"})
    # A client's id would become vLLM's request id: the router always sets its own.
    assert reply.status_code == 200
    assert re.fullmatch(r"[0-9a-f]{32}", reply.headers["x-request-id"])
    seen = fakes[0].seen[-1].headers
    assert seen["x-request-id"] == reply.headers["x-request-id"] and seen["x-keep"] == "1"
    assert not {"x-drop", "keep-alive", "te"} & set(seen)
    assert seen["x-forwarded-for"] == "127.0.0.1"


def test_the_body_is_forwarded_byte_for_byte(
    start_router: StartRouter, fakes: list[FakeReplica]
) -> None:
    router = start_router([fakes[0].base_url])
    body = b'{ "session_id" : "a",\n "messages":[{"role":"user","content":"\\u00e9t\\u00e9"}] }'
    assert post(router, body, headers={"content-type": "application/json"}).status_code == 200
    assert fakes[0].seen[-1].body == body
    broken = b'{"messages": [oops'
    assert post(router, broken).status_code == 200  # the replica judges what is not JSON
    assert fakes[0].seen[-1].body == broken


def test_a_body_over_the_limit_gets_413_and_reaches_no_replica(
    start_router: StartRouter, fakes: list[FakeReplica]
) -> None:
    router = start_router([fakes[0].base_url], "--max-body-bytes", "2048")
    reply = post(router, b"x" * 4096)
    assert reply.status_code == 413 and "2048" in reply.json()["error"]["message"]
    assert fakes[0].seen == []


def test_a_429_goes_elsewhere_only_when_another_replica_has_room(
    start_router: StartRouter, fakes: list[FakeReplica]
) -> None:
    full, free = fakes
    full.behavior = "queue_full"
    router = start_router([full.base_url, free.base_url])
    replies = [post(router, {"messages": [], "session_id": f"s{i}"}) for i in range(12)]
    assert [r.status_code for r in replies] == [200] * 12
    assert metric(router.ops_url, "autoglm_router_retries_total", reason="queue_full") == len(
        full.seen) > 0
    free.behavior = "queue_full"
    reply = post(router)
    assert reply.status_code == 429 and reply.headers["retry-after"] == "7"
    # Each request counted once, retried or not: the operator reads this counter as demand.
    assert metric(router.ops_url, "autoglm_router_requests_total") == 13


def load_read(replica: FakeReplica, since: int) -> None:
    """Wait until the router has read `replica`'s load as it is now: read `since`+1 began
    after the change (the test changed it, then noted `since`), and the router's next read
    starts only once the poll that made it has finished."""
    eventually(lambda: replica.metrics_reads >= since + 2, 5, every=0.02,
               what=f"the router reading {replica.base_url}'s load after read {since}")


def taking(router: RouterProcess) -> dict[str, int]:
    """The replicas the router takes as taking requests, by mode."""
    return httpx.get(router.ops_url + "/health", timeout=5).json()["replicas"]


def test_requests_avoid_a_replica_that_other_routers_keep_busy(
    start_router: StartRouter, fakes: list[FakeReplica]
) -> None:
    """This router has nothing open, but the first replica says it holds 6 requests (another
    router's): with the bound at 1.25 x the mean, every session goes to the second."""
    fakes[0].held = 6
    router = start_router([f.base_url for f in fakes], "--poll-interval", "0.2")
    load_read(fakes[0], since=0)
    # Both are taking requests: the first is avoided for its load, not left out.
    assert taking(router) == {"streaming": 0, "batching": 2, "unknown": 0}
    for i in range(20):
        assert post(router, {"messages": [], "session_id": f"s{i}"}).status_code == 200
    assert (len(fakes[0].seen), len(fakes[1].seen)) == (0, 20)


def test_sleeping_replicas_get_requests_only_when_none_is_awake_and_then_one_of_them(
    start_router: StartRouter, fakes: list[FakeReplica]
) -> None:
    """A request wakes the replica it reaches: while one is awake the sleeping one gets none;
    with both asleep every request goes to the same one (the first by address), waking one."""
    awake, sleeping = fakes
    sleeping.asleep = True
    router = start_router([f.base_url for f in fakes], "--poll-interval", "0.2")
    load_read(sleeping, since=0)
    for i in range(10):
        assert post(router, {"messages": [], "session_id": f"s{i}"}).status_code == 200
    assert (len(awake.seen), len(sleeping.seen)) == (10, 0)
    awake.asleep = True
    load_read(awake, since=awake.metrics_reads)
    for i in range(10):
        assert post(router, {"messages": [], "session_id": f"t{i}"}).status_code == 200
    first = min(fakes, key=lambda f: f.base_url)
    assert len(first.seen) == 10 + (10 if first is awake else 0)
    assert metric(router.ops_url, "autoglm_router_decisions_total", reason="waking") == 10


def test_a_conversation_stays_where_its_first_turn_was_placed(
    start_router: StartRouter, fakes: list[FakeReplica]
) -> None:
    """Rule 2: first turns avoid the replica other routers keep busy; once it is idle again
    the ring would send about half of them there, but each conversation's later turn goes
    where its cache is."""
    fakes[0].held = 6
    router = start_router([f.base_url for f in fakes], "--poll-interval", "0.2")
    load_read(fakes[0], since=0)
    firsts = [{"messages": [{"role": "user", "content": "open settings"}], "session_id": f"s{i}"}
              for i in range(20)]  # fmt: skip
    for body in firsts:
        assert post(router, body).status_code == 200
    assert (len(fakes[0].seen), len(fakes[1].seen)) == (0, 20)
    fakes[0].held = 0
    load_read(fakes[0], since=fakes[0].metrics_reads)
    for body in firsts:
        history = [*body["messages"], {"role": "assistant", "content": "Launch(settings)"},
                   {"role": "user", "content": "next"}]  # type: ignore[misc]
        assert post(router, {**body, "messages": history}).status_code == 200
    assert (len(fakes[0].seen), len(fakes[1].seen)) == (0, 40)
    assert metric(router.ops_url, "autoglm_router_session_placements_total",
                  placement="hit") == 20  # fmt: skip
    # The first replica is idle again in the router's view: new conversations go there too.
    for i in range(20, 40):
        assert post(router, {**firsts[0], "session_id": f"s{i}"}).status_code == 200
    assert len(fakes[0].seen) > 0


def test_nothing_is_retried_after_the_first_byte(
    start_router: StartRouter, fakes: list[FakeReplica]
) -> None:
    cutting, healthy = fakes
    cutting.mode, cutting.behavior = "streaming", "cut"
    router = start_router([cutting.base_url, healthy.base_url])
    with pytest.raises(httpx.RemoteProtocolError), httpx.stream(
        "POST", router.base_url + CHAT, json={"messages": [], "stream": True}, timeout=10
    ) as response:
        assert response.status_code == 200
        for _ in response.iter_bytes():
            pass
    assert len(cutting.seen) == 1 and healthy.seen == []
    assert metric(router.ops_url, "autoglm_router_requests_total", outcome="aborted") == 1


def test_a_connect_error_is_retried_once_on_another_replica(
    start_router: StartRouter, fakes: list[FakeReplica]
) -> None:
    dying, healthy = fakes
    router = start_router([dying.base_url, healthy.base_url], "--poll-interval", "30")
    dying.stop()  # the router still believes it ready: only the data path can find out
    replies = [post(router, {"messages": [], "session_id": f"s{i}"}) for i in range(8)]
    assert [r.status_code for r in replies] == [200] * 8
    assert len(healthy.seen) == 8
    assert metric(router.ops_url, "autoglm_router_retries_total", reason="connect_error") >= 1


def rss_bytes(router: RouterProcess) -> int:
    assert router.process is not None
    status = Path(f"/proc/{router.process.pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]


def _stalled(flood: FakeReplica) -> int | None:
    """What the flooding replica has sent, once it has sent some and then nothing more for
    0.5 s (None until then)."""
    sent = flood.flood_sent
    time.sleep(0.5)
    return sent if 0 < sent == flood.flood_sent else None


def test_a_slow_client_does_not_make_the_router_buffer(
    start_router: StartRouter, fakes: list[FakeReplica]
) -> None:
    flood = fakes[0]
    flood.behavior = "flood"
    router = start_router([flood.base_url])
    total = flood.flood_chunks * len(FLOOD_CHUNK)
    with httpx.stream("POST", router.base_url + CHAT, json={"messages": []},
                      timeout=30) as response:
        # Read nothing: once the socket buffers on the way are full the replica stalls, and
        # nothing in the router grows.
        stalled_at = eventually(lambda: _stalled(flood), 10, every=0.05,
                                what="the flooding replica sending, then stalled")
        # Time is the behaviour here: a client that reads nothing holds the replica still.
        time.sleep(1.0)
        assert flood.flood_sent == stalled_at < total
        assert rss_bytes(router) < 150 * 2**20
        received = sum(len(chunk) for chunk in response.iter_raw())
    assert received == total


def test_a_silent_replica_gets_the_client_a_504_after_the_idle_timeout(
    start_router: StartRouter, fakes: list[FakeReplica]
) -> None:
    fakes[0].behavior = "silent"
    router = start_router([fakes[0].base_url], "--idle-timeout", "0.5")
    started = time.monotonic()
    reply = post(router)
    assert reply.status_code == 504 and time.monotonic() - started < 2.5
    assert "did not answer in time" in reply.json()["error"]["message"]


def test_a_stream_over_the_stream_timeout_is_cut(
    start_router: StartRouter, fakes: list[FakeReplica]
) -> None:
    fakes[0].behavior = "slow_stream"  # 3 s in all, never silent for 0.5 s
    router = start_router([fakes[0].base_url], "--idle-timeout", "0.5",
                          "--stream-timeout", "1")
    events = 0
    with pytest.raises(httpx.RemoteProtocolError), httpx.stream(
        "POST", router.base_url + CHAT, json={"messages": []}, timeout=10
    ) as response:
        for line in response.iter_lines():
            events += line.startswith("data:")
    assert 3 <= events < 30
    assert metric(router.ops_url, "autoglm_router_requests_total", outcome="aborted") == 1


class _ListedReplicas:
    """A discovery that scrapes nothing (as the pod watch): the load needs its own poll."""

    def __init__(self, replicas: list[FakeReplica]) -> None:
        self._endpoints = [Endpoint(r.base_url, Mode.BATCHING, ready=True) for r in replicas]

    def endpoints(self) -> list[Endpoint]:
        return self._endpoints

    def report_unreachable(self, name: str) -> None:
        pass

    def report_draining(self, name: str) -> None:
        pass

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


async def test_one_metrics_scrape_per_replica_per_poll_gives_mode_load_and_sleep(
    fakes: list[FakeReplica],
) -> None:
    """With --endpoint, the poll that reads each replica's mode from /metrics also reads the
    other routers' requests and the engine's sleep from it: one /metrics request per replica
    per poll, not two."""
    busy, idle = fakes
    busy.held = 6
    idle.asleep = True
    discovery = StaticDiscovery([f.base_url for f in fakes], interval=0.1)
    app = RouterApp(discovery, RoutingConfig(), ProxySettings(load_poll_interval=0.1))
    await app.start()
    await eventually_async(lambda: discovery.polls >= 3, 5, every=0.02,
                           what="three polls of the replicas")
    await app.stop()
    polls = discovery.polls
    assert polls >= 3
    for fake in fakes:  # one more at most: a scrape answered as the poll was cancelled
        assert polls <= fake.metrics_reads <= polls + 1
    assert {e.mode for e in discovery.endpoints()} == {Mode.BATCHING}
    assert (app.others.of(busy.base_url), app.others.of(idle.base_url)) == (6.0, 0.0)
    assert [r.asleep for r in app.pool()] == [False, True]


async def test_a_discovery_that_scrapes_nothing_still_gets_the_load_and_sleep_polled(
    fakes: list[FakeReplica],
) -> None:
    busy, idle = fakes
    busy.held = 6
    idle.asleep = True
    app = RouterApp(_ListedReplicas(fakes), RoutingConfig(), ProxySettings(load_poll_interval=0.1))
    await app.start()
    await eventually_async(lambda: busy.metrics_reads >= 2, 5, every=0.02,
                           what="two reads of the busy replica's load")
    await app.stop()
    assert app.others.of(busy.base_url) == 6.0 and busy.metrics_reads >= 2
    assert [r.asleep for r in app.pool()] == [False, True]
