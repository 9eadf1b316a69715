"""SSE coalescing on vLLM's own StreamingResponse: events stay whole and in order, and each
write carries as many events as the mode's profile says."""

from __future__ import annotations

import json

import pytest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionStreamResponse
from vllm.entrypoints.openai.completion.protocol import CompletionStreamResponse
from vllm_kit import RecordingServing, Serve

from autoglm_api.profiles import Mode
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec

ANSWER = "".join(RecordingServing.TOKENS)
EVENTS = len(RecordingServing.TOKENS) + 1  # a chunk per token, then [DONE]


def events_of(write: bytes) -> list[str]:
    text = write.decode()
    assert text.endswith("\n\n"), f"a write ends inside an event: {text!r}"
    return [event for event in text.split("\n\n") if event]


def expected_groups(per_write: int) -> list[int]:
    """Full groups of `per_write` events; [DONE] flushes whatever is left with it."""
    full, rest = divmod(EVENTS, per_write)
    return [per_write] * full + ([rest] if rest else [])


def check_stream(writes: list[bytes], chat: bool) -> list[int]:
    """Every event is a whole `data:` line vLLM's own stream model reads; returns the grouping."""
    groups = [events_of(write) for write in writes]
    events = [event for group in groups for event in group]
    assert events[-1] == "data: [DONE]"
    model = ChatCompletionStreamResponse if chat else CompletionStreamResponse
    chunks = [model.model_validate(json.loads(e.removeprefix("data: "))) for e in events[:-1]]
    text = "".join((c.choices[0].delta.content or "") if chat else c.choices[0].text
                   for c in chunks)  # type: ignore[union-attr]
    assert text == ANSWER
    return [len(group) for group in groups]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("mode", list(Mode))
async def test_streams_are_grouped_as_the_profile_says(serve: Serve, mode: Mode,
                                                       path: str) -> None:
    spec = AutoGLMDeploymentSpec()
    served = serve(spec, mode=mode)
    chat = "chat" in path
    body: dict[str, object] = {"model": spec.model.served_name, "stream": True}
    body |= {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"}
    response = await served.client.post(path, json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    grouping = check_stream(served.writes.writes, chat)
    per_write = spec.profiles.for_mode(mode).stream_coalesce_chunks
    assert grouping == expected_groups(per_write)
    if mode is Mode.BATCHING:
        assert per_write > 1, "the default batching profile coalesces"


async def test_under_rolling_the_engine_coalesces_and_the_middleware_does_not(
    serve: Serve,
) -> None:
    # vLLM's --stream-interval already puts several tokens in each chunk; the middleware must
    # not group those chunks again.
    spec = AutoGLMDeploymentSpec.model_validate({"switchStrategy": "Rolling"})
    served = serve(spec, mode=Mode.BATCHING)
    body = {"model": spec.model.served_name, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    assert (await served.client.post("/v1/chat/completions", json=body)).status_code == 200
    assert check_stream(served.writes.writes, chat=True) == [1] * EVENTS
