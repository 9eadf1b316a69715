"""The clients users run, against a real vLLM engine with the middleware: the phone agent's
turn (think, then answer) comes back split by the engine's glm45 reasoning parser."""

from __future__ import annotations

import base64
import io
import json

import pytest
from langchain_core.messages import AIMessageChunk, HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI, OpenAI
from PIL import Image

from autoglm_api.image_budget import MAX_PIXELS_CEILING, image_tokens
from autoglm_api.paths import CHAT_PATH
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from autoglm_router.features import prefill_tokens
from autoglm_router.scan import scan_request
from testkit.engine import MODEL, OPENAI_TIMEOUT, Engine

pytestmark = pytest.mark.timeout(300)

SYSTEM = "You are a phone agent. Each step you see the screen and answer with one action."
TASK = "Open the settings app and turn on wifi."


def screenshot(width: int, height: int) -> str:
    """A phone screenshot as the agent sends it: an inline PNG."""
    image = Image.new("RGB", (width, height), (236, 239, 241))
    image.paste((33, 150, 243), (0, 0, width, height // 12))  # a status bar
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def agent_messages(width: int = 540, height: int = 1200) -> list[dict]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [
            {"type": "text", "text": TASK},
            {"type": "image_url", "image_url": {"url": screenshot(width, height)}},
        ]},
    ]  # fmt: skip


def think_and_action(answer: dict[str, str]) -> tuple[str, str]:
    turn = answer["answer"]
    think = turn.split("<think>", 1)[1].split("</think>", 1)[0]
    return think, turn.split("</think>", 1)[1]


def test_openai_text_chat_splits_reasoning_and_stops(engine: Engine, answer: dict) -> None:
    think, action = think_and_action(answer)
    client = OpenAI(base_url=f"{engine.base_url}/v1", api_key="EMPTY", timeout=OPENAI_TIMEOUT)
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": SYSTEM},
                               {"role": "user", "content": TASK}],
        max_tokens=128, temperature=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "stop", "the model ends its turn before max_tokens"
    assert choice.message.content == action
    assert choice.message.model_extra["reasoning"] == think
    assert response.usage.completion_tokens < 128


def test_openai_streamed_text_chat_is_the_same_turn(engine: Engine, answer: dict) -> None:
    think, action = think_and_action(answer)
    client = OpenAI(base_url=f"{engine.base_url}/v1", api_key="EMPTY", timeout=OPENAI_TIMEOUT)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": TASK}], max_tokens=128,
        temperature=0, stream=True, stream_options={"include_usage": True},
    )
    content, reasoning, finish, chunks, usage = "", "", None, 0, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            chunks += 1
            content += choice.delta.content or ""
            reasoning += (choice.delta.model_extra or {}).get("reasoning") or ""
            finish = choice.finish_reason or finish
    assert (reasoning, content, finish) == (think, action, "stop")
    assert chunks > 5, "tokens arrive as they are generated, not in one piece"
    assert usage is not None and usage.completion_tokens > 5


def default_budget() -> int:
    """The pixels per image the operator's defaults give the engine (image_budget.py)."""
    spec = AutoGLMDeploymentSpec()
    return spec.multimodal.effective_max_pixels(spec.max_model_len)


async def test_openai_screenshot_costs_its_image_tokens(engine: Engine, answer: dict) -> None:
    think, action = think_and_action(answer)
    client = AsyncOpenAI(base_url=f"{engine.base_url}/v1", api_key="EMPTY",
                         timeout=OPENAI_TIMEOUT)
    response = await client.chat.completions.create(
        model=MODEL, messages=agent_messages(540, 1200), max_tokens=128, temperature=0)
    # The engine's processor scales 540x1200 to the budget; the rest is the text.
    image = image_tokens(540, 1200, default_budget())
    assert image < response.usage.prompt_tokens < image + 60
    assert response.choices[0].message.content == action
    assert response.choices[0].message.model_extra["reasoning"] == think

    stream = await client.chat.completions.create(
        model=MODEL, messages=agent_messages(540, 1200), max_tokens=128, temperature=0,
        stream=True)
    streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert streamed == action


