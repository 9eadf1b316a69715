"""The AutoGLMDeployment resource: one pydantic model that the CRD in crds/ is generated from.

Field names are snake_case here and camelCase in the CRD. Cross-field rules are CEL
(`x-kubernetes-validations`) so the apiserver rejects bad objects at admission; the same rules
are not repeated in Python, because every object the operator reads has passed them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field
from pydantic.json_schema import JsonDict

from autoglm_operator import images
from autoglm_runtime.engine_args import DEFAULT_SERVED_MODEL_NAME, MANAGED_FLAGS
from autoglm_runtime.profiles import CamelModel, Mode, ModeProfiles

GROUP = "autoglm.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "AutoGLMDeployment"
PLURAL = "autoglmdeployments"
SINGULAR = "autoglmdeployment"
SHORT_NAMES = ["agd"]
# AutoGLM-Phone-9B's position embeddings end here; vLLM refuses a longer --max-model-len.
MODEL_CONTEXT_LIMIT = 8192
# The runtime image `make images` pushes, at the project version (images.py).
DEFAULT_IMAGE = images.reference(images.RUNTIME_IMAGE)
# Services are named <name>-streaming and <name>-batching: DNS-1035 labels of at most 63.
MAX_NAME_LENGTH = 63 - len("-") - max(len(mode.value) for mode in Mode)
# Names of the objects a field refers to (PVC, Secret, PriorityClass): DNS-1123 subdomains.
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# A label value (nodeSelector): empty, or alphanumerics with -_. inside, at most 63 characters.
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# An extended resource: domain-qualified (nvidia.com/gpu, amd.com/gpu).
_EXTENDED_RESOURCE = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
# A Kubernetes quantity (500m, 4, 16Gi) as the apiserver's own schema spells it, less the sign:
# requests and limits are never negative.
_QUANTITY = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


def _cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    validation: JsonDict = {"rule": rule, "message": message}
    if field_path:
        validation["fieldPath"] = field_path
    return validation


def _validations(*rules: JsonDict) -> ConfigDict:
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": list(rules)})


# Rules on the whole object, at the CRD's root schema: the only place CEL sees metadata.name.
OBJECT_VALIDATIONS: list[JsonDict] = [
    _cel(
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


class ModelSource(CamelModel):
    model_config = _validations(
        _cel(
            "!(has(self.pvcName) && has(self.hostPath))",
            "model.pvcName and model.hostPath are alternatives: set at most one",
        ),
        _cel(
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
        pattern=_DNS_SUBDOMAIN,
        description="PersistentVolumeClaim holding the weights, mounted read-only.",
    )
    host_path: str | None = Field(
        default=None,
        pattern=r"^/",
        description="Node directory holding the weights (single-node trials); absolute.",
    )
    mount_path: str = Field(default="/models", pattern=r"^/.*")


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
                _cel(
                    "self.all(a, !a.matches('^(" + "|".join(MANAGED_FLAGS) + ")(=.*)?$'))",
                    "engine.extraArgs may not set a flag the operator manages ("
                    + ", ".join(MANAGED_FLAGS)
                    + "): use the matching spec field",
                )
            ]
        },
    )


class QueryOverrides(CamelModel):
    """PromQL replacing a default query. `$selector` expands to this deployment's label matchers."""

    qps: str | None = None
    gpu_memory_percent: str | None = None
    queue_depth: str | None = None
    kv_cache_percent: str | None = None
    ttft_p95_seconds: str | None = None


class PrometheusSource(CamelModel):
    url: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s/?#]+([/?#]\S*)?$",
        description="Base URL of the Prometheus HTTP API, e.g. http://prometheus.monitoring:9090",
    )
    timeout_seconds: int = Field(default=5, ge=1, le=60)
    queries: QueryOverrides = Field(default_factory=QueryOverrides)


_LOW_BELOW_HIGH = _cel(
    "self.low < self.high", "low must be below high: the gap between them is the hysteresis band"
)


