"""The pinned vLLM in process: its own `vllm serve` parser, its real app, and the pod around it.

No engine runs on a CPU, so `RecordingServing` stands in for vLLM's chat and completions serving
classes, and only for them: vLLM's routing, request parsing (its own pydantic request models),
model check and priority and session resolution all run; the stand-in records what they
produced and answers in vLLM's own response models.
"""

from __future__ import annotations

import argparse
import json
import time
import types
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from vllm.config import VllmConfig
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.entrypoints.generate.base.protocol import DeltaMessage
from vllm.entrypoints.generate.base.serving import GenerateBaseServing
from vllm.entrypoints.launchers.app import build_app
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
)
from vllm.entrypoints.openai.completion.protocol import (
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
)
from vllm.entrypoints.openai.models.protocol import BaseModelPath
from vllm.entrypoints.openai.models.serving import OpenAIModelRegistry
from vllm.entrypoints.serve.engine.protocol import ErrorResponse, UsageInfo
from vllm.entrypoints.serve.engine.serving import BaseServing
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.metrics.loggers import PrometheusStatLogger

from autoglm_api.profiles import MODE_LABEL, Mode
from autoglm_operator.reconcile.children import serving as builders
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from autoglm_runtime.launcher import engine_env

OWNER = builders.Owner("agd", "ns", "uid-1")
ADMIN_TOKEN = "admin-token-for-tests"
BASE_URL = "http://autoglm.test"
# vLLM serves a model that generates text; the API server registers routes for these tasks.
SUPPORTED_TASKS = ("generate",)


class ArgvRejected(Exception):
    """vLLM's parser refused the argv (argparse would exit 2)."""


@cache
def _serve_parser() -> tuple[FlexibleArgumentParser, FlexibleArgumentParser, ServeSubcommand]:
    # The parser `vllm serve` itself builds: the CLI's top level with the serve subcommand.
    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(dest="subparser")
    serve = ServeSubcommand()
    return parser, serve.subparser_init(subparsers), serve


def serve_parser() -> FlexibleArgumentParser:
    """The `vllm serve` subcommand's own parser."""
    return _serve_parser()[1]


def serve_flags() -> frozenset[str]:
    """Every option string `vllm serve` accepts."""
    return frozenset(serve_parser()._option_string_actions)


def parse_serve_argv(argv: Iterable[str]) -> argparse.Namespace:
    """`vllm serve <argv>` as vLLM's CLI parses and validates it, before any model loads."""
    parser, _, serve = _serve_parser()
    try:
        args = parser.parse_args(["serve", *argv])
    except SystemExit as exc:
        raise ArgvRejected(f"vllm serve refused {list(argv)} (exit {exc.code})") from exc
    serve.validate(args)  # validate_parsed_serve_args
    if args.model_tag is not None:
        args.model = args.model_tag  # what ServeSubcommand.cmd does next
    return args


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == builders.CONTAINER_NAME)


@dataclass
class Seen:
    """One request as vLLM's own code parsed and resolved it."""

    request: ChatCompletionRequest | CompletionRequest
    body: dict[str, Any]  # the JSON vLLM received
    headers: dict[str, str]
    priority: int  # GenerateBaseServing._get_priority: X-Vllm-Priority first, then the body
    session_id: str | None  # GenerateBaseServing._get_session_id: body, X-Session-ID, xargs


class RecordingServing(BaseServing):
    TOKENS = ("Tap", " the", " search", " box", " and", " type.")  # 6 + [DONE]: not whole 4s

    def __init__(self, served_name: str) -> None:
        registry = OpenAIModelRegistry(
            model_config=None,  # type: ignore[arg-type]  # read only by /v1/models
            base_model_paths=[BaseModelPath(name=served_name, model_path=served_name)],
        )
        super().__init__(models=registry, model_config=None)  # type: ignore[arg-type]
        self.served_name = served_name
        self.tokens = self.TOKENS
        self.seen: list[Seen] = []

    async def _record(self, request: Any, raw_request: Request) -> ErrorResponse | None:
        error = await self._check_model(request)
        if error is not None:
            return error
        self.seen.append(Seen(
            request=request,
            body=json.loads(await raw_request.body()),
            headers=dict(raw_request.headers),
            priority=GenerateBaseServing._get_priority(request, raw_request),
            session_id=GenerateBaseServing._get_session_id(request, raw_request),
        ))
        return None

    def _usage(self) -> UsageInfo:
        return UsageInfo(prompt_tokens=9, completion_tokens=len(self.tokens),
                         total_tokens=9 + len(self.tokens))

    async def create_chat_completion(self, request: ChatCompletionRequest,
                                     raw_request: Request) -> Any:
        error = await self._record(request, raw_request)
        if error is not None:
            return error
        if request.stream:
            return self._stream(request.model or self.served_name, chat=True)
        message = ChatMessage(role="assistant", content="".join(self.tokens), reasoning="Look.")
        return ChatCompletionResponse(
            model=request.model or self.served_name, usage=self._usage(),
            choices=[ChatCompletionResponseChoice(index=0, message=message)],
        )

    async def create_completion(self, request: CompletionRequest, raw_request: Request) -> Any:
        error = await self._record(request, raw_request)
        if error is not None:
            return error
        if request.stream:
            return self._stream(request.model or self.served_name, chat=False)
        choice = CompletionResponseChoice(index=0, text="".join(self.tokens), finish_reason="stop")
        return CompletionResponse(model=request.model or self.served_name, choices=[choice],
                                  usage=self._usage())

    async def _stream(self, model: str, chat: bool) -> AsyncIterator[str]:
        """One event per token, framed as vLLM's own stream generators frame them."""
        ids = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{len(self.seen)}",
               "created": int(time.time())}
        last = len(self.tokens) - 1
        for index, token in enumerate(self.tokens):
            finish = "stop" if index == last else None
            chunk: ChatCompletionStreamResponse | CompletionStreamResponse
            if chat:
                chunk = ChatCompletionStreamResponse(model=model, **ids, choices=[
                    ChatCompletionResponseStreamChoice(
                        index=0, delta=DeltaMessage(content=token), finish_reason=finish)
                ])
            else:
                chunk = CompletionStreamResponse(model=model, **ids, choices=[
                    CompletionResponseStreamChoice(index=0, text=token, finish_reason=finish)
                ])
            yield f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n"
        yield "data: [DONE]\n\n"


