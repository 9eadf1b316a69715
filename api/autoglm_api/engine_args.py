"""The one place that turns engine settings into a `vllm serve` argv.

The operator writes this argv into the Deployment and the runtime's launcher execs it, so both
agree on every flag. `make test-vllm` parses and validates every argv the operator can build with
the pinned vLLM's own `vllm serve` parser. PINNED_VLLM_VERSION is the one place for the version.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

from pydantic import Field

from autoglm_api.image_budget import MAX_PIXELS_CEILING, MIN_PIXELS, max_pixels_for
from autoglm_api.profiles import CamelModel

PINNED_VLLM_VERSION = "0.32.0"
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
    "--limit-mm-per-prompt",
    "--allowed-media-domains",
    "--allowed-local-media-path",
    "--mm-processor-kwargs",
    "--mm-encoder-tp-mode",
    "--enable-sleep-mode",
)
# vLLM takes any host when --allowed-media-domains is unset or empty, so "none allowed" is a
# name under RFC 6761's .invalid, which never resolves: every http(s) image_url is refused.
NO_MEDIA_DOMAIN = "no-remote-media.invalid"
DEFAULT_IMAGES_PER_PROMPT = 2
# GLM-4.1V's max_position_embeddings: the longest context the architecture has positions for.
MODEL_CONTEXT_LIMIT = 65_536
# Completion tokens a request that names no max_tokens gets (the runtime config's default).
DEFAULT_MAX_TOKENS = 512
# Managed by never being written, and why.
NEVER_SET = {
    "--allowed-local-media-path": "it is never set: file:// image URLs would read the pod's files",
}
# Environment the engine always gets: a media fetch never follows a redirect elsewhere.
ENGINE_ENV = {"VLLM_MEDIA_URL_ALLOW_REDIRECTS": "0"}

class ManagedSpelling(NamedTuple):
    """One managed setting as the pinned vLLM's parser reads it."""

    # The EngineSettings field that sets it; None: the builder always writes the same value.
    setting: str | None
    # Every option string that sets it (the flag and vLLM's aliases), each with the shortest
    # abbreviation argparse expands to it: allow_abbrev is on, and no other vLLM flag starts
    # with that abbreviation. Read from the real parser (make_arg_parser's option strings whose
    # dest is this one). tests/vllm/test_vllm_managed_flags.py checks them against that parser.
    spellings: dict[str, str]


# Keyed by the flag the builder writes. `--reasoning-parser` is refused only in full:
# `--reasoning-parser-plugin` starts with it, so no abbreviation of it is vLLM's.
MANAGED_SPELLINGS: dict[str, ManagedSpelling] = {
    "--served-model-name": ManagedSpelling("servedModelName", {"--served-model-name": "--ser"}),
    "--host": ManagedSpelling("host", {"--host": "--ho"}),
    "--port": ManagedSpelling("port", {"--port": "--por"}),
    "--tensor-parallel-size": ManagedSpelling(
        "tensorParallelSize", {"--tensor-parallel-size": "--te", "-tp": "-t"}
    ),
    "--dtype": ManagedSpelling("dtype", {"--dtype": "--dt"}),
    "--max-model-len": ManagedSpelling("maxModelLen", {"--max-model-len": "--max-m"}),
    "--max-num-seqs": ManagedSpelling("maxNumSeqs", {"--max-num-seqs": "--max-num-se"}),
    "--enable-chunked-prefill": ManagedSpelling(None, {
        "--enable-chunked-prefill": "--enable-ch",
        "--no-enable-chunked-prefill": "--no-enable-ch",
        "--disable-chunked-prefill": "--disable-chunked-p",
    }),
    "--scheduling-policy": ManagedSpelling(None, {"--scheduling-policy": "--scheduli"}),
    "--gpu-memory-utilization": ManagedSpelling("gpuMemoryUtilizationPercent", {
        "--gpu-memory-utilization": "--gp",
        "--device-memory-utilization": "--device-m",
    }),
    "--enable-prefix-caching": ManagedSpelling("enablePrefixCaching", {
        "--enable-prefix-caching": "--enable-pre",
        "--no-enable-prefix-caching": "--no-enable-pre",
        "--disable-prefix-caching": "--disable-pre",
    }),
    "--shutdown-timeout": ManagedSpelling(
        "shutdownTimeoutSeconds", {"--shutdown-timeout": "--shu"}
    ),
    "--middleware": ManagedSpelling(None, {"--middleware": "--mi"}),
    "--reasoning-parser": ManagedSpelling(
        "reasoningParser", {"--reasoning-parser": "--reasoning-parser"}
    ),
    "--max-num-batched-tokens": ManagedSpelling(
        "maxNumBatchedTokens", {"--max-num-batched-tokens": "--max-num-b"}
    ),
    "--stream-interval": ManagedSpelling("streamInterval", {"--stream-interval": "--stre"}),
    # Media rules the middleware applies too; the resource has no field for them yet.
    "--limit-mm-per-prompt": ManagedSpelling(None, {"--limit-mm-per-prompt": "--lim"}),
    "--allowed-media-domains": ManagedSpelling(
        None, {"--allowed-media-domains": "--allowed-med"}
    ),
    "--mm-processor-kwargs": ManagedSpelling(
        None, {"--mm-processor-kwargs": "--mm-processor-k"}
    ),
    "--mm-encoder-tp-mode": ManagedSpelling(None, {"--mm-encoder-tp-mode": "--mm-encoder-t"}),
    "--enable-sleep-mode": ManagedSpelling("enableSleepMode", {
        "--enable-sleep-mode": "--enable-sl",
        "--no-enable-sleep-mode": "--no-enable-sl",
    }),
    # Never set: it would let a prompt read the pod's files (file:// image URLs).
    "--allowed-local-media-path": ManagedSpelling(
        None, {"--allowed-local-media-path": "--allowed-l"}
    ),
}  # fmt: skip

