"""GET /v1/models: the one served model, as vLLM lists it."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request

from testkit.sim.serve.common import context_of, engine_of

router = APIRouter()


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    engine_of(request)
    context = context_of(request)
    return {
        "object": "list",
        "data": [{
            "id": context.served, "object": "model", "created": int(time.time()),
            "owned_by": "vllm", "root": context.served, "parent": None,
            "max_model_len": context.max_model_len,
        }],
    }  # fmt: skip
