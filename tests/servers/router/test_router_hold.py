"""Holding at zero replicas: the router (a process) holds requests while its replica is not up
yet, then serves them when the replica comes up; past the bound a 503 with Retry-After."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from router_kit import ADMIN_TOKEN, MODEL, RouterProcess, StartRouter, metric

from autoglm_router.answers import HELD_SECONDS, HOLD_RETRY_AFTER_SECONDS
from testkit.processes import SimProcess
from testkit.sims import LaterSim, later_sims
from testkit.waiting import TIME_SCALE, eventually

pytestmark = pytest.mark.timeout(90)
MESSAGES: Any = [{"role": "system", "content": "You operate an Android phone."},
                 {"role": "user", "content": "Open the settings."}]
# The router reads its endpoint's /health this often: a replica that comes up is seen within it.
POLL = ("--poll-interval", "0.2")

@pytest.fixture(scope="module")
def later_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaterSim]:
    """later_sim(mode, *args): a replica that is not up yet (testkit.sims.later_sims)."""
    with later_sims(tmp_path_factory, {"AUTOGLM_ADMIN_TOKEN": ADMIN_TOKEN}) as make:
        yield make


def held(router: RouterProcess) -> float:
    return metric(router.ops_url, "autoglm_router_held_requests")


class StreamedChat(threading.Thread):
    """A streamed chat through the official client, in a thread: its text and held seconds."""

    def __init__(self, router: RouterProcess) -> None:
        super().__init__(daemon=True)
        self.router = router
        self.text = ""
        self.held_seconds: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        client = openai.OpenAI(base_url=self.router.base_url + "/v1", api_key="EMPTY",
                               max_retries=0, timeout=60)
        try:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=MESSAGES, stream=True, max_tokens=8)
            self.held_seconds = float(raw.headers[HELD_SECONDS])
            for chunk in raw.parse():
                if chunk.choices:
                    self.text += chunk.choices[0].delta.content or ""
        except BaseException as exc:  # handed to the test
            self.error = exc

    def result(self, timeout: float = 30.0) -> tuple[str, float]:
        self.join(timeout * TIME_SCALE)
        assert not self.is_alive(), "the chat did not end"
        if self.error is not None:
            raise self.error
        assert self.held_seconds is not None
        return self.text, self.held_seconds


def test_a_streamed_chat_held_at_zero_is_served_when_the_replica_comes_up(
    start_router: StartRouter, later_sim: LaterSim
) -> None:
    sim = later_sim("streaming")
    router = start_router([sim.base_url], "--hold-queue-size", "8", "--hold-seconds", "60",
                          *POLL)
    # No replica, holding: the router stays ready, so its Service keeps sending it requests.
    health = httpx.get(router.ops_url + "/health", timeout=5)
    assert health.status_code == 200 and health.json()["status"] == "holding"
    chat = StreamedChat(router)
    chat.start()
    eventually(lambda: held(router) == 1, 10, what="the chat held")
    held_from = time.monotonic()
    sim.start()
    up_after = time.monotonic() - held_from
    text, held_seconds = chat.result()
    assert text, "served, not refused"
    # Held from before `held_from` until the replica was up (and seen, within the poll).
    assert held_seconds >= up_after - 0.2
    assert metric(router.ops_url, "autoglm_router_hold_seconds_count") == 1
    assert metric(router.ops_url, "autoglm_router_hold_seconds_sum") == pytest.approx(
        held_seconds, abs=0.01)
    assert metric(router.ops_url, "autoglm_router_requests_total", outcome="ok") == 1
    assert held(router) == 0
    assert httpx.get(router.ops_url + "/health", timeout=5).json()["status"] == "ok"


async def _burst(router: RouterProcess, count: int, sim: SimProcess,
                 holding: int) -> list[Any]:
    client = openai.AsyncOpenAI(base_url=router.base_url + "/v1", api_key="EMPTY",
                                max_retries=0, timeout=60)

    async def one(i: int) -> Any:
        try:
            stream = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"task {i}"}],
                stream=True, max_tokens=4)
            return "".join([c.choices[0].delta.content or "" async for c in stream
                            if c.choices])
        except openai.APIStatusError as exc:
            return exc

    tasks = [asyncio.ensure_future(one(i)) for i in range(count)]
    # All arrived: those past the bound are answered at once, the rest held.
    while sum(t.done() for t in tasks) < count - holding or \
            await asyncio.to_thread(held, router) < holding:
        await asyncio.sleep(0.05)
    await asyncio.to_thread(sim.start)
    return await asyncio.gather(*tasks)


def test_a_burst_at_zero_loses_nothing_and_only_past_the_bound_is_refused(
    start_router: StartRouter, later_sim: LaterSim
) -> None:
    sim = later_sim("streaming")
    # One client sends the whole burst: its share of the queue is the queue (the bound per
    # client is the abuse tier's).
    router = start_router([sim.base_url], "--hold-queue-size", "60", "--hold-per-client", "60",
                          "--hold-seconds", "60", *POLL)
    results = asyncio.run(asyncio.wait_for(_burst(router, 100, sim, holding=60),
                                           60 * TIME_SCALE))
    served = [r for r in results if isinstance(r, str)]
    refused = [r for r in results if not isinstance(r, str)]
    assert len(served) == 60 and all(served), "each held request served, with its text"
    assert len(refused) == 40
    for error in refused:
        assert isinstance(error, openai.APIStatusError) and error.status_code == 503
        assert error.response.headers["retry-after"] == str(HOLD_RETRY_AFTER_SECONDS)
    assert metric(router.ops_url, "autoglm_router_hold_overflows_total", reason="full") == 40
    assert metric(router.ops_url, "autoglm_router_hold_overflows_total", reason="timeout") == 0
    assert metric(router.ops_url, "autoglm_router_hold_seconds_count") == 60


def test_a_request_held_past_hold_seconds_gets_503_with_retry_after(
    start_router: StartRouter, later_sim: LaterSim
) -> None:
    never = later_sim("streaming")
    router = start_router([never.base_url], "--hold-queue-size", "8", "--hold-seconds", "1")
    client = openai.OpenAI(base_url=router.base_url + "/v1", api_key="EMPTY", max_retries=0,
                           timeout=30)
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    response = refused.value.response
    assert response.status_code == 503 and response.headers["retry-after"]
    assert float(response.headers[HELD_SECONDS]) >= 1.0
    assert metric(router.ops_url, "autoglm_router_hold_overflows_total", reason="timeout") == 1


def test_two_routers_hold_and_both_release_when_the_replica_loads(
    start_router: StartRouter, later_sim: LaterSim
) -> None:
    # The replica listens at once but loads its model for 2 s (40 s at 20x): not ready.
    sim = later_sim("streaming", "--model-load-seconds", "40")
    routers = [start_router([sim.base_url], "--hold-queue-size", "4", *POLL)
               for _ in range(2)]
    chats = [StreamedChat(router) for router in routers]
    for chat in chats:
        chat.start()
    for router in routers:
        eventually(lambda r=router: held(r) == 1, 10, what="each router holding its chat")
    sim.wait_healthy = False
    sim.start()
    for chat, router in zip(chats, routers, strict=True):
        text, held_seconds = chat.result()
        assert text and held_seconds > 0
        assert metric(router.ops_url, "autoglm_router_hold_seconds_count") == 1


def test_a_request_held_while_its_router_drains_is_served_when_the_replica_comes_up(
    start_router: StartRouter, later_sim: LaterSim, tmp_path: Path
) -> None:
    sim = later_sim("streaming")
    router = start_router([sim.base_url], "--hold-queue-size", "4", "--hold-seconds", "30",
                          "--drain-seconds", "40", *POLL)
    chat = StreamedChat(router)
    chat.start()
    eventually(lambda: held(router) == 1, 10, what="the chat held")
    router.terminate()  # SIGTERM: the drain
    eventually(lambda: httpx.get(router.ops_url + "/health", timeout=5).status_code == 503,
               10, what="the router draining")
    sim.start()
    text, _ = chat.result()
    assert text
    assert router.process is not None
    assert router.process.wait(20) != 0  # it ends by the re-raised signal, once served
