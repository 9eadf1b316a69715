"""The AutoGLMDeployment resource's spec: the pydantic model the CRD in crds/ is generated from.

Field names are snake_case here and camelCase in the CRD. Cross-field rules are CEL
(`x-kubernetes-validations`, written with rules.py) so the apiserver rejects bad objects at
admission; the same rules are not repeated in Python, because every object the operator reads has
passed them. spec.scheduling's schemas are in scheduling.py, the status in status.py; crd.py
turns the two models into the CRD.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, Field
from pydantic.json_schema import JsonDict, JsonValue

from autoglm_api.engine_args import (
    API_KEY_FLAG_MESSAGE,
    API_KEY_FLAG_PATTERN,
    CONFIG_FLAG_MESSAGE,
    CONFIG_FLAG_PATTERN,
    DEFAULT_IMAGES_PER_PROMPT,
    DEFAULT_MAX_TOKENS,
    DEFAULT_SERVED_MODEL_NAME,
    MANAGED_SPELLINGS,
    MODEL_CONTEXT_LIMIT,
    managed_flag_pattern,
)
from autoglm_api.image_budget import (
    MAX_PIXELS_CEILING,
    MIN_PIXELS,
    OFFICIAL_MAX_PIXELS,
    PIXELS_PER_TOKEN,
    max_pixels_for,
)
from autoglm_api.media_hosts import INTERNAL_HOST_SUFFIXES
from autoglm_api.profiles import CamelModel, Mode, ModeProfiles
from autoglm_operator.resource import images
from autoglm_operator.resource.rules import DNS_SUBDOMAIN, cel, cel_strings, validations
from autoglm_operator.resource.scheduling import SchedulingSettings

GROUP = "autoglm.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "AutoGLMDeployment"
PLURAL = "autoglmdeployments"
SINGULAR = "autoglmdeployment"
SHORT_NAMES = ["agd"]
# The runtime image `make images` pushes, at the project version (images.py).
DEFAULT_IMAGE = images.reference(images.RUNTIME_IMAGE)
# The router image (images/router.Dockerfile): CPU only, no vLLM.
DEFAULT_ROUTER_IMAGE = images.reference(images.ROUTER_IMAGE)
# Services are named <name>-streaming and <name>-batching: DNS-1035 labels of at most 63.
MAX_NAME_LENGTH = 63 - len("-") - max(len(mode.value) for mode in Mode)
# An extended resource: domain-qualified (nvidia.com/gpu, amd.com/gpu).
_EXTENDED_RESOURCE = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
# A Kubernetes quantity (500m, 4, 16Gi) as the apiserver's own schema spells it, less the sign:
# requests and limits are never negative.
_QUANTITY = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


# Where the runtime container mounts its own volumes (reconcile/children/serving.py mounts
# them from here).
CONFIG_MOUNT_PATH = "/etc/autoglm"
ADMIN_MOUNT_PATH = "/etc/autoglm/admin"
PODINFO_MOUNT_PATH = "/etc/podinfo"
SHM_MOUNT_PATH = "/dev/shm"
# The root filesystem is read-only: $HOME and /tmp are emptyDirs for what vLLM writes.
HOME_MOUNT_PATH = "/home/autoglm"
TMP_MOUNT_PATH = "/tmp"
RUNTIME_MOUNT_PATHS = (
    CONFIG_MOUNT_PATH,
    ADMIN_MOUNT_PATH,
    PODINFO_MOUNT_PATH,
    SHM_MOUNT_PATH,
    HOME_MOUNT_PATH,
    TMP_MOUNT_PATH,
)
# The image's operating system (FHS): weights mounted on or inside one of these would hide what
# the container needs to run.
SYSTEM_DIRS = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run",
    "/sbin", "/sys", "/usr", "/var",
)  # fmt: skip


# Rules on the whole object, at the CRD's root schema: the only place CEL sees metadata.name.
OBJECT_VALIDATIONS: list[JsonDict] = [
    cel(
        f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && "
        "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        f"metadata.name must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters "
        "(lowercase letters, digits and '-', starting with a letter): the Services are named "
        "<name>-streaming and <name>-batching",
    ),
]


class ModePolicy(StrEnum):
    ADAPTIVE = "Adaptive"
    STREAMING = "Streaming"
    BATCHING = "Batching"


class SwitchStrategy(StrEnum):
    IN_PLACE = "InPlace"
    ROLLING = "Rolling"



_MOUNT_PATH_RULES: list[JsonValue] = [
    cel(
        "self.matches('^(/[^/]+)+$') && !self.matches('/[.][.]?(/|$)')",
        "model.mountPath must be an absolute path other than '/', without empty, '.' or '..' "
        "segments and without a trailing '/'",
    ),
    cel(
        f"{cel_strings(SYSTEM_DIRS)}.all(d, self != d && !self.startsWith(d + '/'))",
        f"model.mountPath may not be or lie inside a system directory ({', '.join(SYSTEM_DIRS)})",
    ),
    cel(
        f"{cel_strings(RUNTIME_MOUNT_PATHS)}.all(m, "
        "self != m && !self.startsWith(m + '/') && !m.startsWith(self + '/'))",
        "model.mountPath may not be, contain or lie inside a path the runtime mounts "
        f"({', '.join(RUNTIME_MOUNT_PATHS)})",
    ),
]


class ModelSource(CamelModel):
    model_config = validations(
        cel(
            "!(has(self.pvcName) && has(self.hostPath))",
            "model.pvcName and model.hostPath are alternatives: set at most one",
        ),
        cel(
            "self.servedName == oldSelf.servedName",
            "model.servedName is immutable: clients address the model by it; "
            "create a new AutoGLMDeployment to serve under another name",
            ".servedName",
        ),
    )

    served_name: str = Field(
        default=DEFAULT_SERVED_MODEL_NAME,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$",
        description="The model name clients send in the OpenAI `model` field.",
    )
    source: str = Field(
        default="zai-org/AutoGLM-Phone-9B",
        min_length=1,
        # vLLM's first argument: a leading '-' would make it a flag.
        pattern=r"^[^-\s]",
        description="What vLLM loads: a path under mountPath, or a model id in its cache.",
    )
    pvc_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="PersistentVolumeClaim holding the weights, mounted read-only.",
    )
    host_path: str | None = Field(
        default=None,
        pattern=r"^/",
        description="Node directory holding the weights (single-node trials); absolute.",
    )
    mount_path: str = Field(
        default="/models",
        max_length=1024,
        pattern=r"^/.*",
        description="Where the weights appear in the container; absolute, outside the system "
        "directories and the runtime's own mounts.",
        json_schema_extra={"x-kubernetes-validations": _MOUNT_PATH_RULES},
    )


# What a user sets instead of each managed flag, in this resource's terms.
MANAGED_FLAG_FIELDS = {
    "--served-model-name": "use model.servedName",
    "--host": "the operator sets it",
    "--port": "the operator sets it",
    "--tensor-parallel-size": "use gpusPerReplica",
    "--dtype": "use dtype",
    "--max-model-len": "use maxModelLen",
    "--max-num-seqs": "use the profiles' maxConcurrency",
    "--enable-chunked-prefill": "the operator always turns it on",
    "--scheduling-policy": "the operator always sets priority",
    "--gpu-memory-utilization": "use engine.gpuMemoryUtilizationPercent",
    "--enable-prefix-caching": "use engine.enablePrefixCaching",
    "--shutdown-timeout": "use engine.shutdownTimeoutSeconds",
    "--middleware": "the operator sets it",
    "--reasoning-parser": "use engine.reasoningParser",
    "--max-num-batched-tokens": "use engine.maxNumBatchedTokens",
    "--stream-interval": "use the profiles' streamCoalesceChunks",
    "--limit-mm-per-prompt": "use multimodal.imagesPerPrompt",
    "--allowed-media-domains": "use multimodal.allowedMediaDomains",
    "--mm-processor-kwargs": "use multimodal.maxPixels (the operator sets the image size bounds)",
    "--mm-encoder-tp-mode": "the operator sets data when gpusPerReplica is above 1",
    "--allowed-local-media-path": "never set: file:// image URLs would read the pod's files",
    "--enable-sleep-mode": "use scaleToZero.sleep.enabled",
}


def _managed_flag_rules() -> list[JsonDict]:
    """One rule per managed flag, refusing every spelling vLLM reads as it (aliases,
    abbreviations, `_` for `-`, `=value`), so the message can name the flag."""
    rules = []
    for flag, managed in MANAGED_SPELLINGS.items():
        spellings = ", ".join(
            option if short == option else f"{option} or an abbreviation down to {short}"
            for option, short in managed.spellings.items()
        )
        rules.append(cel(
            f"self.all(a, !a.matches('{managed_flag_pattern(flag)}'))",
            f"engine.extraArgs may not set a flag the operator manages: {flag} (refused as "
            f"vLLM reads it: {spellings}; _ for - too): {MANAGED_FLAG_FIELDS[flag]}",
        ))  # fmt: skip
    return rules


class EngineOptions(CamelModel):
    """vLLM settings read once at start-up: changing any of them rolls the pods."""

    gpu_memory_utilization_percent: int = Field(default=90, ge=10, le=99)
    enable_prefix_caching: bool = Field(
        default=True, description="Reuse KV cache across turns of one conversation."
    )
    max_num_batched_tokens: int | None = Field(default=None, ge=128, le=1048576)
    reasoning_parser: str | None = Field(
        default="glm45",
        # A flag's value: a leading '-' would make it a flag. Empty turns the parser off.
        pattern=r"^([A-Za-z0-9_][A-Za-z0-9_.-]*)?$",
        description="vLLM reasoning parser that splits out the thinking text; empty: none.",
    )
    shutdown_timeout_seconds: int = Field(
        default=30, ge=1, le=3600, description="How long a stopping pod drains running requests."
    )
    startup_timeout_seconds: int = Field(
        default=900, ge=60, le=7200, description="How long a model load may take before restart."
    )
    extra_args: list[Annotated[str, Field(max_length=512)]] = Field(
        default_factory=list,
        max_length=64,
        description="More `vllm serve` flags; the ones the operator manages are refused.",
        json_schema_extra={
            "x-kubernetes-validations": [
                *_managed_flag_rules(),
                cel(
                    "self.all(a, !a.matches('^" + CONFIG_FLAG_PATTERN + "$'))",
                    "engine.extraArgs " + CONFIG_FLAG_MESSAGE,
                ),
                cel(
                    "self.all(a, !a.matches('^" + API_KEY_FLAG_PATTERN + "$'))",
                    "engine.extraArgs: " + API_KEY_FLAG_MESSAGE,
                ),
            ]
        },
    )


# A public DNS name: at least two labels, the last one not numeric (no IP literal, no bare name
# that the cluster's search domains would resolve), lower case as vLLM compares it.
_MEDIA_DOMAIN = r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?[.])+[a-z]([a-z0-9-]{0,61}[a-z0-9])?$"


def _public_media_domain(domain: str) -> str:
    """The CEL rule below, for objects read without the apiserver (the operator, the tests)."""
    if domain.endswith(INTERNAL_HOST_SUFFIXES):
        raise ValueError(f"{domain} is a cluster-internal or local host")
    return domain


_MediaDomain = Annotated[
    str, Field(max_length=253, pattern=_MEDIA_DOMAIN), AfterValidator(_public_media_domain)
]


class MultimodalSettings(CamelModel):
    """The images one prompt may carry and the hosts the engine may fetch them from. Read at
    start-up (vLLM's --limit-mm-per-prompt and --allowed-media-domains): a change rolls the
    pods. The middleware refuses a request past either with a 400 before admission."""

    images_per_prompt: int = Field(
        default=DEFAULT_IMAGES_PER_PROMPT, ge=1, le=64,
        description="Images one prompt may carry; the phone agent sends one per step.",
    )  # fmt: skip
    max_pixels: int | None = Field(
        default=None, ge=MIN_PIXELS, le=MAX_PIXELS_CEILING,
        description="Pixels the engine scales each image to at most (--mm-processor-kwargs "
        "size.longest_edge; one prompt token per 1568, two frames of 28x28). Unset: what "
        "maxModelLen leaves one screenshot beside the phone agent's prompt and the default "
        f"completion, at most {OFFICIAL_MAX_PIXELS:,} (the model's official setting).",
    )  # fmt: skip

    def effective_max_pixels(self, max_model_len: int) -> int:
        if self.max_pixels is not None:
            return self.max_pixels
        return max_pixels_for(max_model_len, DEFAULT_MAX_TOKENS)
    allowed_media_domains: list[_MediaDomain] = (
        Field(
            default_factory=list,
            max_length=16,
            description="Hosts an http(s) image URL may name; none by default: images come "
            "inline as data: URLs, as the phone agent sends them. The pods fetch from these "
            "hosts, so the serving pods' egress must reach them.",
            json_schema_extra={"x-kubernetes-validations": [cel(
                "self.all(d, " + " && ".join(
                    f"!d.endsWith('{suffix}')" for suffix in INTERNAL_HOST_SUFFIXES) + ")",
                "multimodal.allowedMediaDomains may not name a cluster-internal or local host "
                f"(a name ending in {', '.join(INTERNAL_HOST_SUFFIXES)})",
            )]},
        )
    )


class QueryOverrides(CamelModel):
    """PromQL replacing a default query. `$selector`, `$router_selector`: its pods, its routers'."""

    qps: str | None = None
    gpu_memory_percent: str | None = None
    queue_depth: str | None = None
    kv_cache_percent: str | None = None
    ttft_p95_seconds: str | None = None
    chat_rate: str | None = None
    other_rate: str | None = None
    streaming_completions: str | None = None
    batching_completions: str | None = None
    streaming_busy: str | None = None
    batching_busy: str | None = None
    streaming_own_share: str | None = None
    batching_own_share: str | None = None


class PrometheusSource(CamelModel):
    url: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s/?#]+([/?#]\S*)?$",
        description="Base URL of the Prometheus HTTP API, e.g. http://prometheus.monitoring:9090",
    )
    timeout_seconds: int = Field(default=5, ge=1, le=60)
    queries: QueryOverrides = Field(default_factory=QueryOverrides)


