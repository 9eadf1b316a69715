"""Pure: one view of a pod. Every predicate the operator asks of a pod lives here.

Pods reach the operator as plain dicts from one kopf index (trimmed to metadata and the status
fields below); status, plan and the adaptive pass all ask these functions, so "ready",
"live" or "in which mode" mean the same thing everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoglm_api.profiles import MODE_LABEL, Mode
from autoglm_operator.resource import names

Pod = Mapping[str, Any]


def condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    """A status condition of a pod (or a Deployment) by type."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def name(pod: Pod) -> str:
    return str((pod.get("metadata") or {}).get("name"))


def is_terminating(pod: Pod) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def is_live(pod: Pod) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return not is_terminating(pod) and phase not in ("Succeeded", "Failed")


def is_ready(pod: Pod) -> bool:
    cond = condition(pod, "Ready")
    return bool(cond and cond.get("status") == "True")


def pod_mode(pod: Pod) -> Mode | None:
    """The mode the pod's label routes it to; None when unlabelled or not a mode."""
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(MODE_LABEL)
    try:
        return Mode(str(value))
    except ValueError:
        return None


def pod_template_hash(pod: Pod) -> str | None:
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(
        names.TEMPLATE_HASH_ANNOTATION
    )
    return str(value) if value is not None else None


def unschedulable_message(pod: Pod) -> str | None:
    cond = condition(pod, "PodScheduled")
    if cond and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
        return str(cond.get("message") or "unschedulable")
    return None


def lacks_gpu(pod: Pod, gpu_resource: str) -> bool:
    message = unschedulable_message(pod)
    return message is not None and f"Insufficient {gpu_resource}" in message


@dataclass(frozen=True)
class PodView:
    """A pod as the adaptive pass needs it; ip None: not reachable yet."""

    name: str
    ip: str | None
    mode: Mode | None
    ready: bool
    template: str | None = None  # its pod template's digest: which admin token it holds
    created: str = ""  # creationTimestamp (RFC 3339, UTC: sorts as it reads)


def view(pod: Pod) -> PodView:
    return PodView(
        name=name(pod),
        ip=(pod.get("status") or {}).get("podIP") or None,
        mode=pod_mode(pod),
        ready=is_ready(pod),
        template=pod_template_hash(pod),
        created=str(pod["metadata"].get("creationTimestamp") or ""),
    )