# `--config <yaml>` splices the file's keys in as flags ahead of the builder's: a key there
# could set --api-key, add a --middleware, or set a flag the builder writes only sometimes,
# and no check of extraArgs sees inside the file. (`--config=x.yaml` is not read at all.)
CONFIG_FLAG_PATTERN = "--config([=.].*)?"
CONFIG_FLAG_MESSAGE = (
    "may not use --config: its YAML could set a managed flag or --api-key out of sight; "
    "list the flags themselves in extraArgs instead"
)

# `--api-key` as vLLM's parser reads it: `_` for `-`, any unique prefix (`--api-k`), and the
# `.key` JSON form (a list holding the key). The key
# comes from a Secret (apiKeySecretRef, which the operator passes as VLLM_API_KEY): the mode
# middleware checks only that variable before admission, and a key in the spec or the argv is
# readable by anyone who can read the resource or the pod.
API_KEY_FLAG_PATTERN = "--api[-_]k(e|ey)?([=.].*)?"
API_KEY_FLAG_MESSAGE = (
    "the API key may not be given as --api-key: put it in a Secret and name it in "
    "apiKeySecretRef (the runtime reads it from VLLM_API_KEY)"
)


def _abbreviations(option: str, shortest: str) -> str:
    """A regex for `option` and each abbreviation of it down to `shortest`. In a `--` flag
    vLLM reads `_` as `-`, so either matches there."""

    def char(c: str) -> str:
        return "[-_]" if c == "-" and option.startswith("--") else re.escape(c)

    lead = option[:2] if option.startswith("--") else option[:1]
    head = lead + "".join(char(c) for c in shortest[len(lead):])
    tail = option[len(shortest):]
    return head + "".join(f"({char(c)}" for c in tail) + ")?" * len(tail)


def managed_flag_pattern(flag: str) -> str:
    """The regex (RE2 and Python alike) for an arg vLLM would read as this managed flag: any
    spelling of it, whole or abbreviated, bare, `=value`, or `.key` (vLLM's JSON form)."""
    spellings = MANAGED_SPELLINGS[flag].spellings
    options = "|".join(_abbreviations(option, short) for option, short in spellings.items())
    return f"^({options})([=.].*)?$"


# Flags engine.extraArgs could carry before the runtime managed them. An object admitted then
# keeps them (the apiserver ratchets unchanged fields); its pods are built without them, since
# the runtime now sets both, so it keeps reconciling instead of crash-looping at start.
NEWLY_MANAGED = (
    "--limit-mm-per-prompt",
    "--allowed-media-domains",
    "--mm-processor-kwargs",
    "--mm-encoder-tp-mode",
)


