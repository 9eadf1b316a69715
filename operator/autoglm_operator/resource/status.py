"""The AutoGLMDeployment's status: what the operator reports and what the adaptive pass keeps.

The status subresource's schema in the CRD is generated from AutoGLMDeploymentStatus
(resource/crd.py); the operator is its only writer (io/executor.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from autoglm_api.profiles import CamelModel


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
    """When the adaptive pass last flipped one pod: the per-replica cooldown reads it."""

    pod: str
    time: str
    mode: str


class LearnedCapacity(CamelModel):
    """Requests per second per replica that each mode was measured to serve, in thousandths."""

    streaming_milli: int = Field(ge=1)
    batching_milli: int = Field(ge=1)


class AdaptiveState(CamelModel):
    """What the adaptive pass remembers from one pass to the next and across operator restarts."""

    high_since: str | None = Field(
        default=None,
        description=(
            "Since when the adaptive pass has wanted more replicas batching (demand that needs "
            "it, or, without per-class demand, load above a high threshold)."
        ),
    )
    low_since: str | None = Field(
        default=None,
        description=(
            "Since when the adaptive pass has wanted fewer replicas batching (demand that needs "
            "it, or, without per-class demand, load below every low threshold)."
        ),
    )
    last_flips: list[ReplicaFlip] = Field(default_factory=list, max_length=256)
    batching_target: int | None = Field(
        default=None,
        ge=0,
        description=(
            "switchStrategy Rolling: how many replicas the adaptive pass decided run batching pods."
        ),
    )
    capacity: LearnedCapacity | None = Field(
        default=None,
        description="What replicas were measured to serve near saturation (none: the seeds).",
    )


class RouterStatus(CamelModel):
    enabled: bool = True
    replicas: int = Field(default=0, description="Router pods that exist.")
    ready_replicas: int = Field(default=0, description="Router pods ready to route.")


class GatewayStatus(CamelModel):
    enabled: bool = False
    inference_pool: str = Field(
        default="", description="The InferencePool the operator holds (none while it has none)."
    )
    endpoint_picker: str = Field(
        default="", description="The endpoint picker's Service and port, as service:port."
    )


class StandbyStatus(CamelModel):
    """spec.scaleToZero: where the deployment stands, since when and why (reconcile/standby.py)."""

    state: Literal["Serving", "Asleep", "Idle", "Waking", "AutoscalerConflict"] = Field(
        description="Serving: spec.replicas awake (after a wake, wokenReplicas of them until "
        "demand asks for more). Asleep: they run, asleep. Idle: scaleToZero.floor run. Waking: "
        "a request is held, one replica starts. AutoscalerConflict: an HPA scales "
        "this object, so scaleToZero is not applied.")
    since: str | None = None
    reason: str = ""
    message: str = ""
    serving_since: str | None = Field(
        default=None, description="When it last started serving: the idle windows count "
        "from this or the last request, whichever is later.")
    last_request_time: str | None = Field(
        default=None, description="The latest start or end of an inference request a router "
        "reported.")
    held_requests: int = Field(default=0, description="Requests the routers hold now.")
    inflight_requests: int = Field(
        default=0, description="Inference requests the routers relay now: while any is, the "
        "deployment is not idle.")
    woken_replicas: int | None = Field(
        default=None, description="After a wake, the replicas that started first; the rest "
        "start when demand fills them (unset: all of spec.replicas run).")
    wake_start_time: str | None = Field(
        default=None, description="When the demand that started the last wake arrived.")
    last_wake_millis: int | None = Field(
        default=None, description="From that demand to the first ready replica, last wake.")
    last_held_wait_millis: int | None = Field(
        default=None, description="How long the last request a router held waited.")


class AutoscalingStatus(CamelModel):
    """spec.autoscaling: the replicas the adaptive pass sizes the fleet to, and why
    (adaptive/scaling.py)."""

    desired_replicas: int = Field(
        default=0, description="The serving replicas the fleet is sized to (while awake).")
    running_replicas: int = Field(default=0, description="Serving pods that run now.")
    needed_replicas: int = Field(
        default=0, description="The fewest replicas that serve the demand plus headroom.")
    reason: str = ""
    message: str = ""
    demand: str | None = Field(
        default=None, description="Requests/s measured (streamed chats + the rest).")
    expected_goodput: str | None = Field(
        default=None, description="Requests/s the desired fleet serves within the SLOs at the "
        "demand plus headroom, its best split assumed.")
    batching_replicas: int | None = Field(
        default=None, description="The split that goodput assumes: replicas batching.")
    lower_since: str | None = Field(
        default=None, description="Since when fewer replicas have been wanted.")
    higher_since: str | None = Field(
        default=None, description="Since when more replicas have been wanted.")
    last_scale_time: str | None = None
    last_scale_down_time: str | None = None
    ignored_replicas: int | None = Field(
        default=None, description="spec.replicas as last seen while autoscaling is on (not "
        "read; a change of it is reported as an Event).")


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
    router: RouterStatus | None = Field(
        default=None, description="The router in front of the replicas (spec.router)."
    )
    gateway: GatewayStatus | None = Field(
        default=None, description="The InferencePool for gateways (spec.gateway)."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    warnings: list[str] = Field(
        default_factory=list, max_length=16,
        description="Settings of the spec the operator does not apply, and what to set instead.",
    )  # fmt: skip
    standby: StandbyStatus | None = Field(
        default=None, description="Scale to zero and warm standby (spec.scaleToZero).")
    autoscaling: AutoscalingStatus | None = Field(
        default=None, description="The fleet's size and why (spec.autoscaling).")
    last_decision: Decision | None = None
    decision_history: list[Decision] = Field(default_factory=list, max_length=10)
    adaptive_state: AdaptiveState | None = None