_LOW_BELOW_HIGH = cel(
    "self.low < self.high", "low must be below high: the gap between them is the hysteresis band"
)


class MilliThreshold(CamelModel):
    """Per-replica requests per second, in thousandths (1500 = 1.5 req/s)."""

    model_config = validations(_LOW_BELOW_HIGH)
    high: int = Field(default=3000, ge=1)
    low: int = Field(default=1500, ge=0)


class PercentThreshold(CamelModel):
    """GPU memory used, percent of each GPU. vLLM reserves engine.gpuMemoryUtilizationPercent at
    start-up, so used memory sits there at any load: the band must lie above the reservation
    and only real pressure beyond it (other processes, fragmentation) counts."""

    model_config = validations(_LOW_BELOW_HIGH)
    high: int = Field(default=98, ge=1, le=100)
    low: int = Field(default=95, ge=0, le=99)


class CountThreshold(CamelModel):
    model_config = validations(_LOW_BELOW_HIGH)
    high: int = Field(default=4, ge=1)
    low: int = Field(default=1, ge=0)


_FALLBACK = (
    "Fallback thresholds: used only while per-class demand "
    "(autoglm_requests_received_total) is unavailable."
)


class ServiceLevelObjectives(CamelModel):
    """What a request must get to count as served (DistServe's goodput): a streamed chat meets
    both chat targets, any other request completes within batchCompletionSeconds."""

    model_config = validations(
        cel(
            "self.chatTimeToFirstTokenMillis <= self.batchCompletionSeconds * 1000",
            "chatTimeToFirstTokenMillis must not exceed batchCompletionSeconds: batch jobs are "
            "the class that waits",
            ".chatTimeToFirstTokenMillis",
        ),
        cel(
            "self.chatTimePerOutputTokenMillis <= self.chatTimeToFirstTokenMillis * 10",
            "chatTimePerOutputTokenMillis must be at most ten times chatTimeToFirstTokenMillis: "
            "a target that loose is a typo of units",
            ".chatTimePerOutputTokenMillis",
        ),
    )
    chat_time_to_first_token_millis: int = Field(
        default=500,
        ge=50,
        le=60000,
        description=(
            "A streamed chat's first visible token within this many ms of arrival. 500: the "
            "published streaming TTFT is 320 ms at light load, so a busy replica fits, a queue "
            "does not."
        ),
    )
    chat_time_per_output_token_millis: int = Field(
        default=100,
        ge=1,
        le=10000,
        description=(
            "A streamed chat's later tokens at most this many ms each on average (100: 10 "
            "tokens/s, faster than anyone reads; DistServe's chatbot setting)."
        ),
    )
    batch_completion_seconds: int = Field(
        default=30,
        ge=1,
        le=86400,
        description=(
            "Any other request (batch jobs, non-streamed calls) done within this many seconds "
            "of arrival (30: a pipeline's per-item deadline; a batching replica takes ~1.8 s)."
        ),
    )


