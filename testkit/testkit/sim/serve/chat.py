"""POST /v1/chat/completions: text and image parts, thinking, streamed or whole."""

from __future__ import annotations

import base64
import binascii
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from autoglm_api.engine_args import DEFAULT_MAX_TOKENS
from autoglm_api.image_budget import RefusedImage, max_pixels_for
from testkit.sim.engine import SimEngine, SimRequest
from testkit.sim.serve.common import (
    Prompt,
    SimError,
    context_of,
    drain,
    engine_of,
    finish_of,
    read_json,
    run,
    sse,
    stream_wanted,
    usage_of,
)
from testkit.sim.tokens import (
    generate,
    image_prompt_tokens,
    image_token_ids,
    message_token_ids,
    text_token_ids,
)

# The engine's pixel budget per image at the default context, as the operator sets it.
DEFAULT_IMAGE_MAX_PIXELS = max_pixels_for(2048, DEFAULT_MAX_TOKENS)
# Share of the answer spent thinking when enable_thinking is on.
REASONING_SHARE = 0.4

router = APIRouter()


def chat_prompt(body: dict[str, Any], image_max_pixels: int = DEFAULT_IMAGE_MAX_PIXELS) -> Prompt:
    """The rendered prompt's token ids: messages in order, each role-tagged, images in place,
    each as many tokens as the engine's processor makes of it at `image_max_pixels`."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise SimError("`messages` must be a non-empty list.", "messages")
    ids: list[int] = []
    image_ends: list[int] = []
    image_sizes: list[int] = []
    texts: list[str] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise SimError("Each message needs a string `role`.", "messages")
        ids += message_token_ids(message["role"])
        content = message.get("content")
        if content is None or isinstance(content, str):
            texts.append(content or "")
            ids += text_token_ids(content or "")
            continue
        if not isinstance(content, list):
            raise SimError("`content` must be a string or a list of parts.", "messages")
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
                ids += text_token_ids(part["text"])
            elif kind == "image_url":
                url = check_image(part.get("image_url"))
                try:
                    count = image_prompt_tokens(url, image_max_pixels)
                except RefusedImage as exc:
                    raise SimError(str(exc), "messages") from None
                ids += image_token_ids(url, count)
                image_ends.append(len(ids))
                image_sizes.append(count)
            else:
                raise SimError("Content parts must be `text` or `image_url`.", "messages")
    return Prompt(ids, len(image_ends), "\n".join(texts), tuple(image_ends), tuple(image_sizes))


def check_image(image: Any) -> str:
    url = image.get("url") if isinstance(image, dict) else None
    if not isinstance(url, str) or not url:
        raise SimError("`image_url.url` must be a non-empty string.", "messages")
    if url.startswith("data:"):
        header, _, payload = url.partition(",")
        if not header.endswith(";base64") or not payload:
            raise SimError("Image data URLs must be base64 encoded.", "messages")
        try:
            base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise SimError("The image data is not valid base64.", "messages") from None
    elif not url.startswith(("http://", "https://")):
        raise SimError("Image URLs must be http(s) or data URLs.", "messages")
    # The sim never fetches remote images: no network from tests.
    return url


def thinking(body: dict[str, Any]) -> tuple[bool, bool]:
    kwargs = body.get("chat_template_kwargs")
    enabled = isinstance(kwargs, dict) and kwargs.get("enable_thinking") is True
    include = body.get("include_reasoning", True) is not False
    return enabled, include


@router.post("/v1/chat/completions")
async def chat(request: Request) -> Response:
    engine = engine_of(request)
    served = context_of(request).served
    body = await read_json(request)
    prompt = chat_prompt(body, context_of(request).image_max_pixels)
    enabled, include = thinking(body)
    stream, usage = stream_wanted(body)
    sim_request = await run(request, body, prompt)
    reasoning = int(sim_request.target_tokens * REASONING_SHARE) if enabled else 0
    tokens = generate(prompt.seed, sim_request.target_tokens, reasoning)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": served}  # fmt: skip
    if stream:
        return StreamingResponse(
            chat_stream(engine, sim_request, tokens, include, usage, head),
            media_type="text/event-stream",
        )
    await drain(engine, sim_request, request)
    content = "".join(t for k, t in tokens[: sim_request.generated] if k == "content")
    thought = "".join(t for k, t in tokens[: sim_request.generated] if k == "reasoning")
    message: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": []}
    if include and enabled:
        message["reasoning"] = thought
        message["reasoning_content"] = thought  # the pre-0.10 name many clients still read
    return JSONResponse({
        **head, "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": finish_of(sim_request), "stop_reason": None}],
        "usage": usage_of(sim_request),
    })  # fmt: skip


async def chat_stream(
    engine: SimEngine, sim_request: SimRequest, tokens: list[tuple[str, str]],
    include: bool, usage: bool, head: dict[str, Any],
) -> AsyncIterator[bytes]:  # fmt: skip
    try:
        yield sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                              "content": ""},
                                        "logprobs": None, "finish_reason": None}]})  # fmt: skip
        while (count := await sim_request.tokens.get()) is not None:
            kind, text = tokens[count - 1]
            if kind == "reasoning" and not include:
                continue
            delta = {"content": text} if kind == "content" else {
                "reasoning": text, "reasoning_content": text}  # fmt: skip
            last = count >= sim_request.target_tokens
            yield sse({**head, "choices": [{
                "index": 0, "delta": delta, "logprobs": None,
                "finish_reason": finish_of(sim_request) if last else None}]})  # fmt: skip
        if sim_request.generated < sim_request.target_tokens or (
            tokens and tokens[-1][0] == "reasoning" and not include
        ):
            yield sse({**head, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                            "finish_reason": finish_of(sim_request)}]})  # fmt: skip
        if usage:
            yield sse({**head, "choices": [], "usage": usage_of(sim_request)})
        yield b"data: [DONE]\n\n"
    finally:
        engine.abort(sim_request)  # no-op once finished; frees the slot on disconnect
