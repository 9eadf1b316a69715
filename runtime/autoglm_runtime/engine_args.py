"""The one place that turns engine settings into a `vllm serve` argv.

The operator writes this argv into the Deployment and the runtime's launcher execs it, so both
agree on every flag. `make test-vllm` parses and validates every argv the operator can build with
the pinned vLLM's own `vllm serve` parser. PINNED_VLLM_VERSION is the one place for the version.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from autoglm_runtime.profiles import CamelModel

PINNED_VLLM_VERSION = "0.33.0"
MIDDLEWARE_IMPORT_PATH = "autoglm_runtime.middleware.ModeMiddleware"
DEFAULT_SERVED_MODEL_NAME = "autoglm-phone-9b"
# vLLM names its FP16 dtype "half"; the CRD speaks the clearer "float16".
VLLM_DTYPE = {"float16": "half", "bfloat16": "bfloat16"}
# Flags the builder owns; users may not override them through extra args.
MANAGED_FLAGS = (
    "--served-model-name",
    "--host",
    "--port",
    "--tensor-parallel-size",
    "--dtype",
    "--max-model-len",
    "--max-num-seqs",
    "--enable-chunked-prefill",
    "--scheduling-policy",
    "--gpu-memory-utilization",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--shutdown-timeout",
    "--middleware",
    "--reasoning-parser",
    "--max-num-batched-tokens",
    "--stream-interval",
)


class EngineSettings(CamelModel):
    """Everything the engine reads once at start-up; a change means a rolling restart."""

    model: str = Field(description="Weights: a local path or a model id vLLM can load.")
    served_model_name: str = DEFAULT_SERVED_MODEL_NAME
    host: str = "0.0.0.0"
    port: int = 8000
    tensor_parallel_size: int = Field(default=2, ge=1, le=8)
    dtype: Literal["float16", "bfloat16"] = "float16"
    max_model_len: int = Field(default=2048, ge=128, le=8192)
    max_num_seqs: int = Field(default=64, ge=1, le=4096)
    max_num_batched_tokens: int | None = Field(default=None, ge=128)
    gpu_memory_utilization_percent: int = Field(default=90, ge=10, le=99)
    enable_prefix_caching: bool = True
    shutdown_timeout_seconds: int = Field(default=30, ge=1, le=3600)
    reasoning_parser: str | None = "glm45"
    # Tokens per streamed chunk; None leaves vLLM's default (1). Set only for a pod that starts
    # in one mode for good (switchStrategy Rolling), where the engine may coalesce the stream.
    stream_interval: int | None = Field(default=None, ge=1, le=64)
    extra_args: tuple[str, ...] = ()


def build_vllm_argv(settings: EngineSettings) -> list[str]:
    """Return the argv after `vllm serve` (model first, then flags)."""
    argv = [
        settings.model,
        "--served-model-name", settings.served_model_name,
        "--host", settings.host,
        "--port", str(settings.port),
        "--tensor-parallel-size", str(settings.tensor_parallel_size),
        "--dtype", VLLM_DTYPE[settings.dtype],
        "--max-model-len", str(settings.max_model_len),
        "--max-num-seqs", str(settings.max_num_seqs),
        "--enable-chunked-prefill",
        "--scheduling-policy", "priority",
        "--gpu-memory-utilization", f"{settings.gpu_memory_utilization_percent / 100:.2f}",
        ("--enable-prefix-caching" if settings.enable_prefix_caching
         else "--no-enable-prefix-caching"),
        "--shutdown-timeout", str(settings.shutdown_timeout_seconds),
        "--middleware", MIDDLEWARE_IMPORT_PATH,
    ]  # fmt: skip
    if settings.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(settings.max_num_batched_tokens)]
    if settings.reasoning_parser:
        argv += ["--reasoning-parser", settings.reasoning_parser]
    if settings.stream_interval is not None:
        argv += ["--stream-interval", str(settings.stream_interval)]
    argv += list(settings.extra_args)
    return argv


def overridden_managed_flags(extra_args: tuple[str, ...] | list[str]) -> list[str]:
    """Extra args that would fight a managed flag (`--dtype` or `--dtype=...`)."""
    return [arg for arg in extra_args if arg.split("=", 1)[0] in MANAGED_FLAGS]
