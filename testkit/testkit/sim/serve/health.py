"""GET /health: 200 once the model is loaded, 503 before (what kubelet probes)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from autoglm_runtime.requests import error_body

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> Response:
    if not request.app.state.loaded.is_set():
        return Response(error_body("The model is still loading.", 503), 503,
                        media_type="application/json")  # fmt: skip
    return Response(status_code=200)