class CapacitySeeds(CamelModel):
    """Requests per second one replica of each mode serves within the SLOs, in thousandths:
    where the policy starts before it has measured the replicas (status.adaptiveState.capacity
    keeps what it learns)."""

    streaming_per_replica_milli: int = Field(
        default=4100,
        ge=1,
        description=(
            "Streamed chats per second per streaming replica (4100: the published 2x RTX 4090 "
            "figure at the streaming profile's 8 concurrent requests)."
        ),
    )
    batching_per_replica_milli: int = Field(
        default=11500,
        ge=1,
        description=(
            "Requests per second per batching replica (11500: the calibrated latency model at "
            "the batching profile's 64 concurrent requests; the published 7.2 was measured at "
            "13, and continuous batching serves more per step as the batch grows)."
        ),
    )


class AdaptiveSettings(CamelModel):
    interval_seconds: int = Field(default=15, ge=5, le=3600)
    prometheus: PrometheusSource = Field(default_factory=PrometheusSource)
    # The threshold rules decide only while per-class demand is unavailable (a runtime without
    # autoglm_requests_received_total, a replay of an old trace): they keep their meaning there.
    qps_per_replica_milli: MilliThreshold = Field(
        default_factory=MilliThreshold, description=_FALLBACK
    )
    gpu_memory_percent: PercentThreshold = Field(
        default_factory=PercentThreshold, description=_FALLBACK
    )
    queue_depth_per_replica: CountThreshold = Field(
        default_factory=CountThreshold, description=_FALLBACK
    )
    to_batching_stabilization_seconds: int = Field(
        default=30, ge=0, le=3600, description="Load must stay high this long before a flip."
    )
    to_streaming_stabilization_seconds: int = Field(
        default=300, ge=0, le=86400, description="Load must stay low this long before a return."
    )
    cooldown_seconds: int = Field(
        default=120, ge=0, le=86400, description="Least time between two flips of one replica."
    )
    max_flips_per_step: int = Field(
        default=4,
        ge=1,
        le=64,
        description=(
            "Most replicas one step flips. Sized by demand: toward the chosen split, either "
            "way. Fallback thresholds: toward batching, growing with the overload; a return "
            "moves one replica per step."
        ),
    )
    min_streaming_replicas: int = Field(
        default=1, ge=0, description="Replicas that always stay streaming for interactive chat."
    )
    slo: ServiceLevelObjectives = Field(default_factory=ServiceLevelObjectives)
    capacity: CapacitySeeds = Field(default_factory=CapacitySeeds)
    dry_run: bool = Field(default=False, description="Decide and report, but flip nothing.")
    paused: bool = Field(default=False, description="Hold the current modes; query nothing.")