def without_newly_managed(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the args to pass on, the NEWLY_MANAGED flags dropped); the values given apart from a
    dropped flag (`--allowed-media-domains a.example b.example`) go with it."""
    kept: list[str] = []
    dropped: list[str] = []
    in_dropped_values = False
    for arg in args:
        if in_dropped_values and not arg.startswith("-"):
            continue
        flag = next((f for f in NEWLY_MANAGED if re.fullmatch(managed_flag_pattern(f), arg)), None)
        in_dropped_values = flag is not None and "=" not in arg
        if flag is None:
            kept.append(arg)
        else:
            dropped.append(flag)
    return kept, dropped


class EngineSettings(CamelModel):
    """Everything the engine reads once at start-up; a change means a rolling restart."""

    model: str = Field(description="Weights: a local path or a model id vLLM can load.")
    served_model_name: str = DEFAULT_SERVED_MODEL_NAME
    host: str = "0.0.0.0"
    port: int = 8000
    tensor_parallel_size: int = Field(default=2, ge=1, le=8)
    dtype: Literal["float16", "bfloat16"] = "float16"
    max_model_len: int = Field(default=2048, ge=128, le=MODEL_CONTEXT_LIMIT)
    max_num_seqs: int = Field(default=64, ge=1, le=4096)
    max_num_batched_tokens: int | None = Field(default=None, ge=128)
    gpu_memory_utilization_percent: int = Field(default=90, ge=10, le=99)
    enable_prefix_caching: bool = True
    shutdown_timeout_seconds: int = Field(default=30, ge=1, le=3600)
    reasoning_parser: str | None = "glm45"
    # Tokens per streamed chunk; None leaves vLLM's default (1). Set only for a pod that starts
    # in one mode for good (switchStrategy Rolling), where the engine may coalesce the stream.
    stream_interval: int | None = Field(default=None, ge=1, le=64)
    # Images one prompt may carry (vLLM's --limit-mm-per-prompt; the middleware refuses more).
    images_per_prompt: int = Field(default=DEFAULT_IMAGES_PER_PROMPT, ge=1, le=64)
    # Hosts image URLs may name besides inline data: URLs; none by default.
    allowed_media_domains: tuple[str, ...] = ()
    # Pixels the processor scales each image to at most (image_budget.py); None: the budget
    # max_model_len leaves one screenshot beside the agent's text and the default completion.
    max_pixels: int | None = Field(default=None, ge=MIN_PIXELS, le=MAX_PIXELS_CEILING)
    # vLLM's sleep mode, for a warm standby (standby.py): the weights can leave the GPU and
    # come back without a restart. CUDA, ROCm or XPU only: vLLM 0.32 refuses the flag on the
    # CPU ("Sleep mode is not supported on current platform.", config/model.py).
    enable_sleep_mode: bool = False
    extra_args: tuple[str, ...] = ()


def image_max_pixels(settings: EngineSettings) -> int:
    """The pixel budget of one image these settings give the engine."""
    if settings.max_pixels is not None:
        return settings.max_pixels
    return max_pixels_for(settings.max_model_len, DEFAULT_MAX_TOKENS)


def mm_processor_kwargs(settings: EngineSettings) -> dict[str, Any]:
    """The image budget as GLM-4.1V's processor takes it. Not `max_pixels`, the official serve
    command's key: transformers 5's Glm4vImageProcessor has no such argument, vLLM drops what
    the processor does not take, and the image went unscaled (measured on the engine tier).
    `size` holds the same two bounds, in pixels of area despite its key names."""
    return {"size": {"shortest_edge": MIN_PIXELS, "longest_edge": image_max_pixels(settings)}}


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
    argv += ["--limit-mm-per-prompt",
             json.dumps({"image": settings.images_per_prompt, "video": 0},
                        separators=(",", ":")),
             "--allowed-media-domains", *(settings.allowed_media_domains or (NO_MEDIA_DOMAIN,)),
             "--mm-processor-kwargs",
             json.dumps(mm_processor_kwargs(settings), separators=(",", ":"))]
    if settings.tensor_parallel_size > 1:
        # The vision encoder is small: each GPU runs it whole on its share of the images
        # (the official serve command's setting) instead of splitting its weights.
        argv += ["--mm-encoder-tp-mode", "data"]
    if settings.enable_sleep_mode:
        argv += ["--enable-sleep-mode"]
    argv += list(settings.extra_args)
    return argv


def api_key_flags(argv: Sequence[str]) -> list[str]:
    """The flags (names only, never a value) that would pass the API key on the command line,
    where the middleware cannot see it."""
    return [_name(arg) for arg in argv if re.fullmatch(API_KEY_FLAG_PATTERN, arg)]


def refused_extra_arg(arg: str) -> str | None:
    """Why an extra arg may not be passed, or None. Only names: an arg may carry a secret."""
    for flag, managed in MANAGED_SPELLINGS.items():
        if re.fullmatch(managed_flag_pattern(flag), arg):
            if flag in NEVER_SET:
                instead = NEVER_SET[flag]
            elif managed.setting:
                instead = f"set engine.{managed.setting} instead"
            else:
                instead = "it is always set"
            return f"{_name(arg)} sets {flag}, which the runtime manages: {instead}"
    if re.fullmatch(CONFIG_FLAG_PATTERN, arg):
        return CONFIG_FLAG_MESSAGE
    return None


def _name(arg: str) -> str:
    return re.split("[=.]", arg, maxsplit=1)[0]
