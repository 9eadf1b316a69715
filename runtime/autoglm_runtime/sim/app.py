"""The sim's OpenAI-compatible server: the API surface of `vllm serve`, backed by `SimEngine`.

It loads `ModeMiddleware` exactly as vLLM 0.33 does (`app.add_middleware`), so the middleware
under test is the one that runs in production.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from autoglm_runtime.config import RuntimeSettings, load_runtime_config
from autoglm_runtime.metrics import runtime_metrics
from autoglm_runtime.middleware import ModeMiddleware
from autoglm_runtime.requests import error_body
from autoglm_runtime.sim.engine import EngineConfig, SimEngine, SimRequest
from autoglm_runtime.sim.metrics import SimMetrics
from autoglm_runtime.sim.model import IMAGE_TOKENS, LatencyModel, MemoryModel
from autoglm_runtime.sim.tokens import (
    MESSAGE_OVERHEAD_TOKENS,
    count_text_tokens,
    generate,
    natural_length,
)

# Share of the answer spent thinking when enable_thinking is on.
REASONING_SHARE = 0.4


@dataclass(frozen=True)
class SimSettings:
    time_factor: float = 1.0
    model_load_seconds: float = 0.0
    max_num_seqs: int | None = None  # None: the profiles' envelope, as the operator sets it
    max_num_batched_tokens: int = 2048
    kv_cache_tokens: int = 65536
    with_middleware: bool = True
    runtime: RuntimeSettings | None = None  # None: the middleware reads the environment
    latency: LatencyModel = field(default_factory=LatencyModel)
    memory: MemoryModel = field(default_factory=MemoryModel)

    def __post_init__(self) -> None:
        if self.time_factor <= 0:
            raise ValueError("time_factor must be above 0")


class SimError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


@dataclass
class _Prompt:
    tokens: int
    images: int
    seed: str


def create_app(settings: SimSettings | None = None) -> FastAPI:
    settings = settings or SimSettings()
    runtime = load_runtime_config(settings.runtime or RuntimeSettings())
    served = runtime.served_model_name
    max_model_len = runtime.max_model_len
    max_num_seqs = settings.max_num_seqs or runtime.profiles.envelope_max_num_seqs
    if settings.kv_cache_tokens < max_model_len:
        raise ValueError("kv_cache_tokens must hold at least one full context (max_model_len)")
    engine_config = EngineConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        kv_cache_tokens=settings.kv_cache_tokens,
        time_factor=settings.time_factor,
        latency=settings.latency,
        memory=settings.memory,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        metrics = SimMetrics.create(served, max_model_len)
        engine = SimEngine(engine_config, metrics)
        app.state.engine = engine
        app.state.metrics = metrics
        app.state.loaded = asyncio.Event()
        gpu = runtime_metrics().gpu
        gpu.source = engine.gpu_memory
        engine.start()

        async def load() -> None:
            await asyncio.sleep(settings.model_load_seconds * settings.time_factor)
            app.state.loaded.set()

        loader = asyncio.create_task(load())
        try:
            yield
        finally:
            loader.cancel()
            if gpu.source == engine.gpu_memory:
                gpu.source = None
            await engine.stop()

    app = FastAPI(title="autoglm-runtime sim", lifespan=lifespan)
    if settings.with_middleware:
        if settings.runtime is None:
            app.add_middleware(ModeMiddleware)  # the way vLLM's --middleware loads it
        else:
            app.add_middleware(ModeMiddleware, settings=settings.runtime)

    def engine_of(request: Request) -> SimEngine:
        if not request.app.state.loaded.is_set():
            raise SimError("The model is still loading.", status=503)
        engine: SimEngine = request.app.state.engine
        return engine

    @app.exception_handler(SimError)
    async def sim_error(_: Request, exc: SimError) -> Response:
        return Response(
            error_body(exc.message, exc.status, exc.param),
            status_code=exc.status,
            media_type="application/json",
        )

    @app.get("/health")
    async def health(request: Request) -> Response:
        if not request.app.state.loaded.is_set():
            return Response(error_body("The model is still loading.", 503), 503,
                            media_type="application/json")
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        engine_of(request)
        return {
            "object": "list",
            "data": [{
                "id": served, "object": "model", "created": int(time.time()),
                "owned_by": "vllm", "root": served, "parent": None,
                "max_model_len": max_model_len,
            }],
        }

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        # Two registries: the process-wide one (autoglm_*) and this sim's (vllm:*).
        body = generate_latest(REGISTRY) + generate_latest(request.app.state.metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/sim/v1/stats")
    async def stats(request: Request) -> dict[str, Any]:
        engine: SimEngine = request.app.state.engine
        return {
            "running": len(engine.running),
            "waiting": len(engine.waiting),
            "kvUsedTokens": engine.kv_used,
            "steps": engine.steps,
            "gpuMemoryUsedBytes": engine.memory_used_bytes(),
            "peakGpuMemoryUsedBytes": engine.peak_memory_bytes,
        }

    @app.post("/sim/v1/stats/reset")
    async def reset_stats(request: Request) -> dict[str, Any]:
        engine: SimEngine = request.app.state.engine
        engine.peak_memory_bytes = engine.memory_used_bytes()
        return {"peakGpuMemoryUsedBytes": engine.peak_memory_bytes}

    async def read_json(request: Request) -> dict[str, Any]:
        try:
            data = json.loads(await request.body())
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise SimError("The request body is not valid JSON.") from None
        if not isinstance(data, dict):
            raise SimError("The request body must be a JSON object.")
        if data.get("model") not in (None, served):
            raise SimError(f"The model `{data['model']}` does not exist.", "model", 404)
        return data

    def sampling(body: dict[str, Any], prompt: _Prompt) -> tuple[int, str]:
        """(tokens to generate, finish reason), clamped to the context as vLLM does."""
        if prompt.tokens >= max_model_len:
            raise SimError(
                f"This model's maximum context length is {max_model_len} tokens. However, "
                f"your prompt contains {prompt.tokens} input tokens. Please reduce the length "
                f"of the input prompt.", "input_tokens",
            )
        for name in ("max_tokens", "max_completion_tokens", "min_tokens", "priority"):
            value = body.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise SimError(f"`{name}` must be an integer.", name)
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

    def chat_prompt(body: dict[str, Any]) -> _Prompt:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise SimError("`messages` must be a non-empty list.", "messages")
        tokens, images, texts = 0, 0, []
        for message in messages:
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise SimError("Each message needs a string `role`.", "messages")
            tokens += MESSAGE_OVERHEAD_TOKENS
            content = message.get("content")
            if content is None or isinstance(content, str):
                text = content or ""
                texts.append(text)
                tokens += count_text_tokens(text)
                continue
            if not isinstance(content, list):
                raise SimError("`content` must be a string or a list of parts.", "messages")
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    texts.append(part["text"])
                    tokens += count_text_tokens(part["text"])
                elif kind == "image_url":
                    check_image(part.get("image_url"))
                    images += 1
                    tokens += IMAGE_TOKENS
                else:
                    raise SimError("Content parts must be `text` or `image_url`.", "messages")
        return _Prompt(tokens=tokens, images=images, seed="\n".join(texts))

    def check_image(image: Any) -> None:
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

    def completion_prompt(body: dict[str, Any]) -> _Prompt:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return _Prompt(count_text_tokens(prompt), 0, prompt)
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            return _Prompt(count_text_tokens(prompt[0]), 0, prompt[0])
        if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            return _Prompt(len(prompt), 0, str(prompt))
        raise SimError("`prompt` must be a string or a list of token ids.", "prompt")

    async def run(engine: SimEngine, body: dict[str, Any], prompt: _Prompt) -> SimRequest:
        target, reason = sampling(body, prompt)
        priority = body.get("priority") or 0
        arrival = time.monotonic()
        seconds = settings.latency.preprocess_seconds(prompt.tokens, prompt.images)
        await asyncio.sleep(seconds * settings.time_factor)
        request = SimRequest(
            priority=priority, prompt_tokens=prompt.tokens, images=prompt.images,
            target_tokens=target, finish_reason=reason, arrival=arrival,
        )
        engine.submit(request)
        return request

    def thinking(body: dict[str, Any]) -> tuple[bool, bool]:
        kwargs = body.get("chat_template_kwargs")
        enabled = isinstance(kwargs, dict) and kwargs.get("enable_thinking") is True
        include = body.get("include_reasoning", True) is not False
        return enabled, include

    def stream_wanted(body: dict[str, Any]) -> tuple[bool, bool]:
        stream = body.get("stream") is True
        options = body.get("stream_options")
        usage = isinstance(options, dict) and options.get("include_usage") is True
        return stream, usage

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        engine = engine_of(request)
        body = await read_json(request)
        prompt = chat_prompt(body)
        enabled, include = thinking(body)
        stream, usage = stream_wanted(body)
        sim_request = await run(engine, body, prompt)
        reasoning = int(sim_request.target_tokens * REASONING_SHARE) if enabled else 0
        tokens = generate(prompt.seed, sim_request.target_tokens, reasoning)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if stream:
            return StreamingResponse(
                chat_stream(engine, sim_request, tokens, include, usage, rid, created),
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
            "id": rid, "object": "chat.completion", "created": created, "model": served,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": finish_of(sim_request), "stop_reason": None}],
            "usage": usage_of(sim_request),
        })

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
        return sim_request.finish_reason if sim_request.generated >= sim_request.target_tokens \
            else "abort"

    def usage_of(sim_request: SimRequest) -> dict[str, int]:
        return {
            "prompt_tokens": sim_request.prompt_tokens,
            "completion_tokens": sim_request.generated,
            "total_tokens": sim_request.prompt_tokens + sim_request.generated,
        }

    def sse(payload: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    async def chat_stream(
        engine: SimEngine, sim_request: SimRequest, tokens: list[tuple[str, str]],
        include: bool, usage: bool, rid: str, created: int,
    ) -> AsyncIterator[bytes]:
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": served}
        try:
            yield sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                  "content": ""},
                                            "logprobs": None, "finish_reason": None}]})
            while (count := await sim_request.tokens.get()) is not None:
                kind, text = tokens[count - 1]
                if kind == "reasoning" and not include:
                    continue
                delta = {"content": text} if kind == "content" else {
                    "reasoning": text, "reasoning_content": text}
                last = count >= sim_request.target_tokens
                yield sse({**head, "choices": [{
                    "index": 0, "delta": delta, "logprobs": None,
                    "finish_reason": finish_of(sim_request) if last else None}]})
            if sim_request.generated < sim_request.target_tokens or (
                tokens and tokens[-1][0] == "reasoning" and not include
            ):
                yield sse({**head, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                                "finish_reason": finish_of(sim_request)}]})
            if usage:
                yield sse({**head, "choices": [], "usage": usage_of(sim_request)})
            yield b"data: [DONE]\n\n"
        finally:
            engine.abort(sim_request)  # no-op once finished; frees the slot on disconnect

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        engine = engine_of(request)
        body = await read_json(request)
        prompt = completion_prompt(body)
        stream, usage = stream_wanted(body)
        sim_request = await run(engine, body, prompt)
        tokens = generate(prompt.seed, sim_request.target_tokens, 0)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": rid, "object": "text_completion", "created": created, "model": served}
        if not stream:
            await drain(engine, sim_request, request)
            text = "".join(t for _, t in tokens[: sim_request.generated])
            return JSONResponse({**head, "choices": [{
                "index": 0, "text": text, "logprobs": None,
                "finish_reason": finish_of(sim_request), "stop_reason": None}],
                "usage": usage_of(sim_request)})

        async def text_stream() -> AsyncIterator[bytes]:
            try:
                while (count := await sim_request.tokens.get()) is not None:
                    last = count >= sim_request.target_tokens
                    yield sse({**head, "choices": [{
                        "index": 0, "text": tokens[count - 1][1], "logprobs": None,
                        "finish_reason": finish_of(sim_request) if last else None}]})
                if usage:
                    yield sse({**head, "choices": [], "usage": usage_of(sim_request)})
                yield b"data: [DONE]\n\n"
            finally:
                engine.abort(sim_request)

        return StreamingResponse(text_stream(), media_type="text/event-stream")

    return app
