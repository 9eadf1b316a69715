"""Status from observed state: counts, conditions, and idempotence."""

from __future__ import annotations

from typing import Any

from autoglm_operator.reconcile import status
from autoglm_operator.reconcile.children import serving as builders
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec

SPEC = AutoGLMDeploymentSpec.model_validate({"replicas": 2})
HASH = builders.template_hash(builders.pod_template("phone-9b", SPEC))
T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"
GPU_MESSAGE = (
    "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are "
    "available: 2 No preemption victims found for incoming pod."
)


def pod(
    name: str,
    *,
    ready: bool = True,
    mode: str | None = "streaming",
    template: str | None = HASH,
    pending_reason: str | None = None,
    terminating: bool = False,
    waiting: str | None = None,
) -> dict[str, Any]:
    labels = {"app.kubernetes.io/instance": "phone-9b"}
    if mode:
        labels["autoglm.io/mode"] = mode
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if pending_reason:
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": pending_reason,
            }
        )
    meta: dict[str, Any] = {
        "name": name,
        "labels": labels,
        "annotations": {builders.TEMPLATE_HASH_ANNOTATION: template} if template else {},
    }
    if terminating:
        meta["deletionTimestamp"] = T0
    statuses = (
        [{"state": {"waiting": {"reason": waiting, "message": "back-off"}}}] if waiting else []
    )
    return {
        "metadata": meta,
        "status": {
            "phase": "Pending" if pending_reason else "Running",
            "conditions": conditions,
            "containerStatuses": statuses,
        },
    }


def deployment(generation: int = 1, observed: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "phone-9b", "generation": generation},
        "spec": {"template": builders.pod_template("phone-9b", SPEC)},
        "status": {"observedGeneration": observed},
    }


# `<name>-router` with its two replicas up (the default router).
ROUTER_UP = {"metadata": {"name": "phone-9b-router"}, "status": {"replicas": 2, "readyReplicas": 2}}


def compute(
    pods: list[dict[str, Any]], current: dict[str, Any] | None = None, **kw: Any
) -> status.StatusUpdate:
    args: dict[str, Any] = {
        "name": "phone-9b",
        "namespace": "serving",
        "generation": 3,
        "spec": SPEC,
        "deployment": deployment(),
        "pods": pods,
        "current": current,
        "now": T0,
        "router": ROUTER_UP,
    }
    args.update(kw)
    return status.compute(**args)


def conditions(update: status.StatusUpdate) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in update.status["conditions"]}


def test_two_ready_replicas_are_ready_and_settled() -> None:
    update = compute([pod("a"), pod("b", mode="batching")])
    s = update.status
    assert s["observedGeneration"] == 3
    assert (s["replicas"], s["readyReplicas"], s["ready"]) == (2, 2, "2/2")
    assert (s["streamingReplicas"], s["batchingReplicas"]) == (1, 1)
    assert s["selector"] == "app.kubernetes.io/instance=phone-9b,app.kubernetes.io/name=autoglm"
    assert s["endpoint"] == "http://phone-9b.serving.svc:8000/v1"
    conds = conditions(update)
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("True", "AllReplicasReady")
    assert (conds["Progressing"]["status"], conds["Progressing"]["reason"]) == (
        "False",
        "RolloutComplete",
    )
    assert (conds["Degraded"]["status"], conds["Degraded"]["reason"]) == ("False", "AsExpected")
    assert all(c["observedGeneration"] == 3 for c in conds.values())
    assert update.changed


def test_unchanged_state_gives_unchanged_status_even_later() -> None:
    first = compute([pod("a"), pod("b")])
    again = compute([pod("a"), pod("b")], current=first.status, now=T1)
    assert not again.changed
    assert again.status == first.status
    assert again.flipped == []


def test_transition_time_moves_only_when_a_condition_flips() -> None:
    first = compute([pod("a"), pod("b", ready=False)])
    assert conditions(first)["Ready"]["status"] == "False"
    # Still not ready, for another reason: the time stays.
    second = compute(
        [pod("a"), pod("b", ready=False, waiting="CrashLoopBackOff")], current=first.status, now=T1
    )
    ready = conditions(second)["Ready"]
    assert ready["reason"] == "CrashLoopBackOff" and ready["lastTransitionTime"] == T0
    assert second.changed
    # Now ready: the time moves.
    third = compute([pod("a"), pod("b")], current=second.status, now=T1)
    assert conditions(third)["Ready"]["lastTransitionTime"] == T1
    assert [c["type"] for c in third.flipped] == ["Ready", "Progressing", "Degraded"]


