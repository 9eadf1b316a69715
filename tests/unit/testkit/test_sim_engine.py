from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from testkit.sim.__main__ import main as sim_main
from testkit.sim.engine import EngineConfig, SimEngine, SimRequest
from testkit.sim.metrics import SimMetrics
from testkit.sim.model import (
    CPU_TINY_LATENCY,
    LatencyModel,
    MemoryModel,
    SleepModel,
    fill_step,
)
from testkit.sim.settings import SimSettings
from testkit.virtual_time import on_virtual_clock

FAST = 0.01  # 100x real time


def make(clock: Callable[[], float] = time.monotonic, **kwargs: object) -> SimEngine:
    config = EngineConfig(**{"time_factor": FAST, **kwargs})  # type: ignore[arg-type]
    return SimEngine(config, SimMetrics.create("m", 2048), clock=clock)


def request(target: int = 5, prompt: int = 10, priority: int = 0) -> SimRequest:
    return SimRequest(priority=priority, prompt_tokens=prompt, images=0, target_tokens=target,
                      finish_reason="length", arrival=time.monotonic())


async def collect(r: SimRequest) -> list[int]:
    out = []
    while (token := await r.tokens.get()) is not None:
        out.append(token)
    return out


def metric(engine: SimEngine, name: str, **labels: str) -> float:
    value = engine.metrics.registry.get_sample_value(
        name, {"model_name": "m", "engine": "0", **labels})
    assert value is not None, f"no sample {name} {labels}"  # renamed: not read as 0
    return value


async def test_one_step_per_token_after_prefill() -> None:
    engine = make()
    engine.start()
    r = request(target=6)
    engine.submit(r)
    assert await collect(r) == [1, 2, 3, 4, 5, 6]
    assert engine.steps == 6  # the prefill step gives the first token
    assert metric(engine, "vllm:request_success_total", finished_reason="length") == 1
    assert metric(engine, "vllm:generation_tokens_total") == 6
    assert metric(engine, "vllm:prompt_tokens_total") == 10
    await engine.stop()


@on_virtual_clock  # the sleep below is some 100 steps, however busy the machine is
async def test_max_num_seqs_limits_running() -> None:
    engine = make(asyncio.get_running_loop().time, max_num_seqs=2)
    requests = [request(target=10**6) for _ in range(4)]
    for r in requests:
        engine.submit(r)
    engine.start()
    await asyncio.sleep(0.02)
    assert len(engine.running) == 2 and len(engine.waiting) == 2
    assert metric(engine, "vllm:num_requests_running") == 2
    assert metric(engine, "vllm:num_requests_waiting") == 2
    for r in requests:
        engine.abort(r)
    await asyncio.wait_for(asyncio.gather(*(collect(r) for r in requests)), 5)
    await engine.stop()


async def test_priority_orders_the_waiting() -> None:
    engine = make(max_num_seqs=1)
    first = request(target=3)
    engine.submit(first)
    low, high = request(target=3, priority=5), request(target=3, priority=0)
    engine.submit(low)
    engine.submit(high)
    engine.start()
    await asyncio.gather(collect(first), collect(low), collect(high))
    assert first.first_token_at and high.first_token_at and low.first_token_at
    assert high.first_token_at < low.first_token_at
    await engine.stop()


async def test_kv_budget_preempts_and_recomputes() -> None:
    engine = make(kv_cache_tokens=100)
    a, b = request(target=40, prompt=40), request(target=40, prompt=40, priority=1)
    engine.submit(a)
    engine.submit(b)
    engine.start()
    tokens = await asyncio.gather(collect(a), collect(b))
    assert tokens == [list(range(1, 41))] * 2  # nothing lost or repeated
    assert metric(engine, "vllm:num_preemptions_total") >= 1
    assert a.finished and b.finished
    await engine.stop()


