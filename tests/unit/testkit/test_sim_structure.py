"""The sim's structure beyond one step: images priced by their size, a step with a floor, and vLLM's
API server as one process that preprocesses requests and streams their tokens out, in order.
The engine runs on a virtual clock here (testkit.virtual_time), so times are exact."""

from __future__ import annotations

import asyncio
import base64
import io

import pytest
from PIL import Image

from autoglm_api.image_budget import image_tokens
from testkit.sim.engine import EngineConfig, SimEngine, SimRequest
from testkit.sim.metrics import SimMetrics
from testkit.sim.model import IMAGE_TOKENS, ApiServer, LatencyModel
from testkit.sim.serve.chat import DEFAULT_IMAGE_MAX_PIXELS, chat_prompt
from testkit.sim.serve.common import SimError
from testkit.virtual_time import run_virtual


def png(width: int, height: int) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 200, 200)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def screenshot_prompt(url: str, max_pixels: int = DEFAULT_IMAGE_MAX_PIXELS) -> list[int]:
    return chat_prompt({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}]}]}, max_pixels).token_ids  # fmt: skip


# --- images ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("size", "max_pixels"), [
    ((540, 1200), DEFAULT_IMAGE_MAX_PIXELS),  # the agent's scaled screenshot: 738 tokens
    ((1080, 2400), DEFAULT_IMAGE_MAX_PIXELS),  # native, scaled down to the budget
    ((1080, 2400), 5_000_000),  # the official budget: 3,354 tokens
    ((224, 896), DEFAULT_IMAGE_MAX_PIXELS),  # the GPU calibration's screenshot: IMAGE_TOKENS
])  # fmt: skip
def test_a_screenshot_costs_the_tokens_the_engines_processor_makes_of_it(
        size: tuple[int, int], max_pixels: int) -> None:
    text_only = len(chat_prompt({"messages": [{"role": "user", "content": []}]}).token_ids)
    tokens = len(screenshot_prompt(png(*size), max_pixels)) - text_only
    assert tokens == image_tokens(*size, max_pixels) + 2  # with <|begin/end_of_image|>


def test_the_calibration_screenshot_is_image_tokens_and_an_unreadable_image_counts_as_one() -> None:
    assert image_tokens(224, 896, DEFAULT_IMAGE_MAX_PIXELS) == IMAGE_TOKENS
    remote = screenshot_prompt("https://example.invalid/screen.png")
    not_png = screenshot_prompt("data:image/png;base64," + base64.b64encode(b"no png").decode())
    assert len(remote) == len(not_png) == len(screenshot_prompt(png(224, 896)))


def test_a_shape_the_processor_refuses_is_a_400_as_on_the_engine() -> None:
    with pytest.raises(SimError) as refused:
        screenshot_prompt(png(28, 28 * 250))
    assert refused.value.status == 400 and "aspect ratio" in refused.value.message


def test_image_costs_grow_with_the_images_tokens_and_keep_the_gpu_calibrations_value() -> None:
    gpu = LatencyModel()
    # One calibration screenshot costs what one image cost before sizes counted.
    assert gpu.preprocess_seconds(316, IMAGE_TOKENS) == pytest.approx(
        gpu.a_pre + gpu.a_img + gpu.a_tok * 316)
    assert gpu.step_seconds(8, 316, IMAGE_TOKENS) == pytest.approx(
        gpu.t0 + gpu.t1 * 8 + gpu.c_p * 316 + gpu.c_img)
    big, small = (gpu.step_seconds(0, 0, n) for n in (image_tokens(540, 1200, 1_207_360), 256))
    assert big - gpu.t0 == pytest.approx((small - gpu.t0) * 738 / 256)


# --- the step ----------------------------------------------------------------------------------


def test_a_step_takes_its_floor_until_its_work_is_longer() -> None:
    model = LatencyModel(t0=0.002, t1=0.0003, c_p=0.0, c_img=0.0, floor=0.0045)
    assert model.step_seconds(1, 0, 0) == model.step_seconds(8, 0, 0) == 0.0045
    assert model.step_seconds(32, 0, 0) == pytest.approx(0.002 + 0.0003 * 32)
    assert model.step_seconds(64, 0, 0) > model.step_seconds(32, 0, 0)
    assert LatencyModel().step_seconds(0, 0, 0) == LatencyModel().t0  # no floor on the GPU


# --- the API server ----------------------------------------------------------------------------


def test_one_api_server_streams_out_first_and_serves_requests_in_arrival_order() -> None:
    async def timeline(shared: bool) -> dict[str, float]:
        loop = asyncio.get_running_loop()
        server = ApiServer(shared=shared)
        done: dict[str, float] = {}

        async def request(name: str) -> None:
            await server.intake(0.010, loop.time)
            done[name] = loop.time()

        async def step_output() -> None:
            await asyncio.sleep(0.005)  # a step ends while the first request is preprocessed
            done["output"] = server.reserve(loop.time(), 0.004)

        await asyncio.gather(request("a"), request("b"), request("c"), step_output())
        return done

    shared = run_virtual(timeline(True))
    # The step's output waits only for the job in progress, then goes ahead of b and c.
    assert shared == pytest.approx({"a": 0.010, "output": 0.014, "b": 0.024, "c": 0.034})
    parallel = run_virtual(timeline(False))
    assert parallel == pytest.approx({"a": 0.010, "b": 0.010, "c": 0.010, "output": 0.009})