Quantity = Annotated[
    Annotated[int, Field(ge=0)] | Annotated[str, Field(pattern=_QUANTITY)],
    Field(json_schema_extra={"x-kubernetes-int-or-string": True}),
]


# CPU and memory beside the GPUs, sized for AutoGLM-Phone-9B in FP16 on 2 GPUs. Memory: the
# load streams the FP16 safetensors (two bytes per parameter) through the page cache (charged to
# the pod), while the API server, the engine core and one worker per GPU each hold torch and a
# CUDA context. The request covers that peak and keeps the pod off nodes where it would be
# OOM-killed mid-load; the limit, twice that, is headroom for page cache and image batches. CPU:
# the engine core and each worker keep a core busy, and the API server tokenizes and decodes
# images.
DEFAULT_RESOURCE_REQUESTS: dict[str, int | str] = {"cpu": "8", "memory": "32Gi"}
DEFAULT_RESOURCE_LIMITS: dict[str, int | str] = {"cpu": "16", "memory": "64Gi"}


class ResourceSettings(CamelModel):
    """CPU and memory per replica (the operator sets the GPUs); a map set replaces its default."""

    model_config = validations(
        cel(
            "!has(self.limits) || !self.limits.exists(k, k.endsWith('/gpu'))",
            "resources.limits may not name a GPU: use gpusPerReplica",
        ),
        cel(
            "!has(self.requests) || !self.requests.exists(k, k.endsWith('/gpu'))",
            "resources.requests may not name a GPU: use gpusPerReplica",
        ),
    )
    requests: dict[str, Quantity] | None = Field(
        default=DEFAULT_RESOURCE_REQUESTS,
        max_length=32,
        description="CPU and memory the scheduler reserves (default sized for the 9B model).",
    )
    limits: dict[str, Quantity] | None = Field(
        default=DEFAULT_RESOURCE_LIMITS,
        max_length=32,
        description="Most CPU and memory a replica may use before throttling or OOM-kill.",
    )