@on_virtual_clock  # the sleep below is some 100 steps, however busy the machine is
async def test_abort_frees_the_slot() -> None:
    engine = make(asyncio.get_running_loop().time, max_num_seqs=1)
    stuck, next_one = request(target=10**6), request(target=2)
    engine.submit(stuck)
    engine.submit(next_one)
    engine.start()
    await asyncio.sleep(0.02)
    assert engine.running == [stuck] and stuck.generated > 0  # it holds the slot
    engine.abort(stuck)
    assert await asyncio.wait_for(collect(next_one), 2) == [1, 2]
    assert metric(engine, "vllm:request_success_total", finished_reason="abort") == 1
    await engine.stop()


def test_latency_model_equations() -> None:
    model = LatencyModel()
    assert model.step_seconds(0, 0, 0) == model.t0
    assert model.step_seconds(8, 320, 1) > model.step_seconds(8, 0, 0)
    assert model.step_seconds(64, 0, 0) > model.step_seconds(8, 0, 0)  # bigger batch, slower step
    memory = MemoryModel()
    assert memory.used_bytes(64, 2048) > memory.used_bytes(8, 0) > memory.used_bytes(0, 0)
    assert memory.used_bytes(10**6, 10**6) == memory.gpus * memory.gpu_total_bytes
    assert [g for g, _, _ in memory.per_gpu(10)] == [0, 1]


def test_a_step_prefills_running_sequences_first_then_admits_new_ones_within_its_budget() -> None:
    waiting = [("c", 700), ("d", 50)]

    def admit_next() -> tuple[str, int] | None:
        return waiting.pop(0) if waiting else None

    plan = fill_step(1000, [("a", 200), ("b", 300)], admit_next)
    assert plan == [("a", 200), ("b", 300), ("c", 500)]
    assert waiting == [("d", 50)]  # the budget ran out: d is not asked for
    assert fill_step(100, [("a", 200), ("b", 300)], admit_next) == [("a", 100)]


@pytest.mark.parametrize(("flags", "latency"), [([], LatencyModel()),
                                                (["--calibration", "cpu"], CPU_TINY_LATENCY)])