def test_pods_pending_for_gpus_show_insufficient_gpu_with_the_schedulers_words() -> None:
    update = compute([pod("a"), pod("b", ready=False, pending_reason=GPU_MESSAGE)])
    conds = conditions(update)
    assert conds["Degraded"]["status"] == "True"
    assert conds["Degraded"]["reason"] == "InsufficientGPU"
    assert GPU_MESSAGE in conds["Degraded"]["message"]
    assert conds["Ready"]["status"] == "False"
    assert conds["Ready"]["reason"] == "InsufficientGPU"
    assert update.status["ready"] == "1/2"


def test_other_unschedulable_reasons_are_not_blamed_on_gpus() -> None:
    update = compute(
        [
            pod(
                "a",
                ready=False,
                pending_reason="0/2 nodes are available: 2 node(s) didn't match the selector.",
            )
        ]
    )
    assert conditions(update)["Degraded"]["reason"] == "Unschedulable"


def test_old_template_pods_mean_a_rollout() -> None:
    update = compute([pod("a"), pod("b"), pod("c", template="old")])
    progressing = conditions(update)["Progressing"]
    assert (progressing["status"], progressing["reason"]) == ("True", "RollingOut")
    assert "2 of 2" in progressing["message"]


def test_scaling_and_starting() -> None:
    assert conditions(compute([pod("a")]))["Progressing"]["reason"] == "ScalingUp"
    assert (
        conditions(compute([pod("a"), pod("b"), pod("c")]))["Progressing"]["reason"]
        == "ScalingDown"
    )
    starting = compute([pod("a"), pod("b", ready=False)])
    assert conditions(starting)["Progressing"]["reason"] == "ReplicasStarting"
    stale = compute([pod("a"), pod("b")], deployment=deployment(generation=2, observed=1))
    assert conditions(stale)["Progressing"]["reason"] == "RollingOut"
    missing = compute([], deployment=None)
    assert conditions(missing)["Progressing"]["reason"] == "Creating"


def test_terminating_pods_do_not_count() -> None:
    update = compute([pod("a"), pod("b"), pod("c", terminating=True)])
    assert update.status["replicas"] == 2
    assert conditions(update)["Progressing"]["status"] == "False"


def test_unlabelled_pods_count_in_no_mode() -> None:
    update = compute([pod("a", mode=None), pod("b", mode="nonsense")])
    assert (update.status["streamingReplicas"], update.status["batchingReplicas"]) == (0, 0)


def test_a_reconciler_problem_is_degraded_and_not_ready() -> None:
    problem = status.Problem("SecretNotFound", "apiKeySecretRef: Secret 'x' does not exist")
    conds = conditions(compute([pod("a"), pod("b")], problem=problem))
    assert (conds["Degraded"]["status"], conds["Degraded"]["reason"]) == ("True", "SecretNotFound")
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("False", "SecretNotFound")


def test_conditions_of_other_writers_are_left_alone() -> None:
    theirs = {
        "type": "MetricsAvailable",
        "status": "True",
        "reason": "Fresh",
        "lastTransitionTime": T0,
    }
    first = compute([pod("a"), pod("b")])
    current = {**first.status, "conditions": [theirs, *first.status["conditions"]]}
    again = compute([pod("a"), pod("b")], current=current, now=T1)
    assert not again.changed
    assert "MetricsAvailable" not in conditions(again)


def test_scaled_to_zero_is_ready() -> None:
    spec = AutoGLMDeploymentSpec.model_validate(
        {"replicas": 0, "adaptive": {"minStreamingReplicas": 0}}
    )
    update = compute([], spec=spec)
    assert conditions(update)["Ready"]["reason"] == "ScaledToZero"
    assert update.status["ready"] == "0/0"


def test_deadline_exceeded_is_degraded() -> None:
    dep = deployment()
    dep["status"]["conditions"] = [
        {
            "type": "Progressing",
            "status": "False",
            "reason": "ProgressDeadlineExceeded",
            "message": "too slow",
        }
    ]
    assert (
        conditions(compute([pod("a"), pod("b")], deployment=dep))["Degraded"]["reason"]
        == "ProgressDeadlineExceeded"
    )


