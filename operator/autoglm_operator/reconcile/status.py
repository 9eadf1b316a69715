"""Pure: the status an AutoGLMDeployment should show, from what the cluster holds.

Inputs are the observed Deployment and pods (plain dicts), the spec, and the status as it is
now. The result is the part of the status this reconciler owns; it is equal to what is already
there when nothing changed (lastTransitionTime moves only when a condition's status flips), so
the caller writes only when `changed` says so. Conditions owned by others (the adaptive pass's
MetricsAvailable and ModeTransitioning) are neither read nor written here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoglm_api.engine_args import without_newly_managed
from autoglm_api.profiles import Mode
from autoglm_operator.reconcile.children import gateway, serving
from autoglm_operator.resource.conditions import transition_time
from autoglm_operator.resource.pods import (
    condition,
    is_live,
    is_ready,
    lacks_gpu,
    pod_mode,
    pod_template_hash,
    unschedulable_message,
)
from autoglm_operator.resource.spec import MANAGED_FLAG_FIELDS, AutoGLMDeploymentSpec

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
OWNED_CONDITIONS = (READY, PROGRESSING, DEGRADED)
OWNED_FIELDS = (
    "observedGeneration",
    "replicas",
    "readyReplicas",
    "ready",
    "streamingReplicas",
    "batchingReplicas",
    "selector",
    "endpoint",
    "router",
    "gateway",
)

# Container states that will not fix themselves, by the reason the kubelet reports.
_STUCK_CONTAINER_REASONS = {
    "CrashLoopBackOff": "CrashLoopBackOff",
    "ImagePullBackOff": "ImagePullFailed",
    "ErrImagePull": "ImagePullFailed",
    "InvalidImageName": "ImagePullFailed",
    "CreateContainerConfigError": "ContainerConfigError",
    "CreateContainerError": "ContainerConfigError",
}


@dataclass(frozen=True)
class Problem:
    """A failure the reconciler itself hit (a missing Secret, an API error)."""

    reason: str
    message: str


@dataclass(frozen=True)
class StatusUpdate:
    status: dict[str, Any]  # the owned fields and the owned conditions only
    changed: bool
    flipped: list[dict[str, Any]]  # owned conditions whose status changed, for events


# -- pods ------------------------------------------------------------------------------------


def _stuck_container(pod: dict[str, Any]) -> tuple[str, str] | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        reason = _STUCK_CONTAINER_REASONS.get(waiting.get("reason", ""))
        if reason:
            name = pod["metadata"]["name"]
            return reason, f"pod {name}: {waiting.get('reason')}: {waiting.get('message', '')}"
    return None


# -- conditions ------------------------------------------------------------------------------


def _cond(kind: str, status: bool, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
    }


def _degraded(
    spec: AutoGLMDeploymentSpec,
    deployment: dict[str, Any] | None,
    live: list[dict[str, Any]],
    routers: list[dict[str, Any]],
    problem: Problem | None,
    gateway_problem: Problem | None = None,
) -> dict[str, Any]:
    if problem is not None:
        return _cond(DEGRADED, True, problem.reason, problem.message)
    pending = [p for p in live if unschedulable_message(p)]
    short_of_gpu = [p for p in pending if lacks_gpu(p, spec.gpu_resource_name)]
    if short_of_gpu:
        names = ", ".join(sorted(p["metadata"]["name"] for p in short_of_gpu))
        message = unschedulable_message(short_of_gpu[0])
        return _cond(
            DEGRADED,
            True,
            "InsufficientGPU",
            f"{len(short_of_gpu)} pod(s) cannot be scheduled for lack of "
            f"{spec.gpu_resource_name} ({names}): {message}",
        )
    if pending:
        names = ", ".join(sorted(p["metadata"]["name"] for p in pending))
        return _cond(
            DEGRADED,
            True,
            "Unschedulable",
            f"{len(pending)} pod(s) cannot be scheduled ({names}): "
            f"{unschedulable_message(pending[0])}",
        )
    for pod in live:
        stuck = _stuck_container(pod)
        if stuck:
            return _cond(DEGRADED, True, stuck[0], stuck[1])
    for pod in routers:
        stuck = _stuck_container(pod)
        if stuck:  # Service <name> goes through these: say why one is down, as for serving pods
            return _cond(DEGRADED, True, f"Router{stuck[0]}", f"router {stuck[1]}")
    progress = condition(deployment or {}, "Progressing")
    if progress and progress.get("reason") == "ProgressDeadlineExceeded":
        return _cond(DEGRADED, True, "ProgressDeadlineExceeded", str(progress.get("message", "")))
    if gateway_problem is not None:
        # The serving pods are fine and Ready says so; only the gateway's way in is missing.
        return _cond(DEGRADED, True, gateway_problem.reason, gateway_problem.message)
    return _cond(DEGRADED, False, "AsExpected", "No problems observed.")


def _progressing(
    generation: int,
    desired: int,
    desired_hashes: frozenset[str],
    deployment: dict[str, Any] | None,
    live: list[dict[str, Any]],
    ready: int,
) -> dict[str, Any]:
    if deployment is None:
        return _cond(PROGRESSING, True, "Creating", "Creating the Deployment.")
    updated = [p for p in live if pod_template_hash(p) in desired_hashes]
    outdated = len(live) - len(updated)
    dep_status = deployment.get("status") or {}
    dep_generation = (deployment.get("metadata") or {}).get("generation")
    if dep_generation is not None and dep_status.get("observedGeneration", 0) < dep_generation:
        return _cond(PROGRESSING, True, "RollingOut", "The Deployment controller is catching up.")
    if outdated:
        return _cond(
            PROGRESSING,
            True,
            "RollingOut",
            f"{len(updated)} of {desired} replicas run the current engine settings; "
            f"{outdated} old replica(s) remain.",
        )
    if len(live) < desired:
        return _cond(PROGRESSING, True, "ScalingUp", f"{len(live)} of {desired} replicas exist.")
    if len(live) > desired:
        return _cond(
            PROGRESSING, True, "ScalingDown", f"{len(live)} replicas exist, {desired} wanted."
        )
    if ready < desired:
        return _cond(
            PROGRESSING, True, "ReplicasStarting", f"{ready} of {desired} replicas are ready."
        )
    return _cond(
        PROGRESSING, False, "RolloutComplete", f"All {desired} replicas are current and ready."
    )


def router_status(spec: AutoGLMDeploymentSpec, router: dict[str, Any] | None) -> dict[str, Any]:
    """status.router: whether the router is on, and its replicas from its Deployment's status."""
    if not spec.router.enabled:
        return {"enabled": False, "replicas": 0, "readyReplicas": 0}
    counts = (router or {}).get("status") or {}
    return {
        "enabled": True,
        "replicas": int(counts.get("replicas") or 0),
        "readyReplicas": int(counts.get("readyReplicas") or 0),
    }


