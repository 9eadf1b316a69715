"""vLLM's own `build_app` with the operator's `--middleware`: where the middleware sits, the
admin relay it serves from vLLM's own lifespan (the API port serves no admin path), and one
/metrics with both vllm:* and autoglm_*."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from vllm_kit import ADMIN_TOKEN, Serve, register_engine_metrics

from autoglm_api.profiles import DRAIN_PATH, MODE_PATH, Mode
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from autoglm_runtime.admin import RelayError, relay_to
from autoglm_runtime.middleware import ModeMiddleware

CHAT = "/v1/chat/completions"


def chat_body() -> dict[str, object]:
    return {"model": "autoglm-phone-9b", "messages": [{"role": "user", "content": "hi"}]}


async def test_the_middleware_is_the_outermost_layer(serve: Serve) -> None:
    served = serve()
    assert isinstance(served.middleware, ModeMiddleware)
    assert served.app.user_middleware[0].cls is ModeMiddleware
    # vLLM's own layers are all inside it.
    inner = [m.cls.__name__ for m in served.app.user_middleware[1:]]
    assert "CORSMiddleware" in inner and "ModeMiddleware" not in inner


async def test_the_admin_api_is_the_launchers_relayed_into_vllms_server(serve: Serve) -> None:
    spec = AutoGLMDeploymentSpec.model_validate(
        {"apiKeySecretRef": {"name": "autoglm-api-key", "key": "key"}}
    )
    served = serve(spec, api_key="client-key")
    client = served.client
    # The API port serves no admin path: 401 without the client key, 404 with it.
    assert (await client.get(MODE_PATH, headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
            ).status_code == 401
    key = {"authorization": "Bearer client-key"}
    for method, path in (("GET", MODE_PATH), ("PUT", MODE_PATH), ("POST", DRAIN_PATH)):
        refused = await client.request(method, path, headers=key, json={"mode": "batching"})
        assert refused.status_code == 404 and "admin port" in refused.text, (method, path)
    # vLLM's environment names the relay socket, never the admin token or its file.
    assert str(served.admin_socket) == os.environ["AUTOGLM_ADMIN_SOCKET"]
    assert not {"AUTOGLM_ADMIN_TOKEN", "AUTOGLM_ADMIN_TOKEN_FILE"} & os.environ.keys()
    assert ADMIN_TOKEN not in os.environ.values()

    call = relay_to(served.admin_socket)
    async with running_lifespan(served.app):
        assert (await call({"op": "state"}))["mode"] == "streaming"
        flipped = await call({"op": "mode", "mode": "batching"})
        assert flipped["mode"] == "batching" and served.middleware.mode is Mode.BATCHING
        assert flipped["profile"]["maxConcurrency"] == 64
        assert (await call({"op": "drain"}))["draining"] is True
        refused = await client.post(CHAT, json=chat_body(), headers=key)
        assert refused.status_code == 503 and served.serving.seen == []
    with pytest.raises(RelayError):
        await call({"op": "state"})  # vLLM's server stopped: the relay with it


async def test_the_mode_the_operator_labels_the_pod_with_is_the_start_mode(serve: Serve) -> None:
    served = serve(mode=Mode.BATCHING)
    async with running_lifespan(served.app):
        state = await relay_to(served.admin_socket)({"op": "state"})
    assert state["mode"] == "batching"


@contextlib.asynccontextmanager
async def running_lifespan(app: FastAPI) -> AsyncIterator[None]:
    """vLLM's app started and stopped through ASGI lifespan messages, as uvicorn does."""
    app.state.log_stats = False  # what init_app_state sets; no engine client to poll here
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    sent: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    task = asyncio.ensure_future(app({"type": "lifespan", "asgi": {"version": "3.0"},
                                      "state": {}}, inbox.get, sent.put))
    await inbox.put({"type": "lifespan.startup"})
    assert (await asyncio.wait_for(sent.get(), 10))["type"] == "lifespan.startup.complete"
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(task, 10)


async def test_metrics_show_autoglm_beside_vllms_own(serve: Serve) -> None:
    spec = AutoGLMDeploymentSpec()
    served = serve(spec)
    register_engine_metrics(spec.model.served_name, spec.max_model_len)
    assert (await served.client.post(CHAT, json=chat_body())).status_code == 200
    response = await served.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    runtime = {"autoglm_mode", "autoglm_requests_admitted", "autoglm_requests_rejected",
               "autoglm_requests_queued", "autoglm_requests_inflight", "autoglm_queue_wait_seconds"}
    engine = {"vllm:num_requests_waiting", "vllm:num_requests_running",
              "vllm:kv_cache_usage_perc", "vllm:request_success",
              "vllm:time_to_first_token_seconds"}
    assert runtime | engine <= set(families), sorted(runtime | engine - set(families))
    modes = {s.labels["mode"]: s.value for s in families["autoglm_mode"].samples}
    assert modes == {"streaming": 1.0, "batching": 0.0}
    waiting = families["vllm:num_requests_waiting"].samples
    assert {s.labels["model_name"] for s in waiting} == {spec.model.served_name}
    # vLLM's API server instruments its own routes in the same registry.
    assert "http_requests" in families