class ServiceSettings(CamelModel):
    model_config = validations(
        cel(
            "!has(self.nodePort) || self.type == 'NodePort'",
            "service.nodePort needs service.type NodePort",
        ),
    )
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    port: int = Field(default=8000, ge=1, le=65535)
    node_port: int | None = Field(default=None, ge=30000, le=32767)
    annotations: dict[str, str] | None = None


class SecretKeyRef(CamelModel):
    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    key: str = Field(default="api-key", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")


# The router per replica: its resident memory and CPU per request are small
# (docs/benchmarks/router_overhead.md), so a quarter core serves far more requests than the
# engines behind it take; the memory limit leaves room above its resident size.
DEFAULT_ROUTER_REQUESTS: dict[str, int | str] = {"cpu": "250m", "memory": "128Mi"}
DEFAULT_ROUTER_LIMITS: dict[str, int | str] = {"cpu": "1", "memory": "320Mi"}
# What a router container may ask for: it runs on CPU, never on an accelerator.
ROUTER_RESOURCE_NAMES = ("cpu", "memory", "ephemeral-storage")
# The most a load factor may say: beyond it the bound stops balancing anything.
MAX_LOAD_FACTOR = 10.0


def _router_resource_rule(field: str) -> JsonDict:
    return cel(
        f"!has(self.{field}) || self.{field}.all(k, k in {cel_strings(ROUTER_RESOURCE_NAMES)})",
        f"router.resources.{field} may name only {', '.join(ROUTER_RESOURCE_NAMES)}: "
        "the router runs on CPU (no GPU or other extended resource)",
        f".{field}",
    )


class RouterResources(CamelModel):
    """CPU and memory per router replica; a map set replaces its default."""

    model_config = validations(_router_resource_rule("requests"), _router_resource_rule("limits"))
    requests: dict[str, Quantity] | None = Field(
        default=DEFAULT_ROUTER_REQUESTS, max_length=3, description="What the scheduler reserves."
    )
    limits: dict[str, Quantity] | None = Field(
        default=DEFAULT_ROUTER_LIMITS, max_length=3, description="Most a router replica may use."
    )


class SessionAffinity(CamelModel):
    load_factor: str = Field(
        default="1.25",
        max_length=8,
        pattern=r"^[0-9]+(\.[0-9]+)?$",
        description=(
            "No replica takes more than this times the mean in-flight cost; beyond it a "
            f"session moves to the next replica on the ring. A decimal string from 1.0 to "
            f"{MAX_LOAD_FACTOR:g} (larger keeps sessions home longer, smaller balances closer)."
        ),
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"double(self) >= 1.0 && double(self) <= {MAX_LOAD_FACTOR}",
                    "router.sessionAffinity.loadFactor must be from 1.0 to "
                    f"{MAX_LOAD_FACTOR:g}: below 1 no replica fits the bound",
                )
            ]
        },
    )


_ROUTER_DEFAULT = " Unset: the router's default (docs/operations/security.md)."


class RouterLimits(CamelModel):
    """What one router replica takes from its clients (autoglm-router's client limits): past
    each, the answer named in its description. Unset fields keep the router's defaults."""

    max_header_bytes: int | None = Field(
        default=None, ge=4096, le=1 << 20,
        description="Request line and headers of one request, in bytes; past it 431."
        + _ROUTER_DEFAULT)
    max_headers: int | None = Field(
        default=None, ge=16, le=1000,
        description="Headers in one request; past it 431." + _ROUTER_DEFAULT)
    header_timeout_seconds: int | None = Field(
        default=None, ge=1, le=300,
        description="From connect (or a request's first byte) to its last header; past it 408 "
        "and the connection closes." + _ROUTER_DEFAULT)
    body_timeout_seconds: int | None = Field(
        default=None, ge=1, le=600,
        description="To receive a whole request body; past it 408." + _ROUTER_DEFAULT)
    max_client_connections: int | None = Field(
        default=None, ge=1, le=65536,
        description="Open client connections; past it 503 with Retry-After." + _ROUTER_DEFAULT)
    max_inflight: int | None = Field(
        default=None, ge=1, le=65536,
        description="Client requests at once; past it 503 with Retry-After." + _ROUTER_DEFAULT)
    max_body_bytes: int | None = Field(
        default=None, ge=1 << 20, le=256 << 20,
        description="One request body, in bytes; past it 413. Keep it above your largest "
        "screenshot in base64." + _ROUTER_DEFAULT)
    max_buffered_body_bytes: int | None = Field(
        default=None, ge=1 << 20, le=16 << 30,
        description="Request bodies held at once, all requests together, in bytes (kept for "
        "retries); past it 503. Raise the router's memory limit with it." + _ROUTER_DEFAULT)
    keep_alive_timeout_seconds: int | None = Field(
        default=None, ge=16, le=3600,
        description="An idle kept-alive client connection stays open this long; it must "
        "outlast the clients' own idle reuse (aiohttp's 15 s, the openai client's 5 s), or a "
        "request sent as the router closes it is lost." + _ROUTER_DEFAULT)
    send_timeout_seconds: int | None = Field(
        default=None, ge=1, le=3600,
        description="A client that takes no response bytes this long is cut and its slot "
        "freed." + _ROUTER_DEFAULT)
    stream_timeout_seconds: int | None = Field(
        default=None, ge=1, le=86400,
        description="A whole response longer than this is cut." + _ROUTER_DEFAULT)


