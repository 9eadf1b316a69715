"""What every sim route shares: the app's context, request parsing, sampling, SSE framing."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import Request

from testkit.sim.engine import SimEngine, SimRequest
from testkit.sim.tokens import natural_length

if TYPE_CHECKING:
    from testkit.sim.settings import SimSettings


class SimError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


@dataclass(frozen=True)
class SimContext:
    """What create_app settled for one app: the served name, the context, the settings."""

    served: str
    max_model_len: int
    settings: SimSettings
    image_max_pixels: int  # the engine's pixel budget per image (--mm-processor-kwargs)


@dataclass
class Prompt:
    token_ids: list[int]
    images: int
    seed: str
    image_ends: tuple[int, ...] = ()  # where each image's placeholder tokens end
    image_tokens: tuple[int, ...] = ()  # each image's placeholder tokens

    @property
    def tokens(self) -> int:
        return len(self.token_ids)


def context_of(request: Request) -> SimContext:
    context: SimContext = request.app.state.sim
    return context


def engine_of(request: Request) -> SimEngine:
    if not request.app.state.loaded.is_set():
        raise SimError("The model is still loading.", status=503)
    engine: SimEngine = request.app.state.engine_client
    return engine


async def read_json(request: Request) -> dict[str, Any]:
    try:
        data = json.loads(await request.body())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise SimError("The request body is not valid JSON.") from None
    if not isinstance(data, dict):
        raise SimError("The request body must be a JSON object.")
    served = context_of(request).served
    if data.get("model") not in (None, served):
        raise SimError(f"The model `{data['model']}` does not exist.", "model", 404)
    return data


def _integers(body: dict[str, Any]) -> None:
    for name in ("max_tokens", "max_completion_tokens", "min_tokens", "priority"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise SimError(f"`{name}` must be an integer.", name)


def sampling(body: dict[str, Any], prompt: Prompt, max_model_len: int) -> tuple[int, str]:
    """(tokens to generate, finish reason), clamped to the context as vLLM does."""
    if prompt.tokens >= max_model_len:
        raise SimError(
            f"This model's maximum context length is {max_model_len} tokens. However, "
            f"your prompt contains {prompt.tokens} input tokens. Please reduce the length "
            f"of the input prompt.", "input_tokens",
        )  # fmt: skip
    _integers(body)
    n = body.get("n", 1)
    if n not in (None, 1):
        raise SimError("The sim supports only n=1.", "n")
    requested = body.get("max_completion_tokens") or body.get("max_tokens")
    if requested is not None and requested < 1:
        raise SimError("`max_tokens` must be at least 1.", "max_tokens")
    cap = max_model_len - prompt.tokens
    if requested is not None:
        cap = min(cap, requested)
    min_tokens = body.get("min_tokens") or 0
    if min_tokens < 0:
        raise SimError("`min_tokens` must not be negative.", "min_tokens")
    if body.get("ignore_eos") is True:
        return cap, "length"
    length = max(natural_length(prompt.seed), min_tokens)
    return (cap, "length") if length >= cap else (length, "stop")


async def run(request: Request, body: dict[str, Any], prompt: Prompt) -> SimRequest:
    """Admit one request to the engine after its preprocessing time."""
    engine, context = engine_of(request), context_of(request)
    target, reason = sampling(body, prompt, context.max_model_len)
    priority = body.get("priority") or 0
    await engine.receive()
    sim_request = SimRequest(
        priority=priority, prompt_tokens=prompt.tokens, images=prompt.images,
        target_tokens=target, finish_reason=reason, arrival=engine.clock(),
        token_ids=prompt.token_ids, image_ends=prompt.image_ends,
        image_tokens=prompt.image_tokens,
    )  # fmt: skip
    await engine.admit(sim_request)
    return sim_request


def stream_wanted(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream") is True
    options = body.get("stream_options")
    usage = isinstance(options, dict) and options.get("include_usage") is True
    return stream, usage


async def drain(engine: SimEngine, sim_request: SimRequest, request: Request) -> None:
    """Wait for the whole answer; abort it if the client leaves first, as vLLM does."""

    async def finished() -> None:
        while await sim_request.tokens.get() is not None:
            pass

    async def client_gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    done = asyncio.ensure_future(finished())
    gone = asyncio.ensure_future(client_gone())
    try:
        await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not done.done():
            engine.abort(sim_request)
            done.cancel()
        gone.cancel()


def finish_of(sim_request: SimRequest) -> str:
    if sim_request.generated >= sim_request.target_tokens:
        return sim_request.finish_reason
    return "abort"


def usage_of(sim_request: SimRequest) -> dict[str, int]:
    return {
        "prompt_tokens": sim_request.prompt_tokens,
        "completion_tokens": sim_request.generated,
        "total_tokens": sim_request.prompt_tokens + sim_request.generated,
    }


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
