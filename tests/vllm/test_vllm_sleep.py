"""The mode middleware's sleep and wake against the pinned vLLM's own code: the calls it makes
exist on vLLM's engine client with the arguments it passes, and its level-2 wake makes the calls
vLLM's own restore of a level-2 sleep makes, in the same order."""

from __future__ import annotations

import inspect
from typing import Any, get_args

import pytest
from vllm.engine.protocol import EngineClient as VllmEngineClient
from vllm.snapshot.server import _restore_reloadable_state
from vllm.v1.engine import PauseMode
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.executor.abstract import SLEEP_TAGS
from vllm.v1.worker.gpu_worker import Worker

from autoglm_runtime import middleware
from autoglm_runtime.admin import SLEEP_LEVELS

# vLLM's abstract client, and the one `vllm serve` puts in app.state.engine_client.
CLIENTS = [VllmEngineClient, AsyncLLM]


def _defaults(method: Any) -> list[tuple[str, object]]:
    return [(name, p.default) for name, p in inspect.signature(method).parameters.items()]


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", ["sleep", "wake_up"])
def test_the_middlewares_engine_client_is_vllms(client: type, name: str) -> None:
    """Same parameters, same defaults: the Protocol the middleware is typed against."""
    assert _defaults(getattr(middleware.EngineClient, name)) == _defaults(getattr(client, name))


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.__name__)
def test_sleep_takes_the_levels_and_the_pause_mode_the_middleware_sends(client: type) -> None:
    sleep = inspect.signature(client.sleep)
    for level in SLEEP_LEVELS:
        sleep.bind(None, level, mode=middleware.SLEEP_PAUSE_MODE)
    assert middleware.SLEEP_PAUSE_MODE == "wait" and "wait" in get_args(PauseMode)
    # Why the middleware names it: left out, vLLM aborts what the engine runs.
    assert sleep.parameters["mode"].default == "abort"


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.__name__)
def test_wake_up_takes_vllms_memory_tags(client: type) -> None:
    wake_up = inspect.signature(client.wake_up)
    wake_up.bind(None)
    wake_up.bind(None, tags=["weights"])
    assert wake_up.return_annotation in (bool, "bool")  # fully awake, or not
    assert set(SLEEP_TAGS) == {"weights", "kv_cache"}


def test_reload_weights_is_a_worker_method_collective_rpc_can_call() -> None:
    inspect.signature(AsyncLLM.collective_rpc).bind(None, "reload_weights")
    assert callable(Worker.reload_weights)  # the CPU worker is a subclass: it has it too


class RecordingEngine:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(("wake_up", tags))
        return tags == ["kv_cache"]  # the last tag back: fully awake

    async def collective_rpc(self, method: str) -> None:
        self.calls.append(("collective_rpc", method))


async def test_the_level_2_wake_is_the_one_vllm_makes_itself() -> None:
    ours, vllms = RecordingEngine(), RecordingEngine()
    assert await middleware._wake_from_level_2(ours) is True
    await _restore_reloadable_state(vllms)  # vllm/snapshot/server.py, after sleep(level=2)
    assert ours.calls == vllms.calls == [("wake_up", ["weights"]),
                                         ("collective_rpc", "reload_weights"),
                                         ("wake_up", ["kv_cache"])]
