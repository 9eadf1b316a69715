"""The clients people use, against sim + middleware over real HTTP."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessageChunk, HumanMessage
from langchain_openai import ChatOpenAI
from sim_kit import MODEL, admin_headers

from autoglm_api.image_budget import IMAGE_DELIMITER_TOKENS, image_tokens
from autoglm_api.profiles import MODE_PATH
from testkit.processes import SimProcess
from testkit.sim.serve.chat import DEFAULT_IMAGE_MAX_PIXELS
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(60)
SCREENSHOT = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42"
              "mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


def screenshot_message(text: str = "Which app is open?") -> Any:
    return [{"role": "user", "content": [
        {"type": "text", "text": text},
        {"type": "image_url", "image_url": {"url": SCREENSHOT}},
    ]}]


def client(sim: SimProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.base_url + "/v1", api_key="EMPTY", max_retries=0)


def test_sync_chat_with_an_image_and_reasoning(sim_server: SimProcess) -> None:
    raw = client(sim_server).chat.completions.with_raw_response.create(
        model=MODEL, messages=screenshot_message(), max_tokens=20,
        extra_body={"enable_thinking": True, "return_reasoning": True, "session_id": "conv-1"},
    )
    assert raw.headers["x-autoglm-session-id"] == "conv-1"
    completion = raw.parse()
    message = completion.choices[0].message
    assert message.content
    assert getattr(message, "reasoning_content", None)  # thinking came back separately
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 20
    # The image counts what the engine's processor makes of a 1x1 PNG (raised to its 84x84
    # floor: 3x3 tokens), with its two delimiters.
    text_only = client(sim_server).chat.completions.create(
        model=MODEL, max_tokens=1, messages=[{"role": "user", "content": [
            {"type": "text", "text": "Which app is open?"}]}])  # fmt: skip
    assert text_only.usage is not None
    assert completion.usage.prompt_tokens - text_only.usage.prompt_tokens == (
        image_tokens(1, 1, DEFAULT_IMAGE_MAX_PIXELS) + IMAGE_DELIMITER_TOKENS) == 11


def test_reasoning_can_be_hidden(sim_server: SimProcess) -> None:
    completion = client(sim_server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=10,
        extra_body={"enable_thinking": True, "return_reasoning": False},
    )
    assert getattr(completion.choices[0].message, "reasoning_content", None) is None


def test_default_max_tokens_is_512(sim_server: SimProcess) -> None:
    completion = client(sim_server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "go"}],
        extra_body={"ignore_eos": True},
    )
    assert completion.usage is not None and completion.usage.completion_tokens == 512
    assert completion.choices[0].finish_reason == "length"


async def test_async_chat_concurrently(sim_server: SimProcess) -> None:
    async with openai.AsyncOpenAI(base_url=sim_server.base_url + "/v1", api_key="EMPTY",
                                  max_retries=0) as aclient:
        import asyncio

        results = await asyncio.gather(*(aclient.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"task {i}"}], max_tokens=8)
            for i in range(6)))
    assert all(r.choices[0].message.content for r in results)
    assert len({r.id for r in results}) == 6


def test_streaming_chat(sim_server: SimProcess) -> None:
    stream = client(sim_server).chat.completions.create(
        model=MODEL, messages=screenshot_message(), max_tokens=12, stream=True,
        stream_options={"include_usage": True}, extra_body={"enable_thinking": True},
    )
    content, reasoning, finish, usage = [], [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
            finish = choice.finish_reason or finish
    assert "".join(content) and "".join(reasoning)
    assert finish == "length"
    assert usage is not None and usage.completion_tokens == 12


def test_completions_and_models(sim_server: SimProcess) -> None:
    c = client(sim_server)
    assert [m.id for m in c.models.list()] == [MODEL]
    text = c.completions.create(model=MODEL, prompt="Say hi", max_tokens=5)
    assert text.choices[0].text
    streamed = "".join(chunk.choices[0].text for chunk in c.completions.create(
        model=MODEL, prompt="Say hi", max_tokens=5, stream=True))
    assert streamed == text.choices[0].text  # the sim is deterministic per prompt


@pytest.mark.parametrize("kwargs", [
    {"model": "gpt-4o"},
    {"max_tokens": -1},
    {"max_tokens": 0},
    {"messages": [{"role": "user", "content": "word " * 5000}]},
])
def test_bad_requests_raise_bad_request(sim_server: SimProcess, kwargs: dict[str, object]) -> None:
    call = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **kwargs}
    with pytest.raises(openai.BadRequestError) as err:
        client(sim_server).chat.completions.create(**call)  # type: ignore[call-overload]
    assert err.value.status_code == 400
    assert isinstance(err.value.body, dict) and err.value.body.get("message")


def test_metrics_show_both_families(sim_server: SimProcess) -> None:
    client(sim_server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "count me"}], max_tokens=3)
    text = httpx.get(sim_server.base_url + "/metrics").text
    for name in ("vllm:request_success_total{", "vllm:num_requests_running{",
                 "vllm:num_requests_waiting{", "vllm:kv_cache_usage_perc{",
                 "vllm:time_to_first_token_seconds_bucket{", "vllm:prompt_tokens_total{",
                 "vllm:inter_token_latency_seconds_bucket{", "vllm:generation_tokens_total{",
                 "vllm:e2e_request_latency_seconds_bucket{", 'autoglm_mode{mode="streaming"} 1.0',
                 "autoglm_requests_admitted_total", "autoglm_requests_queued",
                 "autoglm_queue_wait_seconds_bucket", "autoglm_mode_switches_total",
                 'autoglm_requests_rejected_total{reason="queue_full"}',
                 'autoglm_gpu_memory_used_bytes{gpu="0"}',
                 'autoglm_gpu_memory_total_bytes{gpu="1"}'):
        assert name in text, name
    assert f'model_name="{MODEL}"' in text


def test_admin_over_http_on_its_own_port(sim_server: SimProcess) -> None:
    url = sim_server.admin_url + MODE_PATH
    assert httpx.get(url).status_code == 401
    on_the_api_port = httpx.get(sim_server.base_url + MODE_PATH, headers=admin_headers())
    assert on_the_api_port.status_code == 404
    assert httpx.put(url, json={"mode": "nope"}, headers=admin_headers()).status_code == 400
    state = httpx.get(url, headers=admin_headers()).json()
    assert state["mode"] == "streaming" and state["draining"] is False


def test_langchain_invoke_stream_astream(sim_server: SimProcess) -> None:
    # Exactly the client call from the reference deployment.
    llm = ChatOpenAI(
        model="autoglm-phone-9b",
        base_url=sim_server.base_url + "/v1",
        api_key="EMPTY",
        streaming=True,
        extra_body={"enable_thinking": True, "return_reasoning": True},
    )
    reply = llm.invoke([HumanMessage(content="Open the settings app")])
    assert isinstance(reply.content, str) and reply.content
    chunks = list(llm.stream("Turn on dark mode"))
    assert len(chunks) > 1 and all(isinstance(c, AIMessageChunk) for c in chunks)
    assert "".join(str(c.content) for c in chunks)

    import asyncio

    async def collect() -> list[AIMessageChunk]:
        parts = screenshot_message()[0]["content"]
        return [c async for c in llm.astream([HumanMessage(content=parts)])]

    achunks = asyncio.run(collect())
    assert len(achunks) > 1 and "".join(str(c.content) for c in achunks)


def test_health_waits_for_the_model_load(start_sim: Any) -> None:
    sim = start_sim("--time-factor", "0.05", "--model-load-seconds", "30", wait_healthy=False)
    assert httpx.get(sim.base_url + "/health").status_code == 503
    loading = httpx.post(sim.base_url + "/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert loading.status_code == 503
    started = time.monotonic()
    eventually(lambda: httpx.get(sim.base_url + "/health").status_code == 200, 10,
               what="the sim healthy once its model has loaded")
    assert time.monotonic() - started > 0.3  # 30 simulated s at 20x: 1.5 s from start


def test_a_client_that_leaves_aborts_its_request(sim_server: SimProcess) -> None:
    def aborted() -> float:
        for line in httpx.get(sim_server.base_url + "/metrics").text.splitlines():
            if line.startswith("vllm:request_success_total") and 'reason="abort"' in line:
                return float(line.split()[-1])
        raise AssertionError("no abort series")

    before = aborted()
    with pytest.raises(httpx.TimeoutException):
        httpx.post(sim_server.base_url + "/v1/chat/completions", timeout=0.15, json={
            "model": MODEL, "max_tokens": 2000, "ignore_eos": True,
            "messages": [{"role": "user", "content": "a long answer"}]})
    eventually(lambda: aborted() != before, 5, every=0.05,
               what="the engine aborting the request whose client left")


def test_an_api_key_is_checked_before_admission(start_sim: Any) -> None:
    """VLLM_API_KEY (the operator's apiKeySecretRef) guards the API as vLLM does, in front."""
    sim = start_sim("--time-factor", "0.05", env={"VLLM_API_KEY": "client-key"})
    keyless = openai.OpenAI(base_url=sim.base_url + "/v1", api_key="EMPTY", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        keyless.chat.completions.create(model=MODEL, messages=screenshot_message(), max_tokens=4)
    keyed = openai.OpenAI(base_url=sim.base_url + "/v1", api_key="client-key", max_retries=0)
    reply = keyed.chat.completions.create(model=MODEL, messages=screenshot_message(), max_tokens=4)
    assert reply.choices[0].message.content
    metrics = httpx.get(sim.base_url + "/metrics").text
    assert 'autoglm_requests_rejected_total{reason="unauthorized"} 1.0' in metrics
    assert "autoglm_requests_admitted_total 1.0" in metrics
