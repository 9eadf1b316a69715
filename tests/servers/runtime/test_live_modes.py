"""Mode switches under load and draining on SIGTERM, on real sim processes."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable

import httpx
import openai
import pytest
from sim_kit import MODEL, StartSim, admin_headers, log_of

from autoglm_api.profiles import MODE_PATH
from testkit.probe import metric
from testkit.processes import SimProcess
from testkit.waiting import eventually_async

pytestmark = pytest.mark.timeout(120)
# Long enough that every stream is still open when the test flips the mode or sends SIGTERM,
# on a loaded machine too.
STREAM_TOKENS = 400


async def stream_one(aclient: openai.AsyncOpenAI, index: int, tokens: int,
                     arrivals: list[float]) -> tuple[int, str | None]:
    """Stream a response; returns (content chunks, finish_reason) and logs chunk times."""
    stream = await aclient.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"stream {index}"}],
        max_tokens=tokens, stream=True, extra_body={"ignore_eos": True},
    )
    chunks, finish = 0, None
    async for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                chunks += 1
                arrivals.append(time.monotonic())
            finish = choice.finish_reason or finish
    return chunks, finish


async def all_arrived(admin: httpx.AsyncClient, mode_url: str, count: int) -> None:
    """Wait until the runtime holds all `count` requests, admitted or queued behind the mode's
    cap: the first tokens of some streams are no sign that the others have arrived."""

    async def holds_all() -> bool:
        state = (await admin.get(mode_url)).json()
        if state["inflight"] + state["queued"] < count:
            raise _NotYet(state)  # the last one goes into the failure's message
        return True

    await eventually_async(holds_all, 30, every=0.02, ignoring=(_NotYet,),
                           what=f"the runtime holding all {count} requests")


class _NotYet(Exception):
    """A state read before the one waited for."""


async def received(sim: SimProcess) -> float:
    """Valid requests the runtime has been offered (admitted, queued or turned away)."""
    return await asyncio.to_thread(metric, sim.base_url, "autoglm_requests_received_total")


async def _at_least(value: Awaitable[float], floor: float) -> bool:
    return await value >= floor


async def _status_is(reply: Awaitable[httpx.Response], status: int) -> bool:
    return (await reply).status_code == status


async def test_switch_under_load_drops_nothing(start_sim: StartSim) -> None:
    sim = start_sim("--time-factor", "0.25")
    mode_url = sim.admin_url + MODE_PATH
    arrivals: list[float] = []
    async with (
        openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="EMPTY",
                           max_retries=0, timeout=60) as aclient,
        httpx.AsyncClient(headers=admin_headers()) as admin,
    ):
        streams = [asyncio.create_task(stream_one(aclient, i, STREAM_TOKENS, arrivals))
                   for i in range(12)]
        await all_arrived(admin, mode_url, 12)
        switched_at = time.monotonic()
        state = (await admin.put(mode_url, json={"mode": "batching"})).json()
        assert state["mode"] == "batching" and state["inflight"] == 12
        # New requests follow the new mode while the old streams continue.
        late = [asyncio.create_task(stream_one(aclient, 100 + i, 20, [])) for i in range(4)]
        await eventually_async(lambda: _at_least(received(sim), 16), 10, every=0.02,
                               what="the 4 late requests reaching the runtime in batching")
        back = (await admin.put(mode_url, json={"mode": "streaming"})).json()
        assert back["switches"] == 2
        results = await asyncio.gather(*streams, *late)
    assert results[:12] == [(STREAM_TOKENS, "length")] * 12
    assert results[12:] == [(20, "length")] * 4
    # Kept streaming after the flip: each stream had most of its tokens still to send.
    assert sum(1 for t in arrivals if t > switched_at) > 12 * STREAM_TOKENS // 2
    metrics = httpx.get(sim.base_url + "/metrics").text
    assert "autoglm_mode_switches_total 2.0" in metrics
    assert 'autoglm_requests_rejected_total{reason="queue_timeout"} 0.0' in metrics


async def test_sigterm_drains_then_exits(start_sim: StartSim) -> None:
    sim = start_sim("--time-factor", "0.25")
    assert sim.process is not None
    arrivals: list[float] = []
    async with (
        openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="EMPTY",
                           max_retries=0, timeout=60) as aclient,
        httpx.AsyncClient(base_url=sim.base_url) as http,
    ):
        admitted = [asyncio.create_task(stream_one(aclient, i, STREAM_TOKENS, arrivals))
                    for i in range(8)]
        async with httpx.AsyncClient(headers=admin_headers()) as admin:
            await all_arrived(admin, sim.admin_url + MODE_PATH, 8)
        sim.process.send_signal(signal.SIGTERM)
        # The signal's handler runs on the sim's next loop turn.
        await eventually_async(lambda: _status_is(http.get("/health"), 503), 5, every=0.05,
                               what="health going 503")
        refused = await http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "late"}]})
        assert refused.status_code == 503
        assert refused.json()["error"]["message"]
        results = await asyncio.gather(*admitted)
    assert results == [(STREAM_TOKENS, "length")] * 8  # every admitted request completed
    code = await asyncio.to_thread(sim.process.wait, 30)
    assert code == 0, log_of(sim)
    assert "Drained (all done)" in log_of(sim)
