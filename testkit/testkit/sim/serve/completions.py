"""POST /v1/completions: a prompt string or token ids, streamed or whole."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

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
from testkit.sim.tokens import generate, text_token_ids

router = APIRouter()


def completion_prompt(body: dict[str, Any]) -> Prompt:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return Prompt(text_token_ids(prompt), 0, prompt)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return Prompt(text_token_ids(prompt[0]), 0, prompt[0])
    if isinstance(prompt, list) and prompt and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    ):
        return Prompt(list(prompt), 0, str(prompt))
    raise SimError("`prompt` must be a string or a list of token ids.", "prompt")


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    engine = engine_of(request)
    served = context_of(request).served
    body = await read_json(request)
    prompt = completion_prompt(body)
    stream, usage = stream_wanted(body)
    sim_request = await run(request, body, prompt)
    tokens = generate(prompt.seed, sim_request.target_tokens, 0)
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    head = {"id": rid, "object": "text_completion", "created": created, "model": served}
    if not stream:
        await drain(engine, sim_request, request)
        text = "".join(t for _, t in tokens[: sim_request.generated])
        return JSONResponse({**head, "choices": [{
            "index": 0, "text": text, "logprobs": None,
            "finish_reason": finish_of(sim_request), "stop_reason": None}],
            "usage": usage_of(sim_request)})  # fmt: skip

    async def text_stream() -> AsyncIterator[bytes]:
        try:
            while (count := await sim_request.tokens.get()) is not None:
                last = count >= sim_request.target_tokens
                yield sse({**head, "choices": [{
                    "index": 0, "text": tokens[count - 1][1], "logprobs": None,
                    "finish_reason": finish_of(sim_request) if last else None}]})  # fmt: skip
            if usage:
                yield sse({**head, "choices": [], "usage": usage_of(sim_request)})
            yield b"data: [DONE]\n\n"
        finally:
            engine.abort(sim_request)

    return StreamingResponse(text_stream(), media_type="text/event-stream")
