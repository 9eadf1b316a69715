"""Sleep and wake in the mode middleware (vLLM's sleep mode, autoglm_api.standby): a relayed
sleep puts the engine client to sleep only while the replica is idle, in vLLM's "wait" pause
mode, and a request that reaches a sleeping replica waits for one wake, shared with every other
one and made in the order vLLM documents, then is served."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from asgi_kit import FakeEngine, FakeEngineClient, MakeClient

from autoglm_api.standby import SLEEPING_METRIC
from autoglm_runtime.admin import CallRefused
from autoglm_runtime.middleware import ModeMiddleware
from testkit.virtual_time import on_virtual_clock
from testkit.waiting import eventually_async

CHAT = "/v1/chat/completions"
CHAT_BODY = {"model": "autoglm-phone-9b", "messages": [{"role": "user", "content": "hi"}]}


def sample(middleware: ModeMiddleware, name: str, labels: dict[str, str] | None = None) -> float:
    value = middleware.registry.get_sample_value(name, labels or {})
    assert value is not None, f"no sample {name} {labels or {}}"  # renamed: not read as 0
    return value


async def started(client: httpx.AsyncClient) -> None:
    """A first call through the host: the middleware learns the app (and its engine client)
    from the scopes it passes on, in vLLM from the lifespan's."""
    assert (await client.get("/health")).status_code == 200


async def asleep(middleware: ModeMiddleware, level: int = 1) -> dict[str, Any]:
    state = middleware.relayed({"op": "sleep", "level": level})
    assert state["sleeping"] is True
    await eventually_async(lambda: sample(middleware, "autoglm_sleeps_total") == 1, 2,
                           every=0.01, what="the engine asleep")
    return state


@on_virtual_clock  # the wake takes 0.85 s of the loop's clock, exactly
async def test_requests_to_a_sleeping_replica_share_one_wake_and_are_served(
    make_client: MakeClient, engine: FakeEngine, engine_client: FakeEngineClient
) -> None:
    engine_client.wake_seconds = 0.85
    middleware, client = make_client()
    await started(client)
    await asleep(middleware)
    assert sample(middleware, SLEEPING_METRIC) == 1
    chats = [asyncio.create_task(client.post(CHAT, json={**CHAT_BODY, "stream": stream}))
             for stream in (False, True, False)]
    await eventually_async(lambda: middleware.controller.inflight == 3, 0.5, every=0.01,
                           what="all three admitted, waiting for the wake")
    assert engine.bodies == [], "a request reached the engine before it woke"
    answers = await asyncio.gather(*chats)
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    assert len(engine.bodies) == 3
    assert engine_client.calls == [("sleep", 1, "wait"), ("wake_up", None)]
    assert middleware.state()["sleeping"] is False
    assert sample(middleware, SLEEPING_METRIC) == 0
    assert sample(middleware, "autoglm_wake_seconds_count") == 1
    assert sample(middleware, "autoglm_wake_seconds_sum") == pytest.approx(0.85)


@on_virtual_clock
async def test_a_request_while_the_engine_falls_asleep_waits_for_the_sleep_then_the_wake(
    make_client: MakeClient, engine: FakeEngine, engine_client: FakeEngineClient
) -> None:
    middleware, client = make_client()
    await started(client)
    engine_client.sleep_gate.clear()
    middleware.relayed({"op": "sleep"})
    chat = asyncio.create_task(client.post(CHAT, json=CHAT_BODY))
    await eventually_async(lambda: middleware.controller.inflight == 1, 2, every=0.01)
    assert engine_client.calls == [("sleep", 1, "wait")] and engine.bodies == []
    engine_client.sleep_gate.set()
    assert (await chat).status_code == 200
    assert engine_client.calls == [("sleep", 1, "wait"), ("wake_up", None)]
    assert engine_client.asleep is False and len(engine.bodies) == 1


@on_virtual_clock
async def test_a_wake_from_level_2_follows_vllms_order(
    make_client: MakeClient, engine_client: FakeEngineClient
) -> None:
    middleware, client = make_client()
    await started(client)
    await asleep(middleware, level=2)
    state = middleware.relayed({"op": "wake"})
    assert state["sleeping"] is True  # under way: the state says so until it is done
    await eventually_async(lambda: not middleware.state()["sleeping"], 2, every=0.01)
    # vLLM's docs/features/sleep_mode.md, "Sleep level 2": the weights' memory, the weights
    # loaded into it, then the KV cache.
    assert engine_client.calls == [("sleep", 2, "wait"), ("wake_up", ["weights"]),
                                   ("collective_rpc", "reload_weights"),
                                   ("wake_up", ["kv_cache"])]
    assert not engine_client.asleep
    assert (await client.post(CHAT, json=CHAT_BODY)).status_code == 200
    assert len(engine_client.calls) == 4  # awake: nothing more to do


