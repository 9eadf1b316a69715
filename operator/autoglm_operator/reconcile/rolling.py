"""switchStrategy Rolling: a flip replaces a pod, make-before-break.

Each mode has its own Deployment (`<name>` and `<name>-batching`). How many replicas run
batching follows one rule (rolling_batching_target); each reconcile pass steps the two
Deployments' replica counts toward that split (rolling_step), marking the old pod a shrinking
ReplicaSet removes first, and drops `<name>-batching` once the strategy is InPlace again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoglm_api.profiles import Mode
from autoglm_operator.reconcile.children import serving
from autoglm_operator.reconcile.observe import Key, Observed
from autoglm_operator.resource import pods as pods_
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec, ModePolicy

# The Kubernetes pod-deletion-cost annotation: a ReplicaSet scaling down removes the pod with
# the lowest cost among equally ready ones, so the operator picks which old-mode pod goes.
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
RETIRE_COST = "-1000"


def rolling_batching_target(
    spec: AutoGLMDeploymentSpec,
    stored_target: int | None,
    current: Mapping[Mode, int] | None,
) -> int:
    """How many replicas should run the batching template under switchStrategy Rolling.

    Pinned policies say it outright; Adaptive takes what the adaptive pass decided (kept in
    status.adaptiveState.batchingTarget); dryRun and an adaptive pass that decided nothing
    yet hold the split the Deployments have (all in the initial mode when there are none).
    """
    replicas = spec.replicas
    adaptive = spec.mode_policy is ModePolicy.ADAPTIVE
    if spec.adaptive.dry_run or (adaptive and stored_target is None):
        if current is None:
            wanted = replicas if serving.initial_mode(spec) is Mode.BATCHING else 0
        else:
            wanted = current.get(Mode.BATCHING, 0)
    elif spec.mode_policy is ModePolicy.BATCHING:
        wanted = replicas
    elif spec.mode_policy is ModePolicy.STREAMING:
        wanted = 0
    else:
        assert stored_target is not None
        wanted = min(stored_target, replicas - min(spec.adaptive.min_streaming_replicas, replicas))
    return max(0, min(wanted, replicas))


@dataclass(frozen=True)
class RollingStep:
    """The replicas each mode's Deployment should have now, and the old pods to retire."""

    split: dict[Mode, int]
    retire: tuple[str, ...] = ()  # pods to mark with the lowest deletion cost first

    @property
    def in_progress(self) -> bool:
        return bool(self.retire)


def _other(mode: Mode) -> Mode:
    return Mode.STREAMING if mode is Mode.BATCHING else Mode.BATCHING


def rolling_step(
    replicas: int,
    batching_target: int,
    current: Mapping[Mode, int],
    pods: list[dict[str, Any]],
    current_hashes: Mapping[Mode, str],
    gpu_resource: str = "nvidia.com/gpu",
) -> RollingStep:
    """One make-before-break step from the Deployments' replica counts toward the target split.

    A mode's Deployment grows first, by at most one pod beyond `replicas` in all (a surge); the
    other mode's Deployment shrinks only by that surplus, and only once every pod of the growing
    mode runs its current template and is ready. So ready replicas never fall below `replicas`
    during a flip. When the surge pod cannot be scheduled for lack of GPUs, one old pod goes
    first instead (one replica down, as the PodDisruptionBudget's maxUnavailable 1 allows), so a
    cluster without a spare replica's GPUs still flips, one replica at a time.
    """
    want = {Mode.BATCHING: batching_target, Mode.STREAMING: replicas - batching_target}
    split = {mode: int(current.get(mode, 0)) for mode in Mode}
    live = [p for p in pods if pods_.is_live(p)]

    def ready(mode: Mode) -> int:
        return sum(
            1
            for p in live
            if pods_.pod_mode(p) is mode
            and pods_.pod_template_hash(p) == current_hashes[mode]
            and pods_.is_ready(p)
        )

    def starved(mode: Mode) -> int:
        of_mode = (p for p in live if pods_.pod_mode(p) is mode)
        return sum(1 for p in of_mode if pods_.lacks_gpu(p, gpu_resource))

    retire: list[str] = []
    # Break: remove the surplus of a mode above its share once the other mode's pods are up.
    for mode in Mode:
        surplus = min(split[mode] - want[mode], sum(split.values()) - replicas)
        other = _other(mode)
        if surplus > 0 and ready(other) < split[other] and starved(other):
            # Every new pod is up or waits for GPUs: free one old pod's GPUs, one at a time.
            surplus = 1 if ready(other) + starved(other) >= split[other] else 0
        elif ready(other) < split[other]:
            surplus = 0
        if surplus > 0:
            split[mode] -= surplus
            if 0 < split[other] <= want[other]:  # a replacement, not a plain scale-down
                retire += [p["metadata"]["name"] for p in _retire_order(live, mode)[:surplus]]
    # Make: grow a mode below its share, at most one pod beyond `replicas` in all.
    for mode in Mode:
        room = replicas + 1 - sum(split.values())
        if split[mode] < want[mode] and room > 0 and not starved(mode):
            split[mode] += min(want[mode] - split[mode], room)
    return RollingStep(split=split, retire=tuple(retire))