class MilliThreshold(CamelModel):
    """Per-replica requests per second, in thousandths (1500 = 1.5 req/s)."""

    model_config = _validations(_LOW_BELOW_HIGH)
    high: int = Field(default=3000, ge=1)
    low: int = Field(default=1500, ge=0)


class PercentThreshold(CamelModel):
    """GPU memory used, percent of each GPU. vLLM reserves engine.gpuMemoryUtilizationPercent at
    start-up, so used memory sits there at any load: the band must lie above the reservation
    and only real pressure beyond it (other processes, fragmentation) counts."""

    model_config = _validations(_LOW_BELOW_HIGH)
    high: int = Field(default=98, ge=1, le=100)
    low: int = Field(default=95, ge=0, le=99)


class CountThreshold(CamelModel):
    model_config = _validations(_LOW_BELOW_HIGH)
    high: int = Field(default=4, ge=1)
    low: int = Field(default=1, ge=0)


class AdaptiveSettings(CamelModel):
    interval_seconds: int = Field(default=15, ge=5, le=3600)
    prometheus: PrometheusSource = Field(default_factory=PrometheusSource)
    qps_per_replica_milli: MilliThreshold = Field(default_factory=MilliThreshold)
    gpu_memory_percent: PercentThreshold = Field(default_factory=PercentThreshold)
    queue_depth_per_replica: CountThreshold = Field(default_factory=CountThreshold)
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
            "Most replicas one step moves toward batching (steps grow with the overload; a "
            "return to streaming moves one replica per step)."
        ),
    )
    min_streaming_replicas: int = Field(
        default=1, ge=0, description="Replicas that always stay streaming for interactive chat."
    )
    dry_run: bool = Field(default=False, description="Decide and report, but flip nothing.")
    paused: bool = Field(default=False, description="Hold the current modes; query nothing.")


Quantity = Annotated[
    Annotated[int, Field(ge=0)] | Annotated[str, Field(pattern=_QUANTITY)],
    Field(json_schema_extra={"x-kubernetes-int-or-string": True}),
]


# CPU and memory beside the GPUs, sized for AutoGLM-Phone-9B in FP16 on 2 GPUs. Memory: the
# load streams ~20 GB of safetensors through the page cache (charged to the pod), while the API
# server, the engine core and one worker per GPU each hold torch and a CUDA context (3-5 GB
# each): ~32 GB at the peak. The request keeps the pod off nodes where it would be OOM-killed
# mid-load; the limit, twice that, is headroom for page cache and image batches. CPU: the
# engine core and each worker keep a core busy, and the API server tokenizes and decodes images.
DEFAULT_RESOURCE_REQUESTS: dict[str, int | str] = {"cpu": "8", "memory": "32Gi"}
DEFAULT_RESOURCE_LIMITS: dict[str, int | str] = {"cpu": "16", "memory": "64Gi"}


