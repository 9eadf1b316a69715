"""Sleep and wake on a real sim process: the admin API puts the replica to sleep, /metrics says
so, and streamed chats through the official `openai` client wake it once and are served after
about the wake time."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from sim_kit import MODEL, StartSim, admin_headers

from autoglm_api.profiles import MODE_PATH
from autoglm_api.standby import SLEEP_PATH, SLEEPING_METRIC, WAKE_PATH
from testkit.probe import metric
from testkit.processes import SimProcess
from testkit.sim.model import SleepModel
from testkit.waiting import TIME_SCALE, eventually_async

pytestmark = pytest.mark.timeout(120)
WAKE_SECONDS = SleepModel().wake_seconds  # the sims below run at real time


async def sample(sim: SimProcess, name: str, **labels: str) -> float:
    return await asyncio.to_thread(metric, sim.base_url, name, **labels)


async def first_chunk_after(aclient: openai.AsyncOpenAI, index: int) -> tuple[float, str]:
    """Stream a short chat: (seconds to its first content chunk, all its content)."""
    start = time.monotonic()
    first: float | None = None
    content = ""
    stream = await aclient.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"wake {index}"}], max_tokens=8,
        stream=True, extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                first = time.monotonic() - start if first is None else first
                content += choice.delta.content
    assert first is not None, "no content came"
    return first, content


async def test_a_sleeping_sim_wakes_once_for_concurrent_streams(start_sim: StartSim) -> None:
    sim = start_sim("--enable-sleep-mode")
    async with httpx.AsyncClient(headers=admin_headers(), timeout=10) as admin:
        slept = await admin.post(sim.admin_url + SLEEP_PATH, json={"level": 1})
        assert slept.status_code == 202, slept.text
        assert slept.json()["sleeping"] is True
        assert await sample(sim, SLEEPING_METRIC) == 1

        async def engine_asleep() -> bool:
            return await sample(sim, "vllm:engine_sleep_state",
                                sleep_state="weights_offloaded") == 1

        await eventually_async(engine_asleep, 10, what="the sim's engine asleep")
        assert await sample(sim, "vllm:engine_sleep_state", sleep_state="awake") == 0
        assert await sample(sim, "autoglm_sleeps_total") == 1

        async with openai.AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="EMPTY",
                                      max_retries=0, timeout=60) as aclient:
            answers = await asyncio.gather(*(first_chunk_after(aclient, i) for i in range(3)))
        for waited, content in answers:
            assert content, "a stream came back empty"
            assert waited >= WAKE_SECONDS, f"served {waited:.2f} s in: before the wake ended"
        assert await sample(sim, SLEEPING_METRIC) == 0
        assert await sample(sim, "vllm:engine_sleep_state", sleep_state="awake") == 1
        assert await sample(sim, "autoglm_wake_seconds_count") == 1  # one wake for all three
        took = await sample(sim, "autoglm_wake_seconds_sum")
        assert WAKE_SECONDS <= took < WAKE_SECONDS + 2 * TIME_SCALE, took
        assert await sample(sim, "autoglm_requests_admitted_total") == 3
        assert (await admin.get(sim.admin_url + MODE_PATH)).json()["sleeping"] is False


async def test_the_admin_api_wakes_a_sleeping_sim(start_sim: StartSim) -> None:
    sim = start_sim("--enable-sleep-mode", "--time-factor", "0.2")
    async with httpx.AsyncClient(headers=admin_headers(), timeout=10) as admin:
        assert (await admin.post(sim.admin_url + SLEEP_PATH)).status_code == 202

        async def asleep() -> bool:
            return await sample(sim, "autoglm_sleeps_total") == 1

        await eventually_async(asleep, 10, what="asleep")
        woken = await admin.post(sim.admin_url + WAKE_PATH)
        assert woken.status_code == 202

        async def awake() -> bool:
            return (await admin.get(sim.admin_url + MODE_PATH)).json()["sleeping"] is False

        await eventually_async(awake, 10, what="awake after the admin's wake")
        assert await sample(sim, SLEEPING_METRIC) == 0
        assert await sample(sim, "autoglm_wake_seconds_count") == 1


async def test_a_sim_without_sleep_mode_refuses_to_sleep_and_keeps_serving(
    sim_server: SimProcess,
) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        unauthorized = await client.post(sim_server.admin_url + SLEEP_PATH)
        assert unauthorized.status_code == 401
        refused = await client.post(sim_server.admin_url + SLEEP_PATH, json={"level": 1},
                                    headers=admin_headers())
        assert refused.status_code == 409, refused.text
        assert "--enable-sleep-mode" in refused.json()["error"]["message"]
        state = await client.get(sim_server.admin_url + MODE_PATH, headers=admin_headers())
        assert state.json()["sleeping"] is False
    assert await sample(sim_server, SLEEPING_METRIC) == 0
    async with openai.AsyncOpenAI(base_url=sim_server.base_url + "/v1", api_key="EMPTY",
                                  max_retries=0, timeout=60) as aclient:
        _, content = await first_chunk_after(aclient, 0)
    assert content