def test_the_sim_runs_the_calibration_it_is_asked_for(
    flags: list[str], latency: LatencyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[LatencyModel] = []

    async def serve(host: str, port: int, settings: SimSettings,
                    admin_port: int | None = None) -> None:
        seen.append(settings.latency)

    monkeypatch.setattr("testkit.sim.server.serve_sim", serve)
    assert sim_main(flags) == 0
    assert seen == [latency]


# --- sleep mode ----------------------------------------------------------------------------


def sleep_states(engine: SimEngine) -> dict[str, float]:
    return {state: metric(engine, "vllm:engine_sleep_state", sleep_state=state)
            for state in ("awake", "weights_offloaded", "discard_all")}


@on_virtual_clock  # the sleep and the wake take their simulated seconds, exactly
async def test_asleep_the_engine_serves_nothing_until_it_wakes() -> None:
    loop = asyncio.get_running_loop()
    engine = make(loop.time, enable_sleep_mode=True, time_factor=1.0)
    engine.start()
    assert sleep_states(engine) == {"awake": 1, "weights_offloaded": 0, "discard_all": 0}
    start = loop.time()
    await engine.sleep(1)
    assert loop.time() - start == pytest.approx(SleepModel().sleep_seconds)
    assert await engine.is_sleeping()
    assert sleep_states(engine) == {"awake": 0, "weights_offloaded": 1, "discard_all": 0}
    r = request(target=3)
    engine.submit(r)
    await asyncio.sleep(5)
    assert engine.steps == 0 and r.tokens.empty()
    start = loop.time()
    assert await engine.wake_up() is True
    assert loop.time() - start == pytest.approx(SleepModel().wake_seconds)
    assert not await engine.is_sleeping()
    assert sleep_states(engine)["awake"] == 1
    assert await collect(r) == [1, 2, 3]
    await engine.stop()


@on_virtual_clock
async def test_a_level_2_sleep_drops_the_weights_and_reloading_them_takes_its_time() -> None:
    loop = asyncio.get_running_loop()
    engine = make(loop.time, enable_sleep_mode=True, time_factor=2.0)
    await engine.sleep(2)
    assert sleep_states(engine) == {"awake": 0, "weights_offloaded": 0, "discard_all": 1}
    # vLLM's level-2 wake: the weights, their reload, then the KV cache; awake only at the end.
    assert await engine.wake_up(tags=["weights"]) is False
    assert await engine.is_sleeping() and sleep_states(engine)["discard_all"] == 1
    start = loop.time()
    await engine.collective_rpc("reload_weights")
    assert loop.time() - start == pytest.approx(2.0 * SleepModel().reload_weights_seconds)
    assert await engine.wake_up(tags=["kv_cache"]) is True
    assert not await engine.is_sleeping() and sleep_states(engine)["awake"] == 1
    with pytest.raises(NotImplementedError):
        await engine.collective_rpc("reset_weights")


async def test_without_sleep_mode_the_engine_does_not_sleep() -> None:
    engine = make()
    with pytest.raises(RuntimeError, match="--enable-sleep-mode"):
        await engine.sleep(1)
    assert not await engine.is_sleeping()
    assert engine.model_config.enable_sleep_mode is False


def test_the_sims_sleep_flags(monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[SimSettings] = []

    async def serve(host: str, port: int, settings: SimSettings,
                    admin_port: int | None = None) -> None:
        seen.append(settings)

    monkeypatch.setattr("testkit.sim.server.serve_sim", serve)
    assert sim_main([]) == 0
    assert seen[-1].enable_sleep_mode is False and seen[-1].sleep == SleepModel()
    assert sim_main(["--enable-sleep-mode", "--sleep-seconds", "0.2", "--wake-seconds", "1"]) == 0
    assert seen[-1].enable_sleep_mode is True
    assert (seen[-1].sleep.sleep_seconds, seen[-1].sleep.wake_seconds) == (0.2, 1.0)
    with pytest.raises(SystemExit):
        sim_main(["--enable-sleep-mode", "--calibration", "cpu"])  # as vLLM on the CPU
    assert "not supported on the CPU" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sim_main(["--wake-seconds", "-1"])


@on_virtual_clock
async def test_a_sleep_in_wait_mode_lets_the_running_finish_and_keeps_the_queued_for_the_wake(
) -> None:
    loop = asyncio.get_running_loop()
    engine = make(loop.time, enable_sleep_mode=True, max_num_seqs=1)
    running, waiting = request(target=10**4), request(target=3)
    engine.submit(running)
    engine.submit(waiting)
    engine.start()
    await asyncio.sleep(0.05)
    assert engine.running == [running] and len(engine.waiting) == 1
    tokens = asyncio.ensure_future(collect(running))
    await engine.sleep(1, mode="wait")
    assert await tokens == list(range(1, 10**4 + 1))  # finished, not aborted
    assert engine.running == [] and engine.waiting == [waiting]
    assert metric(engine, "vllm:request_success_total", finished_reason="length") == 1
    assert await engine.is_sleeping() and waiting.tokens.empty()
    await engine.wake_up()
    assert await collect(waiting) == [1, 2, 3]
    await engine.stop()


@on_virtual_clock
async def test_a_sleep_aborts_what_the_engine_holds_as_vllms_default_does() -> None:
    loop = asyncio.get_running_loop()
    engine = make(loop.time, enable_sleep_mode=True, max_num_seqs=1)
    running, waiting = request(target=10**6), request(target=3)
    engine.submit(running)
    engine.submit(waiting)
    engine.start()
    await asyncio.sleep(0.05)
    assert engine.running == [running] and len(engine.waiting) == 1
    await engine.sleep(1)
    assert engine.running == [] and engine.waiting == []
    assert metric(engine, "vllm:request_success_total", finished_reason="abort") == 2
    assert metric(engine, "vllm:num_requests_waiting") == 0
    await engine.wake_up()
    after = request(target=2)
    engine.submit(after)
    assert await collect(after) == [1, 2]
    await engine.stop()
