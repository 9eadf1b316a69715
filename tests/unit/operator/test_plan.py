"""The pure plan: which children to write, and nothing when they already match."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from autoglm_operator.reconcile.children import serving as builders
from autoglm_operator.reconcile.diff import contains, describe_update, differing_paths, quantity
from autoglm_operator.reconcile.memory import Written, has_pending
from autoglm_operator.reconcile.pass_plan import (
    Action,
    is_rollout,
    key_of,
    plan_children,
    pods_to_label,
    surge_allowed,
)
from autoglm_operator.resource import spec

OWNER = builders.Owner(name="phone-9b", namespace="serving", uid="u1")
SPEC = spec.AutoGLMDeploymentSpec.model_validate({"replicas": 2})
GPU_MESSAGE = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."


def served(manifest: dict[str, Any], rv: str = "10") -> dict[str, Any]:
    """What the apiserver hands back: the manifest plus defaults, metadata and status."""
    obj = copy.deepcopy(manifest)
    obj["metadata"].update({"resourceVersion": rv, "uid": "x", "creationTimestamp": "t"})
    if obj["kind"] == "Deployment":
        pod = obj["spec"]["template"]["spec"]
        pod.update(
            {
                "dnsPolicy": "ClusterFirst",
                "restartPolicy": "Always",
                "schedulerName": "default-scheduler",
            }
        )
        c = pod["containers"][0]
        c.update({"terminationMessagePath": "/dev/termination-log"})
        c["readinessProbe"]["successThreshold"] = 1
        for env in c["env"]:
            if "valueFrom" in env and "fieldRef" in env["valueFrom"]:
                env["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
        obj["status"] = {"replicas": 2}
    if obj["kind"] == "Service":
        obj["spec"].update({"clusterIP": "10.96.0.10", "sessionAffinity": "None"})
    return obj


def test_quantities() -> None:
    assert quantity("1Gi") == Decimal(2**30)
    assert quantity("500m") == Decimal("0.5")
    assert quantity(2) == Decimal(2)
    assert quantity("1e3") == Decimal(1000)
    assert quantity("abc") is None
    assert quantity(True) is None


def test_contains_ignores_server_defaults_but_not_changed_values() -> None:
    desired = builders.deployment(OWNER, SPEC)
    actual = served(desired)
    assert contains(actual, desired)
    actual["spec"]["template"]["spec"]["containers"][0]["image"] = "hand-edited"
    assert not contains(actual, desired)
    assert differing_paths(actual, desired) == ["spec.template.spec.containers"]


def test_contains_normalizes_quantities_only_under_resources() -> None:
    assert contains(
        {"resources": {"limits": {"cpu": "1"}}}, {"resources": {"limits": {"cpu": "1000m"}}}
    )
    assert not contains({"image": "1"}, {"image": "1000m"})


def test_contains_treats_omitted_zero_values_as_equal() -> None:
    assert contains({"name": "m"}, {"name": "m", "readOnly": False})
    assert not contains({"name": "m"}, {"name": "m", "readOnly": True})


def test_contains_compares_lists_item_by_item() -> None:
    assert not contains({"args": ["a", "b", "c"]}, {"args": ["a", "b"]})
    assert not contains({"args": ["b", "a"]}, {"args": ["a", "b"]})


def test_nothing_to_do_when_every_child_matches() -> None:
    desired = builders.children(OWNER, SPEC)
    actual = {key_of(m): served(m) for m in desired}
    assert plan_children(desired, actual, {}, now=0.0) == []


def test_missing_and_drifted_children_are_written() -> None:
    desired = builders.children(OWNER, SPEC)
    actual = {key_of(m): served(m) for m in desired}
    del actual[("Service", "phone-9b-streaming")]
    actual[("Deployment", "phone-9b")]["spec"]["replicas"] = 5
    actions = plan_children(desired, actual, {}, now=0.0)
    assert [(a.verb, a.key) for a in actions] == [
        ("update", ("Deployment", "phone-9b")),
        ("create", ("Service", "phone-9b-streaming")),
    ]
    assert describe_update(actual[("Deployment", "phone-9b")], actions[0].manifest) == (
        "scaled from 5 to 2 replicas"
    )


def test_a_child_being_deleted_is_left_until_it_is_gone() -> None:
    desired = builders.children(OWNER, SPEC)
    actual = {key_of(m): served(m) for m in desired}
    actual[("Service", "phone-9b")]["metadata"]["deletionTimestamp"] = "t"
    actual[("Service", "phone-9b")]["spec"]["ports"] = []
    assert plan_children(desired, actual, {}, now=0.0) == []


def test_own_write_is_trusted_even_when_the_server_normalized_it() -> None:
    desired = builders.config_map(OWNER, SPEC)
    normalized = served(desired, rv="42")
    normalized["data"]["config.json"] = normalized["data"]["config.json"].strip()  # differs
    key = key_of(desired)
    mine = Written(builders.digest(desired), "42", based_on="41", at=100.0)
    assert plan_children([desired], {key: normalized}, {key: mine}, now=500.0) == []
    # Someone else changed it later: compare again.
    normalized["metadata"]["resourceVersion"] = "43"
    assert len(plan_children([desired], {key: normalized}, {key: mine}, now=500.0)) == 1


def test_a_write_not_yet_seen_through_the_watch_is_not_repeated_within_grace() -> None:
    desired = builders.config_map(OWNER, SPEC)
    key = key_of(desired)
    mine = Written(builders.digest(desired), "5", based_on="", at=100.0)
    assert plan_children([desired], {}, {key: mine}, now=101.0) == []
    assert has_pending({key: mine}, now=101.0)
    # Long after: the object is really gone (deleted by hand): create again.
    assert [a.verb for a in plan_children([desired], {}, {key: mine}, now=200.0)] == ["create"]
    assert not has_pending({key: mine}, now=200.0)


def test_rollout_is_a_template_change() -> None:
    desired = builders.deployment(OWNER, SPEC)
    live = served(desired)
    live["spec"]["replicas"] = 3
    action = Action("update", desired, "differs")
    assert not is_rollout(action, {action.key: live})
    new = builders.deployment(OWNER, SPEC.model_copy(update={"image": "other:1"}))
    assert is_rollout(Action("update", new, "differs"), {action.key: live})


def pod(name: str, template: str, pending: bool = False) -> dict[str, Any]:
    conds = [{"type": "Ready", "status": "False" if pending else "True"}]
    if pending:
        conds.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": GPU_MESSAGE,
            }
        )
    return {
        "metadata": {
            "name": name,
            "labels": {},
            "annotations": {builders.TEMPLATE_HASH_ANNOTATION: template},
        },
        "status": {"phase": "Pending" if pending else "Running", "conditions": conds},
    }


def test_surge_falls_back_when_the_new_pod_finds_no_gpu_and_stays_so_until_done() -> None:
    new = "newhash"
    assert surge_allowed(SPEC, new, None, [pod("a", new), pod("b", new)])
    rolling = [pod("a", "old"), pod("b", "old")]
    assert surge_allowed(SPEC, new, None, [*rolling, pod("c", new)])
    assert not surge_allowed(SPEC, new, None, [*rolling, pod("c", new, pending=True)])
    fell_back = builders.deployment(OWNER, SPEC, surge=False)
    fell_back["spec"]["template"]["metadata"]["annotations"][builders.TEMPLATE_HASH_ANNOTATION] = (
        new
    )
    # The pending pod got its GPUs; the rollout is still going: keep one-down-at-a-time.
    assert not surge_allowed(SPEC, new, fell_back, [pod("a", "old"), pod("c", new)])
    # Done: back to make-before-break.
    assert surge_allowed(SPEC, new, fell_back, [pod("c", new), pod("d", new)])


@pytest.mark.parametrize(
    ("labels", "expected"),
    [({}, ["p"]), ({"autoglm.io/mode": "batching"}, []), ({"autoglm.io/mode": "bogus"}, ["p"])],
)
def test_pods_to_label(labels: dict[str, str], expected: list[str]) -> None:
    p = {"metadata": {"name": "p", "labels": labels}, "status": {"phase": "Running"}}
    assert pods_to_label([p]) == expected
    gone = {"metadata": {"name": "q", "labels": {}, "deletionTimestamp": "t"}, "status": {}}
    assert pods_to_label([gone]) == []