class RouterHold(CamelModel):
    """The queue that holds requests while no replica can take them: at zero (scaleToZero, or
    an HPA or KEDA that scales to zero), or while a rollout has no replica ready."""

    model_config = validations(
        cel(
            "!has(self.perClient) || self.perClient <= self.queueSize",
            "router.hold.perClient must not exceed router.hold.queueSize",
            ".perClient",
        ),
    )

    queue_size: int = Field(
        default=256, ge=0, le=65536,
        description="Requests one router replica holds at once; one more is answered 503 "
        "with Retry-After. 0: hold nothing, answer 503 at once.",
    )
    per_client: int | None = Field(
        default=None, ge=1, le=65536,
        description="Requests one client (its source address) may have held at once, so one "
        "client cannot fill the queue; default a quarter of queueSize. Behind a proxy that "
        "hides client addresses every client shares one bound: raise it to queueSize there.",
    )
    wait_seconds: int = Field(
        default=180, ge=1, le=3600,
        description="The longest a request is held; then 503 with Retry-After. Above the "
        "cold start (scheduling, image pull, model load): about a minute for a 9B model "
        "whose image is on the node.",
    )
    heartbeat_seconds: int = Field(
        default=15, ge=1, le=300,
        description="A held streamed request gets its response headers and an SSE comment "
        "after this long, and another every as long, so proxies with an idle timeout (often "
        "60 s) keep it open through a cold start.",
    )


class RouterSettings(CamelModel):
    """The router in front of the replicas: Service <name> selects it when enabled."""

    enabled: bool = Field(
        default=True,
        description="Deploy <name>-router and point Service <name> at it; false: Service "
        "<name> selects the serving pods directly (a random replica per connection).",
    )
    replicas: int = Field(default=2, ge=1, le=32, description="Router replicas.")
    image: str = Field(default=DEFAULT_ROUTER_IMAGE, min_length=1, pattern=r"^\S+$")
    resources: RouterResources = Field(default_factory=RouterResources)
    session_affinity: SessionAffinity = Field(default_factory=SessionAffinity)
    spill: bool = Field(
        default=True,
        description="Send a request to the other mode when every replica of its own is at "
        "its concurrency cap.",
    )
    limits: RouterLimits = Field(default_factory=RouterLimits)
    hold: RouterHold = Field(default_factory=RouterHold)


class SleepSettings(CamelModel):
    """Warm standby: idle replicas sleep (vLLM sleep mode) and wake in about a second."""

    enabled: bool = Field(
        default=False,
        description="Start the engine with --enable-sleep-mode (a rolling restart) and put "
        "replicas to sleep after idleSeconds without a request: their weights move to CPU "
        "memory, their GPUs stay allocated, and the first request wakes one. Needs a GPU "
        "(CUDA or ROCm): vLLM refuses sleep mode on the CPU.",
    )
    idle_seconds: int = Field(
        default=300, ge=10, le=604800,
        description="Seconds without a request before the replicas sleep.",
    )
    level: int = Field(
        default=1, ge=1, le=2,
        description="vLLM's sleep level: 1 moves the weights to CPU memory (wakes fastest), "
        "2 drops them (less CPU memory, the wake reloads them).",
    )


class ScaleToZeroSettings(CamelModel):
    """Scale the serving replicas down when idle and back up on the first request, which the
    router holds meanwhile (docs/operations/scale-to-zero.md)."""

    enabled: bool = Field(
        default=False,
        description="After idleSeconds without a request run `floor` replicas; the first "
        "request after that is held by the router (router.hold) while `replicas` start. "
        "Refused while an HorizontalPodAutoscaler (or KEDA) scales this object.",
    )
    idle_seconds: int = Field(
        default=900, ge=10, le=604800,
        description="Seconds without a request before the deployment scales to `floor`.",
    )
    floor: int = Field(
        default=0, ge=0, le=256,
        description="Replicas kept while idle: 0 frees every GPU; 1 with sleep keeps a warm "
        "standby that wakes in about a second.",
    )
    sleep: SleepSettings = Field(default_factory=SleepSettings)