def test_the_router_reports_its_replicas_and_none_ready_means_not_ready() -> None:
    up = compute([pod("a"), pod("b")])
    assert up.status["router"] == {"enabled": True, "replicas": 2, "readyReplicas": 2}
    assert conditions(up)["Ready"]["status"] == "True"
    # Service <name> selects the router: with no router ready, the endpoint answers nothing.
    for router in (None, {"status": {"replicas": 2, "readyReplicas": 0}}):
        down = compute([pod("a"), pod("b")], router=router)
        assert down.status["router"]["readyReplicas"] == 0
        ready = conditions(down)["Ready"]
        assert (ready["status"], ready["reason"]) == ("False", "RouterNotReady")
        assert "No router replica is ready (2/2 replicas are ready)" in ready["message"]


def test_with_the_router_off_status_says_so_and_ready_needs_only_the_replicas() -> None:
    off = AutoGLMDeploymentSpec.model_validate({"replicas": 2, "router": {"enabled": False}})
    update = compute([pod("a"), pod("b")], spec=off, router=None)
    assert update.status["router"] == {"enabled": False, "replicas": 0, "readyReplicas": 0}
    ready = conditions(update)["Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "AllReplicasReady")


def test_a_router_pod_stuck_waiting_is_degraded_naming_the_pod_and_its_reason() -> None:
    router_down = {"status": {"replicas": 2, "readyReplicas": 0}}
    routers = [
        pod("phone-9b-router-x", ready=False, mode=None, waiting="ImagePullBackOff"),
        pod("phone-9b-router-y", ready=False, mode=None, waiting="CrashLoopBackOff"),
    ]
    update = compute([pod("a"), pod("b")], router=router_down, router_pods=routers)
    degraded, ready = conditions(update)["Degraded"], conditions(update)["Ready"]
    assert (degraded["status"], degraded["reason"]) == ("True", "RouterImagePullFailed")
    assert degraded["message"] == "router pod phone-9b-router-x: ImagePullBackOff: back-off"
    assert (ready["status"], ready["reason"]) == ("False", "RouterNotReady")
    crashing = compute([pod("a"), pod("b")], router=router_down, router_pods=routers[1:])
    assert conditions(crashing)["Degraded"]["reason"] == "RouterCrashLoopBackOff"
    assert (
        "router pod phone-9b-router-y: CrashLoopBackOff"
        in conditions(crashing)["Degraded"]["message"]
    )


def test_a_serving_pod_stuck_is_named_before_a_router_pod_and_gone_router_pods_are_not() -> None:
    stuck_router = pod("phone-9b-router-x", ready=False, mode=None, waiting="CrashLoopBackOff")
    both = compute([pod("a"), pod("b", ready=False, waiting="ImagePullBackOff")],
                   router_pods=[stuck_router])  # fmt: skip
    assert conditions(both)["Degraded"]["reason"] == "ImagePullFailed"
    leaving = pod("phone-9b-router-x", mode=None, waiting="CrashLoopBackOff", terminating=True)
    fine = compute([pod("a"), pod("b")], router_pods=[leaving, pod("phone-9b-router-y", mode=None)])
    assert conditions(fine)["Degraded"]["status"] == "False"
    off = AutoGLMDeploymentSpec.model_validate({"replicas": 2, "router": {"enabled": False}})
    turned_off = compute([pod("a"), pod("b")], spec=off, router=None, router_pods=[stuck_router])
    assert conditions(turned_off)["Degraded"]["status"] == "False"


def test_a_media_flag_left_in_extra_args_from_before_is_named_in_the_warnings() -> None:
    """Objects admitted before the operator managed --limit-mm-per-prompt keep it (the apiserver
    ratchets unchanged fields); the pods start without it and the status says what to set."""
    legacy = AutoGLMDeploymentSpec.model_validate({"engine": {"extraArgs": [
        "--limit-mm-per-prompt", '{"image":4}', "--seed", "7"]}})  # fmt: skip
    warnings = compute([pod("a")], spec=legacy).status["warnings"]
    assert warnings == [
        "engine.extraArgs --limit-mm-per-prompt is ignored: the operator manages it (use "
        "multimodal.imagesPerPrompt); remove it from engine.extraArgs"
    ]
    assert compute([pod("a")]).status["warnings"] == []