def vllm_app(args: argparse.Namespace, serving: RecordingServing) -> FastAPI:
    """vLLM's own build_app; the state init_app_state would add, with the stand-in handlers."""
    app = build_app(args, SUPPORTED_TASKS, None)
    app.state.openai_serving_chat = serving
    app.state.openai_serving_completion = serving
    app.state.enable_server_load_tracking = False
    return app


class BodyWrites:
    """Outermost ASGI layer that records each response body write, as the socket would see it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.writes: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def recording(message: Any) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                self.writes.append(bytes(message["body"]))
            await send(message)

        await self.app(scope, receive, recording)


def materialize_pod(
    root: Path, spec: AutoGLMDeploymentSpec, mode: Mode, admin_socket: Path,
    api_key: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The serving container as the operator builds it: (vllm serve argv, the environment
    the launcher gives vLLM, with `admin_socket` for the relay).

    Files the pod mounts (ConfigMap, admin Secret, downward-API labels with the mode the
    operator gives the pod) are written under `root` at the paths the container names.
    """
    template_mode = mode if builders.rolling(spec) else None
    main = container(builders.deployment(OWNER, spec, mode=template_mode))
    labels = builders.pod_template(OWNER.name, spec, template_mode)["metadata"]["labels"]
    files = {
        f"{builders.CONFIG_DIR}/{builders.CONFIG_KEY}":
            builders.config_map(OWNER, spec)["data"][builders.CONFIG_KEY],
        f"{builders.ADMIN_DIR}/{builders.ADMIN_TOKEN_FILE}": ADMIN_TOKEN,
        f"{builders.PODINFO_DIR}/labels": "\n".join(
            f'{key}="{value}"' for key, value in {**labels, MODE_LABEL: mode.value}.items()
        ),
    }
    for path, text in files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    env = {"AUTOGLM_GPU_METRICS": "false"}  # no NVML here
    names = {var["name"] for var in main["env"]}
    assert api_key is None or "VLLM_API_KEY" in names, "an API key needs spec.apiKeySecretRef"
    for var in main["env"]:
        if "value" in var:
            value = var["value"]
            env[var["name"]] = str(root / value.lstrip("/")) if value.startswith("/") else value
        elif var["name"] == "VLLM_API_KEY":
            assert api_key is not None, "the spec names an API key Secret: pass its value"
            env["VLLM_API_KEY"] = api_key
    return main["args"], engine_env(env, admin_socket, main["args"])


@cache
def register_engine_metrics(served_name: str, max_model_len: int) -> None:
    """Register the vllm:* families as the engine's stat logger does in the API server process.

    vLLM's own PrometheusStatLogger on vLLM's default VllmConfig; only the model config, which
    needs real weights, is a stand-in carrying the three fields the logger reads.
    """
    config = VllmConfig()
    config.model_config = types.SimpleNamespace(  # type: ignore[assignment]
        served_model_name=served_name, max_model_len=max_model_len, is_diffusion=False
    )
    PrometheusStatLogger(config, engine_indexes=[0])


@dataclass
class Served:
    """One serving pod's API server: vLLM's app with the operator's argv, env and files."""

    app: FastAPI
    middleware: Any  # the outermost layer of vLLM's app: ModeMiddleware, tests assert
    serving: RecordingServing
    writes: BodyWrites
    client: httpx.AsyncClient
    admin_socket: Path  # where the middleware listens for the launcher's relayed admin calls

    def transport(self) -> httpx.AsyncBaseTransport:
        return httpx.ASGITransport(app=self.writes)


Serve = Callable[..., Served]
