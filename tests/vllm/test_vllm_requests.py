"""What real clients send reaches vLLM's handler as requests vLLM's own models know, with the
mode's priority, in both modes: the seed LangChain client, a chat with an image, a completion."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx
import openai
import pytest
from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from prometheus_client import REGISTRY
from vllm_kit import BASE_URL, Serve, Served

from autoglm_api.profiles import Mode
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec

MODEL = "autoglm-phone-9b"
ANSWER = "Tap the search box and type."
SCREENSHOT = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNk+A8AAQUBAScY42YAAAAASUVORK5CYII="  # noqa: E501
THINKING = {"enable_thinking": True, "return_reasoning": True}
# A client trying to jump the queue: vLLM 0.32 takes this header over the body's priority.
JUMP = {"X-Vllm-Priority": "-100"}


def mode_priority(mode: Mode, stream: bool) -> int:
    """docs/runtime/requests.md: streaming mode serves streamed requests first."""
    if mode is Mode.STREAMING:
        return 0 if stream else 1
    return 0


def http_client(served: Served) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=served.transport())


async def seed_client(served: Served, headers: dict[str, str]) -> bool:
    """The reference deployment's client call, verbatim apart from the transport."""
    llm = ChatOpenAI(model=MODEL, base_url=f"{BASE_URL}/v1", api_key="EMPTY", streaming=True,
                     extra_body=THINKING, default_headers=headers,
                     http_async_client=http_client(served))
    reply = await llm.ainvoke([HumanMessage("Open the settings app.")])
    assert reply.content == ANSWER
    return True


async def image_chat(served: Served, headers: dict[str, str]) -> bool:
    client = openai.AsyncOpenAI(base_url=f"{BASE_URL}/v1", api_key="EMPTY",
                                default_headers=headers, http_client=http_client(served))
    content = [
        {"type": "text", "text": "What should I tap?"},
        {"type": "image_url", "image_url": {"url": SCREENSHOT}},
    ]
    reply = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}]  # type: ignore[misc,list-item]
    )
    assert reply.choices[0].message.content == ANSWER
    return False


async def completion(served: Served, headers: dict[str, str]) -> bool:
    client = openai.AsyncOpenAI(base_url=f"{BASE_URL}/v1", api_key="EMPTY",
                                default_headers=headers, http_client=http_client(served))
    reply = await client.completions.create(model=MODEL, prompt="Tap", max_tokens=16,
                                            extra_body=THINKING)
    assert reply.choices[0].text == ANSWER
    return False


Client = Callable[[Served, dict[str, str]], Awaitable[bool]]
CLIENTS: dict[str, Client] = {
    "seed-langchain-stream": seed_client, "image-chat": image_chat, "completions": completion,
}


@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize("name", list(CLIENTS))
async def test_the_request_reaches_vllm_with_only_fields_vllm_knows(
    serve: Serve, name: str, mode: Mode
) -> None:
    served = serve(mode=mode)
    stream = await CLIENTS[name](served, {})
    [seen] = served.serving.seen
    assert seen.request.model_extra == {}, f"vLLM ignores {sorted(seen.request.model_extra or {})}"
    assert seen.request.stream is stream
    assert seen.body["max_tokens"] == (16 if name == "completions" else 512)
    assert seen.priority == mode_priority(mode, stream)
    if name == "seed-langchain-stream":
        assert seen.request.chat_template_kwargs == {"enable_thinking": True}
        assert seen.request.include_reasoning is True


@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize("name", list(CLIENTS))
async def test_a_client_priority_header_does_not_jump_the_queue(
    serve: Serve, name: str, mode: Mode
) -> None:
    served = serve(mode=mode)
    stream = await CLIENTS[name](served, JUMP)
    [seen] = served.serving.seen
    assert seen.priority == mode_priority(mode, stream)


async def test_session_id_reaches_vllm_and_is_echoed(serve: Serve) -> None:
    served = serve()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "session_id": "conv-7"}
    response = await served.client.post("/v1/chat/completions", json=body,
                                         headers={"X-Session-ID": "from-header"})
    assert response.status_code == 200, response.text
    assert response.headers["x-autoglm-session-id"] == "conv-7"
    [seen] = served.serving.seen
    assert seen.request.session_id == "conv-7"
    assert seen.session_id == "conv-7"  # vLLM: the body first, then the header


async def test_a_header_session_id_reaches_vllm(serve: Serve) -> None:
    served = serve()
    body = {"model": MODEL, "prompt": "hi"}
    response = await served.client.post("/v1/completions", json=body,
                                         headers={"X-Session-ID": "conv-8"})
    assert response.status_code == 200, response.text
    assert served.serving.seen[0].session_id == "conv-8"


async def test_a_session_id_that_is_not_a_string_is_refused(serve: Serve) -> None:
    served = serve()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "session_id": 7}
    response = await served.client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "session_id"
    assert served.serving.seen == []


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_a_request_without_the_api_key_takes_no_slot(serve: Serve, path: str) -> None:
    spec = AutoGLMDeploymentSpec.model_validate(
        {"apiKeySecretRef": {"name": "autoglm-api-key", "key": "key"}}
    )
    served = serve(spec, api_key="client-key")
    body: dict[str, object] = (
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]} if "chat" in path
        else {"model": MODEL, "prompt": "hi"}
    )
    admitted = sample("autoglm_requests_admitted_total")
    unauthorized = sample("autoglm_requests_rejected_total", {"reason": "unauthorized"})
    for headers in ({}, {"authorization": "Bearer wrong-key"}):
        response = await served.client.post(path, json=body, headers=headers)
        assert response.status_code == 401
        assert response.json() == {"error": "Unauthorized"}  # vLLM's own 401
    assert sample("autoglm_requests_admitted_total") == admitted
    assert sample("autoglm_requests_rejected_total", {"reason": "unauthorized"}) == (
        unauthorized + 2
    )
    ok = await served.client.post(path, json=body,
                                  headers={"authorization": "Bearer client-key"})
    assert ok.status_code == 200, ok.text
    assert sample("autoglm_requests_admitted_total") == admitted + 1
