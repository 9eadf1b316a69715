"""GET /metrics (vllm:* and autoglm_*), and the sim's own engine statistics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from testkit.sim.engine import SimEngine

router = APIRouter()


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    # Two registries: the process-wide one (autoglm_*) and this sim's (vllm:*).
    body = generate_latest(REGISTRY) + generate_latest(request.app.state.metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get("/sim/v1/stats")
async def stats(request: Request) -> dict[str, Any]:
    engine: SimEngine = request.app.state.engine_client
    return {
        "running": len(engine.running),
        "waiting": len(engine.waiting),
        "kvUsedTokens": engine.kv_used,
        "steps": engine.steps,
        "gpuMemoryUsedBytes": engine.memory_used_bytes(),
        "peakGpuMemoryUsedBytes": engine.peak_memory_bytes,
    }


@router.post("/sim/v1/stats/reset")
async def reset_stats(request: Request) -> dict[str, Any]:
    engine: SimEngine = request.app.state.engine_client
    engine.peak_memory_bytes = engine.memory_used_bytes()
    return {"peakGpuMemoryUsedBytes": engine.peak_memory_bytes}