class ScaleUpSettings(CamelModel):
    """How fast replicas are added when the demand needs more."""

    stabilization_seconds: int = Field(
        default=0, ge=0, le=3600,
        description="Seconds a larger fleet must stay wanted before replicas are added. 0: at "
        "the first shortfall; a replica of a 9B model takes about a minute to start, and "
        "waiting longer turns requests away.",
    )
    max_step: int = Field(
        default=4, ge=1, le=256, description="Most replicas one step adds."
    )


class ScaleDownSettings(CamelModel):
    """How slowly replicas are removed when fewer serve the demand."""

    stabilization_seconds: int = Field(
        default=300, ge=0, le=86400,
        description="Seconds a smaller fleet must stay wanted before the first replica goes: "
        "several starts of a replica, so a dip between two peaks does not pay a start twice.",
    )
    period_seconds: int = Field(
        default=60, ge=0, le=86400,
        description="Seconds between two steps down while fewer replicas stay wanted.",
    )
    max_step: int = Field(
        default=1, ge=1, le=256, description="Most replicas one step removes."
    )


class AutoscalingSettings(CamelModel):
    """The adaptive pass sizes the fleet: the fewest replicas whose best split of modes serves
    the measured demand, plus headroom, within the SLOs (docs/adaptive.md "Sizing the fleet")."""

    enabled: bool = Field(
        default=False,
        description="Size the serving replicas by demand between minReplicas and maxReplicas; "
        "spec.replicas is not read while on. Refused while an HorizontalPodAutoscaler (or KEDA) "
        "scales this object.",
    )
    min_replicas: int = Field(
        default=1, ge=0, le=256,
        description="Fewest replicas. 0 scales to zero after scaleToZero.idleSeconds without a "
        "request; the router holds the next request while replicas start.",
    )
    max_replicas: int = Field(default=4, ge=1, le=256, description="Most replicas.")
    headroom_percent: int = Field(
        default=20, ge=0, le=200,
        description="The fleet serves the measured demand this much above it within the SLOs: "
        "room for the minute a new replica takes to start.",
    )
    scale_up: ScaleUpSettings = Field(default_factory=ScaleUpSettings)
    scale_down: ScaleDownSettings = Field(default_factory=ScaleDownSettings)


class FailureMode(StrEnum):
    """What a gateway does when the endpoint picker does not answer (GIE's EndpointPickerRef)."""

    FAIL_CLOSE = "FailClose"
    FAIL_OPEN = "FailOpen"


class GatewaySettings(CamelModel):
    """An InferencePool for Gateway API Inference Extension gateways, the router's picker in it."""

    enabled: bool = Field(
        default=False,
        description="Publish InferencePool <name> (inference.networking.k8s.io/v1) selecting "
        "the serving pods, with Service <name>-epp, the router pods' ext_proc port, as its "
        "endpoint picker. Needs router.enabled and the InferencePool CRD in the cluster.",
    )
    failure_mode: FailureMode = Field(
        default=FailureMode.FAIL_CLOSE,
        description="When the picker does not answer: FailClose, the gateway refuses the "
        "request; FailOpen, it sends it to a serving pod of its own choosing (the router's "
        "routing rules, limits and allow-list do not apply then).",
    )