def gateway_status(
    name: str, spec: AutoGLMDeploymentSpec, held: Sequence[tuple[str, str]]
) -> dict[str, Any]:
    """status.gateway: whether it is on, and the pool and picker this deployment holds now."""
    on = spec.gateway.enabled
    pool = (gateway.KIND, gateway.pool_name(name))
    picker = ("Service", gateway.picker_service_name(name))
    return {
        "enabled": on,
        "inferencePool": pool[1] if on and pool in held else "",
        "endpointPicker": gateway.picker_address(name) if on and picker in held else "",
    }


def _ready(
    desired: int,
    ready: int,
    degraded: dict[str, Any],
    problem: Problem | None,
    router: Mapping[str, Any],
    idle: str | None = None,
) -> dict[str, Any]:
    if problem is not None:
        return _cond(READY, False, problem.reason, problem.message)
    if desired == 0:
        return _cond(READY, True, "ScaledToZero", idle or "No replicas requested.")
    if router["enabled"] and router["readyReplicas"] == 0:
        # Service <name> selects the router: without a ready one the endpoint answers nothing.
        return _cond(
            READY, False, "RouterNotReady",
            f"No router replica is ready ({ready}/{desired} replicas are ready); "
            "the endpoint serves through the router.",
        )  # fmt: skip
    if ready >= desired:
        return _cond(READY, True, "AllReplicasReady", f"{ready}/{desired} replicas are ready.")
    reason = degraded["reason"] if degraded["status"] == "True" else "ReplicasNotReady"
    return _cond(READY, False, reason, f"{ready}/{desired} replicas are ready.")