def _request(arrival: float, prompt: int = 10, target: int = 4) -> SimRequest:
    return SimRequest(priority=0, prompt_tokens=prompt, images=0, target_tokens=target,
                      finish_reason="length", arrival=arrival)


async def _burst(latency: LatencyModel, users: int, target: int = 4) -> list[float]:
    """`users` requests at once; each one's TTFT as vLLM records it."""
    loop = asyncio.get_running_loop()
    engine = SimEngine(EngineConfig(latency=latency), SimMetrics.create("m", 2048),
                       clock=loop.time)
    engine.start()
    requests = [_request(loop.time(), target=target) for _ in range(users)]
    firsts: list[float] = []

    async def one(request: SimRequest) -> None:
        await engine.admit(request)
        assert await request.tokens.get() == 1
        firsts.append(loop.time() - request.arrival)
        while await request.tokens.get() is not None:
            pass

    await asyncio.gather(*(one(r) for r in requests))
    await engine.stop()
    return firsts


LIGHT = LatencyModel(a_pre=0.010, a_tok=0.0, t0=0.005, t1=0.0, c_p=0.0)


def test_ttft_grows_with_the_queue_of_preprocessing_in_one_api_server() -> None:
    shared = LatencyModel(**{**vars(LIGHT), "shared_api_server": True})
    # A burst of k requests: the API server preprocesses them one after another (a_pre 10 ms),
    # so the i-th waits for the i - 1 before it; then the rest of the 5 ms step in progress, its
    # own step, and the preprocessing in progress when its token comes out.
    for k in (1, 4, 8):
        ttfts = sorted(run_virtual(_burst(shared, k)))
        for i, ttft in enumerate(ttfts, start=1):
            assert i * 0.010 + 0.005 - 1e-9 <= ttft <= i * 0.010 + 0.020 + 1e-9
        # In parallel (the GPU calibration) the burst costs nothing more than one request.
        assert max(run_virtual(_burst(LIGHT, k))) == pytest.approx(0.015)


def test_tokens_reach_the_client_after_the_api_server_streamed_them_out() -> None:
    out = LatencyModel(**{**vars(LIGHT), "shared_api_server": True, "out_step": 0.001,
                          "out_chunk": 0.002})
    quick = run_virtual(_burst(LatencyModel(**{**vars(LIGHT), "shared_api_server": True}), 1))
    slow = run_virtual(_burst(out, 1))
    assert slow[0] - quick[0] == pytest.approx(0.003)  # the step's output, then its SSE event


def test_inter_token_latency_is_the_engines_step_whatever_the_api_server_adds() -> None:
    async def itl(latency: LatencyModel) -> float:
        loop = asyncio.get_running_loop()
        engine = SimEngine(EngineConfig(latency=latency), SimMetrics.create("m", 2048),
                           clock=loop.time)
        engine.start()
        request = _request(loop.time(), target=20)
        await engine.admit(request)
        while await request.tokens.get() is not None:
            pass
        await engine.stop()
        registry = engine.metrics.registry
        labels = {"model_name": "m", "engine": "0"}
        total = registry.get_sample_value("vllm:inter_token_latency_seconds_sum", labels)
        count = registry.get_sample_value("vllm:inter_token_latency_seconds_count", labels)
        assert total is not None and count == 19
        return total / count

    slow_out = LatencyModel(**{**vars(LIGHT), "shared_api_server": True, "out_step": 0.002,
                                 "out_chunk": 0.004})
    assert run_virtual(itl(slow_out)) == pytest.approx(0.005)  # vLLM times it in the engine


def test_a_stream_sends_what_came_while_it_waited_in_one_event_after_vllm_timed_it() -> None:
    async def stream(latency: LatencyModel) -> tuple[list[float], float]:
        loop = asyncio.get_running_loop()
        engine = SimEngine(EngineConfig(latency=latency), SimMetrics.create("m", 2048),
                           clock=loop.time)
        engine.start()
        request = _request(loop.time(), target=20)
        await engine.admit(request)
        seen = []
        while await request.tokens.get() is not None:
            seen.append(loop.time())
        registry = engine.metrics.registry
        e2e = registry.get_sample_value("vllm:e2e_request_latency_seconds_sum",
                                        {"model_name": "m", "engine": "0"})
        await engine.stop()
        assert e2e is not None
        return seen, e2e

    # Each SSE event takes 12 ms of the API server, and a step gives a token every 5 ms.
    slow = LatencyModel(**{**vars(LIGHT), "shared_api_server": True, "out_chunk": 0.012})
    seen, e2e = run_virtual(stream(slow))
    assert len(seen) == 20  # every token arrives
    events = len(set(seen))
    assert events < 10  # two or three to an event
    assert seen[-1] > e2e  # the client sees the end after vLLM's E2E is recorded
    quick_seen, quick_e2e = run_virtual(stream(LIGHT))
    assert len(set(quick_seen)) == 20 and quick_seen[-1] == pytest.approx(quick_e2e)