@on_virtual_clock
async def test_a_wake_vllm_reports_partial_leaves_the_replica_asleep_for_the_next_request(
    make_client: MakeClient, engine: FakeEngine, engine_client: FakeEngineClient
) -> None:
    middleware, client = make_client()
    await started(client)
    await asleep(middleware)
    engine_client.partial_wakes = 1  # vLLM's wake_up answers False: not fully awake
    failed = await client.post(CHAT, json=CHAT_BODY)
    assert failed.status_code == 503 and engine.bodies == []
    assert middleware.state()["sleeping"] is True
    assert (await client.post(CHAT, json=CHAT_BODY)).status_code == 200
    assert engine_client.calls == [("sleep", 1, "wait"), ("wake_up", None), ("wake_up", None)]
    assert sample(middleware, "autoglm_wake_seconds_count") == 1  # the wake that worked


@on_virtual_clock
async def test_a_failed_wake_is_a_503_to_retry_and_the_next_request_wakes_it(
    make_client: MakeClient, engine: FakeEngine, engine_client: FakeEngineClient
) -> None:
    middleware, client = make_client()
    await started(client)
    await asleep(middleware)
    engine_client.wake_fails = 1
    failed = await client.post(CHAT, json=CHAT_BODY)
    assert failed.status_code == 503 and failed.headers["retry-after"] == "1"
    assert engine.bodies == [] and middleware.state()["sleeping"] is True
    assert sample(middleware, "autoglm_requests_rejected_total", {"reason": "wake_failed"}) == 1
    assert middleware.controller.inflight == 0
    assert (await client.post(CHAT, json=CHAT_BODY)).status_code == 200
    assert engine_client.calls == [("sleep", 1, "wait"), ("wake_up", None), ("wake_up", None)]
    assert sample(middleware, "autoglm_wake_seconds_count") == 1  # the wake that worked


async def test_an_engine_without_sleep_mode_refuses_and_nothing_changes(
    make_client: MakeClient, engine_client: FakeEngineClient
) -> None:
    engine_client.model_config.enable_sleep_mode = False
    middleware, client = make_client()
    await started(client)
    with pytest.raises(CallRefused) as refused:
        middleware.relayed({"op": "sleep", "level": 1})
    assert refused.value.status == 409 and refused.value.retry_after is None
    assert "--enable-sleep-mode" in refused.value.message
    assert "CPU" in refused.value.message
    assert engine_client.calls == [] and middleware.state()["sleeping"] is False
    assert sample(middleware, SLEEPING_METRIC) == 0


async def test_before_the_server_runs_there_is_no_engine_to_sleep(
    make_client: MakeClient, engine_client: FakeEngineClient
) -> None:
    middleware, _ = make_client()  # no scope has passed: no app, no engine client yet
    with pytest.raises(CallRefused, match="sleep mode"):
        middleware.relayed({"op": "sleep"})
    assert engine_client.calls == []


@on_virtual_clock
async def test_a_busy_replica_does_not_sleep_until_it_is_idle(
    make_client: MakeClient, engine: FakeEngine, engine_client: FakeEngineClient
) -> None:
    middleware, client = make_client()
    await started(client)
    engine.release.clear()
    running = asyncio.create_task(client.post(CHAT, json=CHAT_BODY))
    await eventually_async(lambda: middleware.controller.inflight == 1, 2, every=0.01)
    with pytest.raises(CallRefused) as refused:
        middleware.relayed({"op": "sleep"})
    assert refused.value.status == 409 and refused.value.retry_after == 1
    assert "idle" in refused.value.message and engine_client.calls == []
    engine.release.set()
    assert (await running).status_code == 200
    await asleep(middleware)
    assert engine_client.calls == [("sleep", 1, "wait")]


@on_virtual_clock
async def test_sleep_and_wake_calls_that_change_nothing(
    make_client: MakeClient, engine_client: FakeEngineClient
) -> None:
    middleware, client = make_client()
    await started(client)
    assert middleware.relayed({"op": "wake"})["sleeping"] is False  # awake already
    await asleep(middleware)
    middleware.relayed({"op": "sleep"})  # asleep already
    engine_client.wake_gate.clear()
    middleware.relayed({"op": "wake"})
    await eventually_async(lambda: ("wake_up", None) in engine_client.calls, 2, every=0.01)
    with pytest.raises(CallRefused) as refused:
        middleware.relayed({"op": "sleep"})  # while it wakes
    assert refused.value.retry_after == 1
    engine_client.wake_gate.set()
    await eventually_async(lambda: not middleware.state()["sleeping"], 2, every=0.01)
    assert engine_client.calls == [("sleep", 1, "wait"), ("wake_up", None)]
    middleware.relayed({"op": "drain"})
    with pytest.raises(CallRefused, match="draining"):
        middleware.relayed({"op": "sleep"})


@pytest.mark.parametrize("level", [0, 3, "1", True, None])
async def test_a_relayed_sleep_level_vllm_does_not_have_is_a_bad_call(
    make_client: MakeClient, engine_client: FakeEngineClient, level: Any
) -> None:
    middleware, client = make_client()
    await started(client)
    with pytest.raises(ValueError, match="sleep level"):
        middleware.relayed({"op": "sleep", "level": level})
    assert engine_client.calls == []
