"""ASGI-level fixtures: the middleware around a fake engine app, no sockets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_kit import FakeEngine, FakeEngineClient, Host, MakeClient
from prometheus_client import CollectorRegistry

from autoglm_runtime.config import RuntimeSettings
from autoglm_runtime.middleware import ModeMiddleware


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def engine_client() -> FakeEngineClient:
    return FakeEngineClient()


@pytest.fixture
def make_client(tmp_path: Path, engine: FakeEngine,
                engine_client: FakeEngineClient) -> MakeClient:
    """Build (middleware, client) with a fresh registry and optional config/labels/settings;
    the client reaches the middleware through a Host holding `engine_client`."""
    def make(config: dict[str, Any] | None = None, labels: str | None = None,
             **kwargs: Any) -> tuple[ModeMiddleware, httpx.AsyncClient]:
        config_file = tmp_path / "config.json"
        config_file.write_text(json.dumps(config or {}))
        labels_file = tmp_path / "labels"
        labels_file.write_text(labels or "")
        settings = RuntimeSettings(config_file=config_file, labels_file=labels_file,
                                   gpu_metrics=False, **kwargs)
        middleware = ModeMiddleware(engine, settings, registry=CollectorRegistry())
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=Host(middleware, engine_client)),
            base_url="http://test")
        return middleware, client

    return make