# -- the whole -------------------------------------------------------------------------------


def spec_warnings(spec: AutoGLMDeploymentSpec) -> list[str]:
    """What the spec asks that the pods do not get. An object admitted before the operator
    managed a flag keeps it in engine.extraArgs (the apiserver ratchets unchanged fields); its
    pods are built without it, so they start, and this says so."""
    _, ignored = without_newly_managed(spec.engine.extra_args)
    return [
        f"engine.extraArgs {flag} is ignored: the operator manages it "
        f"({MANAGED_FLAG_FIELDS[flag]}); remove it from engine.extraArgs"
        for flag in dict.fromkeys(ignored)
    ]


def compute(
    *,
    name: str,
    namespace: str,
    generation: int,
    spec: AutoGLMDeploymentSpec,
    deployment: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    current: dict[str, Any] | None,
    now: str,
    problem: Problem | None = None,
    router: dict[str, Any] | None = None,
    router_pods: Sequence[dict[str, Any]] = (),
    gateway_children: Sequence[tuple[str, str]] = (),
    gateway_problem: Problem | None = None,
    idle: str | None = None,
) -> StatusUpdate:
    """The owned part of the status; `changed` is False when `current` already says it all.
    `spec` holds the replicas that run now; `idle` says why, when scaleToZero lowered them."""
    current = current or {}
    live = [p for p in pods if is_live(p)]
    ready = sum(1 for p in live if is_ready(p))
    desired = spec.replicas
    desired_hashes = serving.desired_template_hashes(name, spec)

    routers = [p for p in router_pods if is_live(p)] if spec.router.enabled else []
    degraded = _degraded(spec, deployment, live, routers, problem, gateway_problem)
    routing = router_status(spec, router)
    conditions = [
        _ready(desired, ready, degraded, problem, routing, idle),
        _progressing(generation, desired, desired_hashes, deployment, live, ready),
        degraded,
    ]
    previous = {c.get("type"): c for c in current.get("conditions") or []}
    flipped = []
    for cond in conditions:
        cond["observedGeneration"] = generation
        before = previous.get(cond["type"])
        cond["lastTransitionTime"] = transition_time(before, cond["status"], now)
        if before is None or before.get("status") != cond["status"]:
            flipped.append(cond)

    status: dict[str, Any] = {
        "observedGeneration": generation,
        "replicas": len(live),
        "readyReplicas": ready,
        "ready": f"{ready}/{desired}",
        "streamingReplicas": sum(1 for p in live if pod_mode(p) is Mode.STREAMING),
        "batchingReplicas": sum(1 for p in live if pod_mode(p) is Mode.BATCHING),
        "selector": serving.selector_string(name),
        "endpoint": serving.endpoint_url(name, namespace, spec),
        "router": routing,
        "gateway": gateway_status(name, spec, gateway_children),
        "warnings": spec_warnings(spec),
    }
    changed = any(current.get(k) != v for k, v in status.items()) or any(
        previous.get(c["type"]) != c for c in conditions
    )
    status["conditions"] = conditions
    return StatusUpdate(status=status, changed=changed, flipped=flipped)


# -- the whole status, as the one field manager applies it -------------------------------------


def overlay(base: Mapping[str, Any], part: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with the fields of `part` put in; conditions replaced by type, in place."""
    merged = {**base, **{k: v for k, v in part.items() if k != "conditions"}}
    if "conditions" in part:
        new = {c.get("type"): c for c in part["conditions"]}
        kept = [new.pop(c.get("type"), c) for c in base.get("conditions") or []]
        merged["conditions"] = [*kept, *new.values()]
    return merged