def _retire_order(live: list[dict[str, Any]], mode: Mode) -> list[dict[str, Any]]:
    """The pods of a mode in the order a ReplicaSet would remove them, marked ones first."""

    def key(pod: dict[str, Any]) -> tuple[bool, bool, str, str]:
        meta = pod.get("metadata") or {}
        marked = (meta.get("annotations") or {}).get(DELETION_COST_ANNOTATION) == RETIRE_COST
        return (
            not marked,
            pods_.is_ready(pod),
            str(meta.get("creationTimestamp") or ""),
            str(meta.get("name")),
        )

    return sorted((p for p in live if pods_.pod_mode(p) is mode), key=key)


def deployment_split(children: Mapping[Key, dict[str, Any]], name: str) -> dict[Mode, int] | None:
    """The replicas each mode's Deployment has now under Rolling; None when neither exists."""
    found: dict[Mode, int] = {}
    for mode in Mode:
        live = children.get(("Deployment", serving.deployment_name(name, mode)))
        if live is not None:
            found[mode] = int((live.get("spec") or {}).get("replicas") or 0)
    return found or None


def rolling_step_for(
    owner: serving.Owner,
    spec: AutoGLMDeploymentSpec,
    observed: Observed,
    decided: int | None,
) -> RollingStep:
    """switchStrategy Rolling: the replicas each mode's Deployment should have now."""
    current = deployment_split(observed.children, owner.name)
    if decided is None:  # a restarted operator: what the last one decided, from status
        stored = ((observed.body.get("status") or {}).get("adaptiveState") or {}).get(
            "batchingTarget"
        )
        decided = int(stored) if stored is not None else None
    target = rolling_batching_target(spec, decided, current)
    hashes = {
        mode: serving.template_hash(serving.pod_template(owner.name, spec, mode)) or ""
        for mode in Mode
    }
    return rolling_step(
        spec.replicas, target, current or {}, observed.pods, hashes, spec.gpu_resource_name
    )


@dataclass(frozen=True)
class Retire:
    """An old-mode pod a shrinking Deployment must remove first (its mode for the Event)."""

    pod: str
    mode: Mode | None


def retire_marks(step: RollingStep, pods: list[dict[str, Any]]) -> tuple[Retire, ...]:
    """The pods to retire that do not carry the lowest deletion cost yet."""
    by_name = {p["metadata"]["name"]: p for p in pods}
    marks = []
    for name in step.retire:
        pod = by_name[name]
        annotations = pod["metadata"].get("annotations") or {}
        if annotations.get(DELETION_COST_ANNOTATION) != RETIRE_COST:
            marks.append(Retire(name, pods_.pod_mode(pod)))
    return tuple(marks)


def batching_deployment_to_delete(
    owner: serving.Owner,
    spec: AutoGLMDeploymentSpec,
    observed: Observed,
    desired_hashes: frozenset[str],
) -> tuple[Key, ...]:
    """Back from Rolling to InPlace: drop `<name>-batching` once `<name>` serves every
    replica with the current template (make-before-break for the strategy change too)."""
    key = ("Deployment", serving.deployment_name(owner.name, Mode.BATCHING))
    stale = observed.children.get(key)
    if stale is None or pods_.is_terminating(stale):
        return ()
    current_ready = sum(
        1
        for p in observed.pods
        if pods_.is_live(p) and pods_.is_ready(p) and pods_.pod_template_hash(p) in desired_hashes
    )
    return (key,) if current_ready >= spec.replicas else ()