def test_a_native_screenshot_fits_the_default_context_scaled_to_the_budget(
    engine: Engine,
) -> None:
    """1080x2400 is 3354 image tokens unscaled, over --max-model-len 2048 alone; the operator's
    default max_pixels has the engine's processor scale it to fit beside the default completion."""
    assert image_tokens(1080, 2400, MAX_PIXELS_CEILING) == 3354
    client = OpenAI(base_url=f"{engine.base_url}/v1", api_key="EMPTY", timeout=OPENAI_TIMEOUT)
    response = client.chat.completions.create(
        model=MODEL, messages=agent_messages(1080, 2400), max_tokens=16)
    image = image_tokens(1080, 2400, default_budget())
    assert image < response.usage.prompt_tokens < image + 60
    assert response.usage.prompt_tokens + 512 <= 2048


def langchain_client(engine: Engine) -> ChatOpenAI:
    # The exact call of the deployment this project grew out of.
    return ChatOpenAI(model="autoglm-phone-9b", base_url=f"{engine.base_url}/v1",
                      api_key="EMPTY", streaming=True, temperature=0, max_tokens=128,
                      extra_body={"enable_thinking": True, "return_reasoning": True})


def test_langchain_invoke_and_stream(engine: Engine, answer: dict) -> None:
    _, action = think_and_action(answer)
    chat = langchain_client(engine)
    messages = [SystemMessage(SYSTEM), HumanMessage(TASK)]
    assert chat.invoke(messages).content == action
    chunks = list(chat.stream(messages))
    assert len(chunks) > 5
    assert "".join(str(c.content) for c in chunks) == action


async def test_langchain_astream_with_a_screenshot(engine: Engine, answer: dict) -> None:
    _, action = think_and_action(answer)
    chat = langchain_client(engine)
    message = HumanMessage(content=[
        {"type": "text", "text": TASK},
        {"type": "image_url", "image_url": {"url": screenshot(540, 1200)}},
    ])
    total: AIMessageChunk | None = None
    async for chunk in chat.astream([SystemMessage(SYSTEM), message]):
        total = chunk if total is None else total + chunk
    assert total is not None and total.content == action


def test_thinking_off_prefills_an_empty_think_block(engine: Engine) -> None:
    """enable_thinking=False reaches the chat template (the middleware moves LangChain's extra
    into chat_template_kwargs): the prompt grows by the pre-filled `<think></think>`."""
    client = OpenAI(base_url=f"{engine.base_url}/v1", api_key="EMPTY", timeout=OPENAI_TIMEOUT)

    def prompt_tokens(enable_thinking: bool) -> int:
        response = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": TASK}], max_tokens=4,
            extra_body={"enable_thinking": enable_thinking})
        return response.usage.prompt_tokens

    assert prompt_tokens(False) == prompt_tokens(True) + 2


@pytest.mark.parametrize(("width", "height"), [(540, 1200), (1080, 2400), (720, 1600)])
def test_the_routers_prefill_estimate_is_within_ten_percent_of_the_engines_count(
    engine: Engine, width: int, height: int
) -> None:
    """The router prices a request (features.prefill_tokens, through the body scan it runs)
    before any replica sees it; the engine's own count is the truth."""
    messages = agent_messages(width, height)
    body = {"model": MODEL, "messages": messages, "max_tokens": 4}
    estimate = prefill_tokens(CHAT_PATH, scan_request(json.dumps(body).encode()),
                              default_budget())  # fmt: skip
    client = OpenAI(base_url=f"{engine.base_url}/v1", api_key="EMPTY", timeout=OPENAI_TIMEOUT)
    counted = client.chat.completions.create(**body).usage.prompt_tokens
    print(f"{width}x{height}: router {estimate:.0f}, engine {counted} tokens")
    assert abs(estimate - counted) <= 0.10 * counted