class ResourceSettings(CamelModel):
    """CPU and memory per replica (the operator sets the GPUs); a map set replaces its default."""

    model_config = _validations(
        _cel(
            "!has(self.limits) || !self.limits.exists(k, k.endsWith('/gpu'))",
            "resources.limits may not name a GPU: use gpusPerReplica",
        ),
        _cel(
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


class SchedulingSettings(CamelModel):
    node_selector: dict[str, Annotated[str, Field(max_length=63, pattern=_LABEL_VALUE)]] | None = (
        None
    )
    tolerations: list[dict[str, Any]] | None = None
    affinity: dict[str, Any] | None = None
    priority_class_name: str | None = Field(default=None, max_length=253, pattern=_DNS_SUBDOMAIN)


class ServiceSettings(CamelModel):
    model_config = _validations(
        _cel(
            "!has(self.nodePort) || self.type == 'NodePort'",
            "service.nodePort needs service.type NodePort",
        ),
    )
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    port: int = Field(default=8000, ge=1, le=65535)
    node_port: int | None = Field(default=None, ge=30000, le=32767)
    annotations: dict[str, str] | None = None


class SecretKeyRef(CamelModel):
    name: str = Field(min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN)
    key: str = Field(default="api-key", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")


class AutoGLMDeploymentSpec(CamelModel):
    model_config = _validations(
        _cel(
            "self.replicas == 0 || self.adaptive.minStreamingReplicas <= self.replicas",
            "adaptive.minStreamingReplicas must not exceed replicas",
            ".adaptive.minStreamingReplicas",
        ),
        _cel(
            "self.modePolicy != 'Adaptive' || self.adaptive.paused || "
            "has(self.adaptive.prometheus.url)",
            "modePolicy Adaptive needs adaptive.prometheus.url (or adaptive.paused: true)",
            ".adaptive.prometheus.url",
        ),
        _cel(
            "self.adaptive.gpuMemoryPercent.low > self.engine.gpuMemoryUtilizationPercent",
            "adaptive.gpuMemoryPercent.low must be above engine.gpuMemoryUtilizationPercent: "
            "vLLM holds that much of each GPU from start-up, so a lower band would keep "
            "replicas in batching for good",
            ".adaptive.gpuMemoryPercent.low",
        ),
        _cel(
            "self.maxModelLen <= " + str(MODEL_CONTEXT_LIMIT),
            f"maxModelLen must be at most {MODEL_CONTEXT_LIMIT}, "
            "the context limit of AutoGLM-Phone-9B",
            ".maxModelLen",
        ),
        _cel(
            "!has(self.engine.maxNumBatchedTokens) || "
            "self.engine.maxNumBatchedTokens >= self.profiles.batching.maxConcurrency",
            "engine.maxNumBatchedTokens must be at least profiles.batching.maxConcurrency "
            "(one token per running sequence per step)",
            ".engine.maxNumBatchedTokens",
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


class Condition(CamelModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    observed_generation: int | None = None
    last_transition_time: str | None = None


class MetricSample(CamelModel):
    """Metric values behind a decision, as strings: the CRD carries no floats."""

    qps: str | None = None
    qps_per_replica: str | None = None
    gpu_memory_percent: str | None = None
    queue_depth: str | None = None
    kv_cache_percent: str | None = None
    ttft_p95_seconds: str | None = None


class Decision(CamelModel):
    time: str
    from_batching: int
    to_batching: int
    reason: str
    message: str = ""
    applied: bool = True
    metrics: MetricSample = Field(default_factory=MetricSample)


class ReplicaFlip(CamelModel):
    """When the adaptive loop last flipped one pod: the per-replica cooldown reads it."""

    pod: str
    time: str
    mode: str


class AdaptiveLoopState(CamelModel):
    """What the adaptive loop must remember across passes and operator restarts."""

    high_since: str | None = Field(
        default=None, description="Since when load has stayed above a high threshold."
    )
    low_since: str | None = Field(
        default=None, description="Since when load has stayed below every low threshold."
    )
    last_flips: list[ReplicaFlip] = Field(default_factory=list, max_length=256)
    batching_target: int | None = Field(
        default=None,
        ge=0,
        description="switchStrategy Rolling: how many replicas the loop decided run batching pods.",
    )


class AutoGLMDeploymentStatus(CamelModel):
    model_config = ConfigDict(extra="allow")

    observed_generation: int | None = None
    replicas: int = 0
    ready_replicas: int = 0
    ready: str = Field(default="0/0", description="readyReplicas/replicas, for kubectl get.")
    streaming_replicas: int = 0
    batching_replicas: int = 0
    selector: str = ""
    endpoint: str = ""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    last_decision: Decision | None = None
    decision_history: list[Decision] = Field(default_factory=list, max_length=10)
    adaptive_state: AdaptiveLoopState | None = None
