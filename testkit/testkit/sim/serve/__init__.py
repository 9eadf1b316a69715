"""The sim's HTTP routers, one per feature, as vLLM's own `entrypoints/serve` splits them."""

from __future__ import annotations

from fastapi import APIRouter

from testkit.sim.serve import chat, completions, health, metrics, models

ROUTERS: tuple[APIRouter, ...] = (
    health.router,
    models.router,
    metrics.router,
    chat.router,
    completions.router,
)
