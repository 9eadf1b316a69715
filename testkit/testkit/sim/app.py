"""The sim's OpenAI-compatible server: the API surface of `vllm serve`, backed by `SimEngine`.

create_app builds the engine's settings and lifespan and mounts one router per feature
(`sim/serve/`: health, models, metrics, chat, completions). It loads `ModeMiddleware` exactly as
vLLM 0.32 does (`app.add_middleware`), so the middleware under test is the one that runs in
production.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response

from autoglm_api import engine_args
from autoglm_api.image_budget import max_pixels_for
from autoglm_runtime.config import RuntimeSettings, load_runtime_config
from autoglm_runtime.metrics import runtime_metrics
from autoglm_runtime.middleware import ModeMiddleware
from autoglm_runtime.requests import error_body
from testkit.sim.engine import EngineConfig, SimEngine
from testkit.sim.metrics import SimMetrics
from testkit.sim.serve import ROUTERS
from testkit.sim.serve.common import SimContext, SimError
from testkit.sim.settings import SimSettings

__all__ = ["SimError", "SimSettings", "create_app"]


def create_app(settings: SimSettings | None = None) -> FastAPI:
    settings = settings or SimSettings()
    runtime = load_runtime_config(settings.runtime or RuntimeSettings())
    image_max_pixels = (engine_args.image_max_pixels(runtime.engine) if runtime.engine
                        else max_pixels_for(runtime.max_model_len, engine_args.DEFAULT_MAX_TOKENS))
    context = SimContext(runtime.served_model_name, runtime.max_model_len, settings,
                         image_max_pixels)
    if settings.kv_cache_tokens < context.max_model_len:
        raise ValueError("kv_cache_tokens must hold at least one full context (max_model_len)")
    engine_config = EngineConfig(
        max_num_seqs=settings.max_num_seqs or runtime.profiles.envelope_max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        kv_cache_tokens=settings.kv_cache_tokens,
        enable_prefix_caching=settings.enable_prefix_caching,
        time_factor=settings.time_factor,
        latency=settings.latency,
        memory=settings.memory,
        enable_sleep_mode=settings.enable_sleep_mode,
        sleep=settings.sleep,
    )
    app = FastAPI(title="testkit.sim", lifespan=_lifespan(context, engine_config))
    app.state.sim = context
    if settings.with_middleware:
        runtime_settings = settings.runtime
        if settings.max_num_seqs is not None:
            # As the launcher tells vLLM's middleware the engine's own --max-num-seqs.
            runtime_settings = (runtime_settings or RuntimeSettings()).model_copy(
                update={"engine_max_num_seqs": settings.max_num_seqs})
        if runtime_settings is None:
            app.add_middleware(ModeMiddleware)  # the way vLLM's --middleware loads it
        else:
            app.add_middleware(ModeMiddleware, settings=runtime_settings)
    app.add_exception_handler(SimError, _sim_error)
    for router in ROUTERS:
        app.include_router(router)
    return app


def _lifespan(
    context: SimContext, engine_config: EngineConfig
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The engine runs while the app does; the model 'loads' for model_load_seconds."""
    settings = context.settings

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        metrics = SimMetrics.create(context.served, context.max_model_len)
        engine = SimEngine(engine_config, metrics)
        # Where vLLM keeps its engine client, which the middleware sleeps and wakes.
        app.state.engine_client = engine
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

    return lifespan


async def _sim_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, SimError)  # the handler is registered for SimError only
    return Response(
        error_body(exc.message, exc.status, exc.param),
        status_code=exc.status,
        media_type="application/json",
    )