class AutoGLMDeploymentSpec(CamelModel):
    model_config = validations(
        cel(
            "self.autoscaling.enabled || self.replicas == 0 || "
            "self.adaptive.minStreamingReplicas <= self.replicas",
            "adaptive.minStreamingReplicas must not exceed replicas",
            ".adaptive.minStreamingReplicas",
        ),
        cel(
            "!self.autoscaling.enabled || "
            "self.autoscaling.minReplicas <= self.autoscaling.maxReplicas",
            "autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
            ".autoscaling.minReplicas",
        ),
        cel(
            "!self.autoscaling.enabled || "
            "self.adaptive.minStreamingReplicas <= self.autoscaling.maxReplicas",
            "adaptive.minStreamingReplicas must not exceed autoscaling.maxReplicas",
            ".adaptive.minStreamingReplicas",
        ),
        cel(
            "!self.autoscaling.enabled || self.autoscaling.minReplicas > 0 || self.router.enabled",
            "autoscaling.minReplicas 0 needs router.enabled: the router holds the requests that "
            "arrive while no replica runs",
            ".autoscaling.minReplicas",
        ),
        cel(
            "!self.autoscaling.enabled || has(self.adaptive.prometheus.url)",
            "autoscaling.enabled needs adaptive.prometheus.url: the fleet is sized by the demand "
            "it measures",
            ".adaptive.prometheus.url",
        ),
        cel(
            "self.modePolicy != 'Adaptive' || self.adaptive.paused || "
            "has(self.adaptive.prometheus.url)",
            "modePolicy Adaptive needs adaptive.prometheus.url (or adaptive.paused: true)",
            ".adaptive.prometheus.url",
        ),
        cel(
            "self.adaptive.gpuMemoryPercent.low > self.engine.gpuMemoryUtilizationPercent",
            "adaptive.gpuMemoryPercent.low must be above engine.gpuMemoryUtilizationPercent: "
            "vLLM holds that much of each GPU from start-up, so a lower band would keep "
            "replicas in batching for good",
            ".adaptive.gpuMemoryPercent.low",
        ),
        cel(
            "self.maxModelLen <= " + str(MODEL_CONTEXT_LIMIT),
            f"maxModelLen must be at most {MODEL_CONTEXT_LIMIT}, the positions "
            "AutoGLM-Phone-9B's architecture (GLM-4.1V) has",
            ".maxModelLen",
        ),
        cel(
            "!has(self.multimodal.maxPixels) || self.multimodal.maxPixels / "
            f"{PIXELS_PER_TOKEN} + {DEFAULT_MAX_TOKENS} <= self.maxModelLen",
            f"multimodal.maxPixels leaves no room in maxModelLen: one image costs up to "
            f"maxPixels / {PIXELS_PER_TOKEN} tokens, and it and the default completion "
            f"({DEFAULT_MAX_TOKENS} tokens) must fit; lower multimodal.maxPixels or raise "
            "maxModelLen",
            ".multimodal.maxPixels",
        ),
        cel(
            "!has(self.engine.maxNumBatchedTokens) || "
            "self.engine.maxNumBatchedTokens >= self.profiles.batching.maxConcurrency",
            "engine.maxNumBatchedTokens must be at least profiles.batching.maxConcurrency "
            "(one token per running sequence per step)",
            ".engine.maxNumBatchedTokens",
        ),
        cel(
            "!self.gateway.enabled || self.router.enabled",
            "gateway.enabled needs router.enabled: the InferencePool's endpoint picker runs in "
            "the router pods",
            ".gateway.enabled",
        ),
        cel(
            "!self.scaleToZero.enabled || self.router.enabled",
            "scaleToZero.enabled needs router.enabled: the router holds the requests that "
            "arrive while no replica runs",
            ".scaleToZero.enabled",
        ),
        cel(
            "self.autoscaling.enabled || !self.scaleToZero.enabled || "
            "self.scaleToZero.floor <= self.replicas",
            "scaleToZero.floor must not exceed replicas: it is the replicas kept while idle",
            ".scaleToZero.floor",
        ),
        cel(
            "!self.scaleToZero.sleep.enabled || self.scaleToZero.floor > 0 || "
            "self.scaleToZero.sleep.idleSeconds < self.scaleToZero.idleSeconds",
            "scaleToZero.sleep.idleSeconds must be below scaleToZero.idleSeconds when floor is "
            "0: no replica is left to sleep once the deployment is at zero",
            ".scaleToZero.sleep.idleSeconds",
        ),
    )

    replicas: int = Field(default=1, ge=0, le=256)
    model: ModelSource = Field(default_factory=ModelSource)
    image: str = Field(default=DEFAULT_IMAGE, min_length=1, pattern=r"^\S+$")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    gpus_per_replica: int = Field(
        default=2, ge=1, le=8, description="GPUs per replica; also vLLM's tensor parallel size."
    )
    gpu_resource_name: str = Field(default="nvidia.com/gpu", pattern=_EXTENDED_RESOURCE)
    dtype: Literal["float16", "bfloat16"] = "float16"
    max_model_len: int = Field(default=2048, ge=128)
    engine: EngineOptions = Field(default_factory=EngineOptions)
    multimodal: MultimodalSettings = Field(default_factory=MultimodalSettings)
    mode_policy: ModePolicy = ModePolicy.ADAPTIVE
    switch_strategy: SwitchStrategy = SwitchStrategy.IN_PLACE
    profiles: ModeProfiles = Field(default_factory=ModeProfiles)
    adaptive: AdaptiveSettings = Field(default_factory=AdaptiveSettings)
    resources: ResourceSettings = Field(default_factory=ResourceSettings)
    scheduling: SchedulingSettings = Field(default_factory=SchedulingSettings)
    service: ServiceSettings = Field(default_factory=ServiceSettings)
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret holding the API key clients must send; none: open."
    )
    router: RouterSettings = Field(default_factory=RouterSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    scale_to_zero: ScaleToZeroSettings = Field(default_factory=ScaleToZeroSettings)
    autoscaling: AutoscalingSettings = Field(default_factory=AutoscalingSettings)

    def standby(self) -> ScaleToZeroSettings:
        """scaleToZero as it applies: with autoscaling on, minReplicas is the floor while idle
        and minReplicas 0 turns it on (scaleToZero.floor is not read)."""
        if not self.autoscaling.enabled:
            return self.scale_to_zero
        floor = self.autoscaling.min_replicas
        return self.scale_to_zero.model_copy(
            update={"enabled": self.scale_to_zero.enabled or floor == 0, "floor": floor})

    def engine_max_num_seqs(self, mode: Mode | None = None) -> int:
        """vLLM's --max-num-seqs: the envelope both modes fit in, or a mode's own cap for the
        pods a Rolling switch starts with that mode's flags (`mode` given)."""
        if mode is None:
            return self.profiles.envelope_max_num_seqs
        return self.profiles.for_mode(mode).max_concurrency

    def admission_caps(self, streamed_chat: bool) -> dict[Mode, int]:
        """Requests in flight on a replica of each mode before one of this class queues there
        (ModeProfile.admission_cap), on the engine the operator starts for that mode."""
        rolling = self.switch_strategy is SwitchStrategy.ROLLING
        return {
            mode: self.profiles.for_mode(mode).admission_cap(
                streamed_chat, self.engine_max_num_seqs(mode if rolling else None))
            for mode in Mode
        }  # fmt: skip
